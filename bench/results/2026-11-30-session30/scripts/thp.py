import mmap, time, sys
n=int(sys.argv[1]) if len(sys.argv)>1 else 256
m=mmap.mmap(-1,(n+1)<<21,flags=mmap.MAP_PRIVATE|mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_HUGEPAGE)
ts=[]
for i in range(n):
    t=time.perf_counter_ns(); m[(i<<21)+4096]=1; ts.append((time.perf_counter_ns()-t)//1000)
ts.sort(); print('n',n,'us p50',ts[n//2],'p90',ts[n*9//10],'max',ts[-1],'sum ms',sum(ts)//1000)

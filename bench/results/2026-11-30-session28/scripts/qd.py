import time,sys
# sample vda in-flight count and written sectors every 2 ms for N seconds
N=float(sys.argv[1]); out=[]
t0=time.time()
while time.time()-t0<N:
    with open('/proc/diskstats') as f:
        for l in f:
            p=l.split()
            if p[2]=='vda':
                out.append((time.time()-t0,int(p[11]),int(p[9])))
    time.sleep(0.002)
with open(sys.argv[2],'w') as f:
    for o in out: f.write("%.4f %d %d\n"%o)

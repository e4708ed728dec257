import random, sys, heapq
from collections import defaultdict
def run(policy, S=8000, u=0.67, txg=4000, txgs=200, seed=1, reserve_slabs=None):
    rnd=random.Random(seed)
    K=16
    slot_live=[False]*(S*K)
    nlive=int(u*S*K)
    # fill sequentially
    loc=list(range(nlive))   # block -> slot
    for i in range(nlive): slot_live[i]=True
    cnt=[0]*S
    for i in range(nlive): cnt[i//K]+=1
    if reserve_slabs is None: reserve_slabs=S//32+1
    cur=None; curpos=0; hole=None
    stats=[]
    nseq=0
    for t in range(txgs):
        dirty=set(rnd.randrange(nlive) for _ in range(txg))
        allocs=[]
        frees=[]
        for b in dirty:
            empty=sum(1 for c in cnt if c==0)
            freeslots=sum(K-c for c in cnt if c>0)
            seq = freeslots <= (empty-reserve_slabs)*K
            slot=None
            if policy!='empty' and seq or (cur is not None and curpos<K and policy=='x'):
                if cur is None or curpos>=K or cnt[cur]!=curpos:
                    cur=next(i for i in range(S) if cnt[i]==0); curpos=0
                slot=cur*K+curpos; curpos+=1
            else:
                if hole is not None and 0<cnt[hole]<K:
                    s=hole
                else:
                    cands=[i for i in range(S) if 0<cnt[i]<K]
                    if policy=='fullest': s=max(cands,key=lambda i:(cnt[i],-i))
                    else: s=min(cands,key=lambda i:(cnt[i],i))
                    hole=s
                slot=next(s*K+j for j in range(K) if not slot_live[s*K+j])
            nseq+= 1 if (seq and policy!='empty') else 0
            slot_live[slot]=True; cnt[slot//K]+=1
            frees.append(loc[b]); loc[b]=slot; allocs.append(slot)
        for f in frees:
            slot_live[f]=False; cnt[f//K]-=1
        allocs.sort(); runs=1
        for a,b2 in zip(allocs,allocs[1:]):
            if b2!=a+1: runs+=1
        empty=sum(1 for c in cnt if c==0)
        stats.append((len(allocs)/runs, empty))
    last=stats[len(stats)//2:]
    print('seq frac %.2f'%(nseq/(txg*txgs)), policy, 'blocks/run %.2f'%(sum(s[0] for s in last)/len(last)), 'empty slabs', last[-1][1], 'of', S)
run(sys.argv[1], S=int(sys.argv[2]), txg=int(sys.argv[3]), txgs=int(sys.argv[4]))

import json, sys
prev = {}
for line in open(sys.argv[1]):
    t, v, j = line.split(' ', 2)
    try: d = json.loads(j)
    except Exception: continue
    t = float(t)
    key = (v, d['pid'])
    if key in prev:
        pt, p = prev[key]
        dt = t - pt
        def df(k): return d[k] - p[k]
        dv, pv = d['devices'][0]['io'], p['devices'][0]['io']
        w = df('writes'); lw = df('log_durable_writes')
        print(f"{t%1000:8.1f} {v:16s} txg {d['txg']:4d} wr/s {w/dt:6.0f} logw_us {df('log_write_us')/max(lw,1):6.0f} "
              f"miss/w {df('data_cache_misses')/max(w,1):5.2f} dev r {(dv['read']['ops']-pv['read']['ops'])/dt:6.0f} "
              f"dev w {(dv['write']['ops']-pv['write']['ops'])/dt:6.0f} wMB {(dv['write']['bytes']-pv['write']['bytes'])/dt/1e6:6.1f} "
              f"dwait_w {(dv['write']['disk_wait']['sum_us']-pv['write']['disk_wait']['sum_us'])/max(dv['write']['ops']-pv['write']['ops'],1):6.0f} "
              f"dwait_r {(dv['read']['disk_wait']['sum_us']-pv['read']['disk_wait']['sum_us'])/max(dv['read']['ops']-pv['read']['ops'],1):6.0f} "
              f"cpu% {df('cpu_us')/dt/1e4:5.1f}")
    prev[key] = (t, d)

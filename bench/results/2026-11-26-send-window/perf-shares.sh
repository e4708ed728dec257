#!/bin/sh
# usage: shares.sh perf.data : per thread, samples grouped by category (self time)
perf report -i "$1" --no-children --sort pid,sym --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" | python3 -c '
import sys, re, collections
tot=collections.Counter(); cat=collections.defaultdict(collections.Counter)
for line in sys.stdin:
    m=re.match(r"\s*([\d.]+)%\s+(\d+):(\S+)\s+\[(.)\]\s+(.*)", line)
    if not m: continue
    pct=float(m.group(1)); pid=m.group(2)+":"+m.group(3); k=m.group(4); sym=m.group(5)
    tot[pid]+=pct
    if "xxh3" in sym or "xxhash" in sym: c="xxh3"
    elif "memset" in sym: c="memset (zeroing)"
    elif k=="k" and re.search(r"page|fault|folio|memcg|lru|rmap|pte|mm_|vma|alloc|rmqueue|charge|zone|pcp|mas_", sym): c="kernel memory (faults, freeing)"
    elif "memmove" in sym or "memcpy" in sym: c="memcpy"
    elif k=="k": c="kernel other (io, syscalls, sched)"
    else: c="user other"
    cat[pid][c]+=pct
for pid,t in tot.most_common():
    print(f"{pid}: {t:.1f}% of samples")
    for c,v in cat[pid].most_common():
        print(f"    {c:40s} {v:5.1f}% ({100*v/t:.0f}% of the thread)")
'

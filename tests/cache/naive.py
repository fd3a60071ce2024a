"""Deliberately simple O(C)-per-eviction simulator written straight from replay_rules.md §3."""
NEVER = float("inf")


def naive_replay(chains, capacity, policy, *, slru_threshold=2, tlru=(0, 0), priorities=None):
    cached = {}        # key -> dict(parent, last, count, ins, hw, depth, prio, next)
    nchild = {}
    future = {}
    if policy == "belady":
        seen = {}
        for i in range(len(chains) - 1, -1, -1):
            future[i] = [seen.get(k, NEVER) for k in chains[i]]
            for k in chains[i]:
                seen[k] = i
    out = []
    for i, h in enumerate(chains):
        n = len(h)
        prio = priorities[i] if priorities else 0
        k = 0
        while k < n and h[k] in cached:
            k += 1
        for m in range(n):
            if m < k:
                b = cached[h[m]]
                b["last"] = i
                b["count"] += 1
                b["hw"] = max(b["hw"], n)
                b["prio"] = max(b["prio"], prio)
            else:
                cached[h[m]] = dict(parent=h[m - 1] if m else None, last=i, count=1, ins=i,
                                    hw=n, depth=m, prio=prio)
                nchild[h[m]] = 0
                if m:
                    nchild[h[m - 1]] += 1
            if policy == "belady":
                cached[h[m]]["next"] = future[i][m]
        pinned = set(h)

        def key(kk):
            b = cached[kk]
            if policy == "lru":
                return (b["last"],)
            if policy == "lfu":
                return (b["count"], b["last"])
            if policy == "fifo":
                return (b["ins"],)
            if policy == "belady":
                return (-b["next"], b["last"])
            if policy == "slru":
                return (1 if b["count"] >= slru_threshold else 0, b["last"])
            if policy == "priority":
                return (b["prio"], b["last"])
            if policy == "tlru":
                thr, npe = tlru  # in pages here
                safe = b["depth"] >= max(0, b["hw"] + npe - thr)
                return (0 if safe else 1, b["last"])
            raise ValueError(policy)

        while len(cached) > capacity:
            leaves = [kk for kk in cached if nchild[kk] == 0 and kk not in pinned]
            if not leaves:
                break
            victim = min(leaves, key=key)
            par = cached[victim]["parent"]
            del cached[victim]
            del nchild[victim]
            if par is not None:
                nchild[par] -= 1
        out.append(k)
    return out

"""The state machine of ``hit_density``, standard library only, so that SGLang can run it.

Two callers drive the same :class:`HitDensityCore`: the replay's policy
(:mod:`sglang_hydra.cache.hit_density`, whose docstring explains the method) and the engine
plugin (:mod:`sglang_hydra.cache.sglang_plugin`), which loads in a server that need not
have Hydra or the rest of sglang-hydra.  State changes only in :meth:`HitDensityCore.touch`
(one call per request with its page keys, in prefix order, and the clock) and at the
reconfiguration it triggers; :meth:`HitDensityCore.age` and
:meth:`HitDensityCore.page_age` read plain dicts.

Which share of conversations keeps a class's longer retention age is decided by a 16-bit
*identity* per page.  With ``identity="key"`` (the replay rules) it is a process-stable hash
of the page key, as the policy always did.  With ``identity="arrival"`` (the engine, and the
replay's ``cache_semantics=sglang``) it is a hash of the order in which pages first entered
the history, remembered with the page: the engine's page ids (hashes of tokens) and the
replay's keys (trace block ids) differ in value but not in order, so both sides pick the
same conversations.
"""
from __future__ import annotations

import zlib

__all__ = ["HitDensityCore", "HIT_DENSITY_DEFAULTS", "hit_density_core", "stable_hash"]

NBINS = 64      # half-octave bins of a return gap: bin = (gap * gap).bit_length()
MAX_COHORTS = 64
IDENTITIES = ("key", "arrival")

#: Parameters and defaults (the replay's ``PARAMS`` and the plugin's table use these).
HIT_DENSITY_DEFAULTS = {"classes": 3, "epoch": 200, "decay": 0.9, "horizon": 16.0}

# A history entry is one int: last read << _T | identity << 29 | cohort id << 13 |
# class << 8 | long variant << 7 | reads (saturating at 127).
_T = 45


def stable_hash(key) -> int:
    """A hash that does not change between processes (``hash(str)`` does)."""
    if type(key) is int:
        return (key * 0x9E3779B1) >> 7
    return zlib.crc32(repr(key).encode())


class _Cohort:
    """Counters of the intervals opened during one epoch: births per class and the
    return gaps (per class and bin) of those intervals, whenever they return."""

    __slots__ = ("cid", "start", "end", "weight", "births", "returns")

    def __init__(self, cid, start, classes):
        self.cid = cid
        self.start = start
        self.end = None
        self.weight = 1.0
        self.births = [0.0] * classes
        self.returns = [[0.0] * NBINS for _ in range(classes)]


class HitDensityCore:
    """Retention age per class of page, learned from observed return gaps.

    ``bind(capacity_pages)`` once, ``touch(page_keys, now, pages)`` once per request
    (``now``: an int clock, the same one the caller's ``last_access`` stamps use; ``pages``:
    the request's pages, which may exceed ``len(page_keys)`` when a key holds several),
    then ``age(key)`` / ``page_age(key, above)`` give the retention age to add to a leaf's
    last access."""

    def __init__(self, classes=3, epoch=200, decay=0.9, horizon=16.0, identity="key"):
        if identity not in IDENTITIES:
            raise ValueError(f"identity must be one of {IDENTITIES}, got {identity!r}")
        self.classes, self.epoch, self.decay, self.horizon = classes, epoch, decay, horizon
        self.by_arrival = identity == "arrival"
        k = classes + 2
        self.capacity = None
        self._cur = {}            # key -> packed history entry (see _T)
        self._old = {}
        self._rotated = 0
        self._cohorts = {}        # cohort id (16 bits) -> _Cohort, oldest first
        self._cohort = None       # the open cohort
        self._next_id = 0
        self._arrivals = 0        # pages that entered the history (identity="arrival")
        self._ttl = [0] * k       # retention age of the short variant of each class
        self._long = [0] * k      # ... of the long variant (a share `_mix` of requests)
        self._mix = [0.0] * k
        self._requests = 0
        self._ticks = 0.0         # decayed ticks observed, for the history span
        self._new_pages = 0.0     # decayed keys read for the first time (within history)
        self._units = 0.0         # decayed keys read, and the pages they hold: the
        self._pages = 0.0         # capacity is in pages, the counters are per key (unit)
        self._span = 1 << 62      # history length in ticks (until the first estimate)
        #: changes whenever an age can change without a page being read (a reconfiguration,
        #: or the history dropping its older generation): callers may cache ages until then
        self.generation = 0

    def bind(self, capacity_pages) -> None:
        self.capacity = capacity_pages

    def _open_cohort(self, now) -> None:
        cid = self._next_id & 0xFFFF
        self._next_id += 1
        self._cohort = self._cohorts[cid] = _Cohort(cid, now, self.classes + 2)

    # ------------------------------------------------------------------ state
    def touch(self, page_keys, now, pages) -> None:
        """A request read ``page_keys`` (prefix order) at time ``now``."""
        if self._cohort is None:
            self._rotated = now
            self._open_cohort(now)
        cur = self._cur
        old = self._old
        cohort = self._cohort
        births = cohort.births
        stamp = (now << _T) | (cohort.cid << 13)
        cohorts = self._cohorts
        top = self.classes - 1
        last_page = self.classes          # class of a request's last page, read for the first time
        branch = self.classes + 1         # first read, below a page read at most twice before
        mix = self._mix
        by_arrival = self.by_arrival
        arrivals = self._arrivals
        new = 0
        first = page_keys[0] if page_keys else 0
        u = 0.0 if by_arrival else ((((first * 0x9E3779B1) >> 7) if type(first) is int
                                     else stable_hash(first)) & 0xFFFF) / 65536.0
        ident = 0
        r0 = -1
        n = len(page_keys)
        prev = 0          # reads of the previous page before this request (0: none / new)
        run = -1          # class of the pages read for the first time in the current run
        for j in range(n):
            key = page_keys[j]
            packed = cur.get(key)
            if packed is None:
                packed = old.get(key)
            if by_arrival:
                if packed is None:
                    ident = ((arrivals * 0x9E3779B1) >> 7) & 0xFFFF
                    arrivals += 1
                else:
                    ident = (packed >> 29) & 0xFFFF
            if r0 < 0:
                r0 = 0 if packed is None else packed & 127
                if by_arrival:
                    u = ident / 65536.0
            elif r0 and (packed is None or (packed & 127) * 2 < r0):
                r0 = 0   # the first page that is not shared like page 0: the conversation's
                u = (ident if by_arrival else (((key * 0x9E3779B1) >> 7) if type(key) is int
                                               else stable_hash(key)) & 0xFFFF) / 65536.0
            if packed is None:
                reads = 1
                new += 1
                if run < 0:
                    run = branch if 0 < prev <= 2 else 0
                c = last_page if j == n - 1 else run
                prev = 0
            else:
                gap = now - (packed >> _T)
                if gap <= 0:
                    continue          # read twice by one request: no new interval
                reads = packed & 127
                born = cohorts.get((packed >> 13) & 0xFFFF)
                if born is not None:
                    born.returns[(packed >> 8) & 31][(gap * gap).bit_length()] += 1.0
                prev = reads
                run = -1
                if reads < 127:
                    reads += 1
                c = reads - 1 if reads <= top else top
            births[c] += 1.0
            cur[key] = stamp | (ident << 29) | (c << 8) | (128 if u < mix[c] else 0) | reads
        self._arrivals = arrivals
        self._new_pages += new
        self._units += n
        self._pages += pages
        if now - self._rotated > self._span:
            self._old = cur
            self._cur = {}
            self._rotated = now
            self.generation += 1
        self._requests += 1
        if self._requests % self.epoch == 0:
            self._reconfigure(now)

    # ------------------------------------------------------------------ ages
    def entry(self, key):
        """The history entry of ``key`` (None: not remembered)."""
        packed = self._cur.get(key)
        if packed is None:
            packed = self._old.get(key)
        return packed

    def age_of(self, packed) -> int:
        """Retention age of a history entry (None: a page never seen, class 0)."""
        if packed is None:
            return self._ttl[0]
        c = (packed >> 8) & 31
        return self._long[c] if packed & 128 else self._ttl[c]

    def age(self, key) -> int:
        return self.age_of(self.entry(key))

    def page_age(self, key, above=None) -> int:
        """Retention age of a leaf that ends with page ``key`` when a victim is a whole
        engine node: a request's last page, read for the first time, takes the entry of
        the page ``above`` it in the same node (None: it is the node's only page)."""
        packed = self.entry(key)
        if packed is not None and above is not None and (packed >> 8) & 31 == self.classes:
            up = self.entry(above)
            if up is not None:
                packed = up
        return self.age_of(packed)

    @property
    def retention(self):
        """Current retention age per class, in ticks (for reports and tests)."""
        return list(self._ttl)

    # -------------------------------------------------------- reconfiguration
    def _reconfigure(self, now) -> None:
        closing = self._cohort
        closing.end = now
        self._ticks += now - closing.start
        cap = self.capacity
        if cap and self._pages > 0:
            cap = cap * self._units / self._pages      # in keys, as the counters count
        if cap and self._new_pages > 0 and self._ticks > 0:
            # LRU residency ~ capacity / new keys per tick; history covers `horizon` of it
            self._span = max(1, int(self.horizon * cap * self._ticks / self._new_pages))
            self._ttl, self._long, self._mix = self._solve(cap, now)
        d = self.decay
        self._ticks *= d
        self._new_pages *= d
        self._units *= d
        self._pages *= d
        cohorts = self._cohorts
        for cohort in cohorts.values():
            cohort.weight *= d
        while len(cohorts) > MAX_COHORTS:
            del cohorts[next(iter(cohorts))]
        self._open_cohort(now)
        self.generation += 1

    def _curves(self, c, now):
        """(ages, hits per interval, page-time per interval) of class ``c`` for each
        candidate retention age (bin edges up to the history span; age 0 first).

        The share of intervals returning in a bin is taken over the cohorts old enough
        for every return in that bin to have been seen (no bias towards short gaps while
        the history fills, as a plain returns/births ratio would have)."""
        closed = [h for h in self._cohorts.values() if h.end is not None]
        ages = [0]
        hits = [0.0]
        cost = [0.0]
        returned = 0.0
        spent = 0.0        # page-time of the intervals that returned so far, per interval
        lo = 0.0
        for b in range(1, NBINS):
            edge = 2.0 ** (b / 2)
            if edge > self._span:
                break
            den = 0.0
            num = 0.0
            for h in closed:
                if now - h.end >= edge:
                    den += h.weight * h.births[c]
                    num += h.weight * h.returns[c][b]
            if den <= 0:
                break
            share = num / den
            returned += share
            spent += share * (lo + edge) / 2
            lo = edge
            ages.append(int(edge))
            hits.append(returned)
            cost.append(spent + max(0.0, 1.0 - returned) * edge)
        return ages, hits, cost

    def _solve(self, cap, now):
        k = self.classes + 2
        closed = [h for h in self._cohorts.values() if h.end is not None]
        ticks = sum(h.weight * (h.end - h.start) for h in closed)
        if ticks <= 0:
            return self._ttl, self._long, self._mix
        rates = [sum(h.weight * h.births[c] for h in closed) / ticks for c in range(k)]
        curves = [self._curves(c, now) for c in range(k)]

        def pick(price):
            choice = []
            used = 0.0
            for c in range(k):
                ages, hits, cost = curves[c]
                best = 0
                best_v = 0.0
                for i in range(1, len(ages)):
                    v = hits[i] - price * cost[i]
                    if v > best_v:
                        best, best_v = i, v
                choice.append(ages[best])
                used += rates[c] * cost[best]
            return choice, used

        lo, hi = 1e-12, 1.0          # hit per page-tick: a page read every tick is worth 1
        choice, used = pick(lo)
        if used <= cap:
            return choice, choice, [0.0] * k
        for _ in range(40):
            mid = (lo * hi) ** 0.5
            if pick(mid)[1] > cap:
                lo = mid
            else:
                hi = mid
        short, used_short = pick(hi)     # fits
        long_, used_long = pick(lo)      # just over: mix the classes that differ
        share = (cap - used_short) / (used_long - used_short) if used_long > used_short else 0.0
        share = min(1.0, max(0.0, share))
        mix = [share if a != b else 0.0 for a, b in zip(short, long_)]
        return short, long_, mix


def _check(name, value, ok, allowed, integer=False):
    kind_ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not kind_ok or not ok(value):
        raise ValueError(f"hit_density: {name!r} must be {allowed}, got {value!r}")
    return value if integer else float(value)


def hit_density_core(params, identity="arrival") -> HitDensityCore:
    """A :class:`HitDensityCore` from keyword parameters, checked (the plugin's entry)."""
    unknown = set(params) - set(HIT_DENSITY_DEFAULTS)
    if unknown:
        raise ValueError(f"hit_density: unknown parameter(s) {sorted(unknown)}; "
                         f"it takes {sorted(HIT_DENSITY_DEFAULTS)}")
    v = dict(HIT_DENSITY_DEFAULTS, **params)
    return HitDensityCore(
        classes=_check("classes", v["classes"], lambda x: 1 <= x <= 16, "an integer in [1, 16]", True),
        epoch=_check("epoch", v["epoch"], lambda x: x >= 1, "an integer >= 1", True),
        decay=_check("decay", v["decay"], lambda x: 0 < x < 1, "a number in (0, 1)"),
        horizon=_check("horizon", v["horizon"], lambda x: x > 0, "a number > 0"),
        identity=identity)

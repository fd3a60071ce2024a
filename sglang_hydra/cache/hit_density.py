"""``hit_density``: a retention age per class of page, chosen online to maximise hits per page-time.

Why: on a multi-turn chat trace a block is almost never read again within ~50 requests of
its last read and re-reads peak a few hundred requests later, about when LRU evicts it.
What pays is to know, per class of page, how likely and how soon it comes back, and to
spend the cache's page-time where hits per page-time are highest: the ranking of LHD
(Beckmann et al., NSDI'18), solved here for the age at which each class stops paying.

What the policy uses is what a server sees: past reads of page keys, the order of a
request's pages (the tree path) and the clock.  Nothing about future requests.

* **History (ghost included).** Every page key read (hit or inserted) is remembered with
  its last read time, read count and class, for ``horizon`` times the cache's LRU
  residency (two generations of plain dicts), so evicted pages keep their history.
* **Classes.** A page read before is classed by its read count (1, 2, ...,
  ``classes`` or more).  A page read for the first time is in one of three classes: the
  request's last page (on a trace, the partial last block, which the next turn does not
  share), a page that extends a branch whose last cached page was read at most twice
  (the new turn of a young conversation), or any other new page.
* **Counters.** Each read opens an *interval* of the page's class; the next read of the
  page closes it and its length goes into a histogram (half-octave bins) kept by the
  *cohort* (epoch of ``epoch`` requests) that opened the interval.  A bin's return share
  is taken over the cohorts old enough to have seen every return in that bin, weighted
  by ``decay`` per epoch of age, so long gaps are not underestimated while the history
  fills.
* **Reconfiguration** (every ``epoch`` requests).  Keeping class ``c`` until age ``A``
  yields ``F_c(A)`` hits per interval and costs ``E_c[min(gap, A)]`` page-time per
  interval; with ``r_c`` intervals per tick the cache holds about
  ``sum_c r_c * E_c[min(gap, A_c)]`` pages (Little's law).  A price of page-time, found by
  bisection, makes that the capacity (pages, converted to keys by the observed pages per
  key, since a key holds several pages when pages are smaller than a trace block); each
  class takes the age maximising
  ``F_c(A) - price * E_c[min(gap, A)]`` (0 = evict first).  Where a class's best age jumps
  at that price (return times that peak late can make it pay to keep a share of pages
  longer rather than all of them for the LRU time), a share of requests (by a stable hash
  of the conversation's first unshared page) keeps the longer age, the rest the shorter one.
* **Key.** ``last_access + A_class``: a leaf's planned expiry; the most overdue leaf goes
  first.  Until the first reconfiguration every age is 0, i.e. LRU.  Under
  ``semantics="sglang"`` the victim is a whole engine node, so a leaf that is a
  request's last page is ranked by the page above it in the same node.

State changes only in :meth:`on_touch` (one pass over a request's page keys; an engine
plugin would call it from its match/insert hook) and :meth:`key` reads plain dicts: plain
Python, no numpy.  Reconfiguration costs O(classes x bins x cohorts) every ``epoch``
requests.  The clock is the tree's (:attr:`RadixTree.now`).
"""
from __future__ import annotations

from typing import List

from .policies import EvictionPolicy, Param, _stable_hash, register_eviction_policy

__all__ = ["HitDensityPolicy"]

NBINS = 64      # half-octave bins of a return gap: bin = (gap * gap).bit_length()
MAX_COHORTS = 64


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


def _positive_int(v):
    return v >= 1


def _open_unit(v):
    return 0 < v < 1


def _positive(v):
    return v > 0


def _class_count(v):
    return 1 <= v <= 16


class HitDensityPolicy(EvictionPolicy):
    """Retention age per class of page, chosen online from observed return gaps (module doc)."""

    name = "hit_density"
    wants_touch = True
    PARAMS = {
        "classes": Param(int, 3, "in [1, 16]", _class_count,
                         "reuse classes: read once, twice, ..., this many times or more"),
        "epoch": Param(int, 200, ">= 1", _positive_int,
                       "requests between two reconfigurations"),
        "decay": Param(float, 0.9, "in (0, 1)", _open_unit,
                       "weight kept by the counters at each reconfiguration"),
        "horizon": Param(float, 16.0, "> 0", _positive,
                         "history kept, in multiples of the cache's LRU residency"),
    }

    def bind(self, tree):
        super().bind(tree)
        k = self.classes + 2
        # sglang semantics: a victim is a whole engine node (all pages one insert added)
        self._whole_nodes = getattr(tree, "semantics", "rules") == "sglang"
        self._cur = {}            # key -> last read << 29 | cohort id << 13 | class << 8 | long variant << 7 | reads
        self._old = {}
        self._rotated = 0
        self._cohorts = {}        # cohort id (16 bits) -> _Cohort, oldest first
        self._cohort = None       # the open cohort
        self._next_id = 0
        self._ttl = [0] * k       # retention age of the short variant of each class
        self._long = [0] * k      # ... of the long variant (a share `_mix` of requests)
        self._mix = [0.0] * k
        self._requests = 0
        self._ticks = 0.0         # decayed ticks observed, for the history span
        self._new_pages = 0.0     # decayed keys read for the first time (within history)
        self._units = 0.0         # decayed keys read, and the pages they hold: the tree's
        self._pages = 0.0         # capacity is in pages, the counters are per key (unit)
        self._span = 1 << 62      # history length in ticks (until the first estimate)

    def _open_cohort(self, now) -> None:
        cid = self._next_id & 0xFFFF
        self._next_id += 1
        self._cohort = self._cohorts[cid] = _Cohort(cid, now, self.classes + 2)

    # ------------------------------------------------------------------ hooks
    def on_touch(self, page_keys, k, clock, last_node):
        now = self.tree.now
        if self._cohort is None:
            self._rotated = now
            self._open_cohort(now)
        cur = self._cur
        old = self._old
        cohort = self._cohort
        births = cohort.births
        stamp = (now << 29) | (cohort.cid << 13)
        cohorts = self._cohorts
        top = self.classes - 1
        last_page = self.classes          # class of a request's last page, read for the first time
        branch = self.classes + 1         # first read, below a page read at most twice before
        mix = self._mix
        new = 0
        first = page_keys[0] if page_keys else 0
        u = ((((first * 0x9E3779B1) >> 7) if type(first) is int else _stable_hash(first)) & 0xFFFF) / 65536.0
        r0 = -1
        n = len(page_keys)
        prev = 0          # reads of the previous page before this request (0: none / new)
        run = -1          # class of the pages read for the first time in the current run
        for j in range(n):
            key = page_keys[j]
            packed = cur.get(key)
            if packed is None:
                packed = old.get(key)
            if r0 < 0:
                r0 = 0 if packed is None else packed & 127
            elif r0 and (packed is None or (packed & 127) * 2 < r0):
                r0 = 0   # the first page that is not shared like page 0: the conversation's
                u = ((((key * 0x9E3779B1) >> 7) if type(key) is int else _stable_hash(key)) & 0xFFFF) / 65536.0
            if packed is None:
                reads = 1
                new += 1
                if run < 0:
                    run = branch if 0 < prev <= 2 else 0
                c = last_page if j == n - 1 else run
                prev = 0
            else:
                gap = now - (packed >> 29)
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
            cur[key] = stamp | (c << 8) | (128 if u < mix[c] else 0) | reads
        self._new_pages += new
        self._units += n
        self._pages += last_node.depth + 1
        if now - self._rotated > self._span:
            self._old = cur
            self._cur = {}
            self._rotated = now
        self._requests += 1
        if self._requests % self.epoch == 0:
            self._reconfigure(now)

    def key(self, node):
        cur = self._cur.get(node.key)
        if cur is None:
            cur = self._old.get(node.key)
        if cur is None:
            return node.last_access + self._ttl[0]
        c = (cur >> 8) & 31
        if c == self.classes and self._whole_nodes:
            # the engine evicts the whole node this leaf ends: rank it by the page above
            # the request's last page when that page belongs to the same node
            up = node.parent
            if up is not None and up.parent is not None and up.seg == node.seg:
                above = self._cur.get(up.key)
                if above is None:
                    above = self._old.get(up.key)
                if above is not None:
                    cur = above
                    c = (cur >> 8) & 31
        return node.last_access + (self._long[c] if cur & 128 else self._ttl[c])

    # -------------------------------------------------------- reconfiguration
    def _reconfigure(self, now) -> None:
        closing = self._cohort
        closing.end = now
        self._ticks += now - closing.start
        cap = self.tree.capacity
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

    @property
    def retention(self) -> List[int]:
        """Current retention age per class, in ticks (for reports and tests)."""
        return list(self._ttl)


register_eviction_policy("hit_density", HitDensityPolicy)

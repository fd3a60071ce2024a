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

The state machine is :class:`~sglang_hydra.cache.hit_density_core.HitDensityCore`
(standard library only), which the engine plugin runs too: :meth:`HitDensityPolicy.on_touch`
feeds it one request's page keys and :meth:`HitDensityPolicy.key` reads its ages.  Plain
Python, no numpy.  Reconfiguration costs O(classes x bins x cohorts) every ``epoch``
requests.  The clock is the tree's (:attr:`RadixTree.now`).

Under ``semantics="sglang"`` the policy runs exactly as SGLang runs it through the plugin
(``hit_density`` is one of its hooked policies): one history key per *page* (a trace block
of several pages is several keys, as the engine sees pages), the long-kept share picked by
the pages' arrival order (the engine's page ids are not the trace's), keys as current as the
engine's, which evaluates them when ``evict()`` starts (here: every candidate is re-keyed
when the ages change), and ties broken by recency as the engine's heap does.  The engine differential (tests/cache/test_engine_radix_differential.py) holds the two
to identical hits.
"""
from __future__ import annotations

from typing import List

from .hit_density_core import HIT_DENSITY_DEFAULTS, HitDensityCore
from .policies import EvictionPolicy, Param, register_eviction_policy

__all__ = ["HitDensityPolicy"]


def _positive_int(v):
    return v >= 1


def _open_unit(v):
    return 0 < v < 1


def _positive(v):
    return v > 0


def _class_count(v):
    return 1 <= v <= 16


_D = HIT_DENSITY_DEFAULTS


class HitDensityPolicy(EvictionPolicy):
    """Retention age per class of page, chosen online from observed return gaps (module doc)."""

    name = "hit_density"
    wants_touch = True
    engine_node_hooks = False
    PARAMS = {
        "classes": Param(int, _D["classes"], "in [1, 16]", _class_count,
                         "reuse classes: read once, twice, ..., this many times or more"),
        "epoch": Param(int, _D["epoch"], ">= 1", _positive_int,
                       "requests between two reconfigurations"),
        "decay": Param(float, _D["decay"], "in (0, 1)", _open_unit,
                       "weight kept by the counters at each reconfiguration"),
        "horizon": Param(float, _D["horizon"], "> 0", _positive,
                         "history kept, in multiples of the cache's LRU residency"),
    }

    def bind(self, tree):
        super().bind(tree)
        # sglang semantics: the engine plugin's view (pages, whole engine nodes, fresh keys)
        engine = getattr(tree, "semantics", "rules") == "sglang"
        self.core = HitDensityCore(self.classes, self.epoch, self.decay, self.horizon,
                                   identity="arrival" if engine else "key")
        self.core.bind(tree.capacity)
        if engine:
            self._keyed = self.core.generation     # the generation the tree's keys are from
            self.on_touch = self._engine_touch
            self.key = self._engine_key

    # ------------------------------------------------------------- rules
    def on_touch(self, page_keys, k, clock, last_node):
        self.core.touch(page_keys, self.tree.now, last_node.depth + 1)

    def key(self, node):
        core = self.core
        packed = core._cur.get(node.key)
        if packed is None:
            packed = core._old.get(node.key)
            if packed is None:
                return node.last_access + core._ttl[0]
        c = (packed >> 8) & 31
        return node.last_access + (core._long[c] if packed & 128 else core._ttl[c])

    # ------------------------------------------ sglang semantics (as the plugin)
    # A page is named by its unit's key (the unit's first page) or ``(unit key, page)``: any
    # one-to-one naming does, since the core's arrival identity ignores key values.
    def _engine_touch(self, page_keys, k, clock, last_node):
        """The request's pages from the tree path (a unit of ``weight`` pages is that many
        keys), as the engine plugin hashes the pages of its nodes."""
        if last_node.depth + 1 == len(page_keys):
            # one page per unit (e.g. page size = trace block): the pages are the units
            if page_keys:
                self.core.touch(page_keys, self.tree.now, len(page_keys))
                self._rekey_if_new_ages()
            return
        root = self.tree.root
        path = []
        node = last_node
        while node is not root:
            path.append(node)
            node = node.parent
        if not path:
            return
        pages = []
        add = pages.append
        for n in reversed(path):
            key = n.key
            lo = n.lo
            if lo == 0:
                add(key)
                lo = 1
            for p in range(lo, n.lo + n.weight):
                add((key, p))
        self.core.touch(pages, self.tree.now, len(pages))
        self._rekey_if_new_ages()

    def _rekey_if_new_ages(self):
        """The engine evaluates every leaf's priority when ``evict()`` starts.  A key here
        changes only when its leaf is stamped (a read of its pages, or of the page above it
        in its engine node, stamps it; the tree then pushes it again) or when the core's
        generation moves (new ages, or the history dropped its older half): then every
        candidate is re-keyed, before any later eviction, which gives the engine's order."""
        gen = self.core.generation
        if gen != self._keyed:
            self._keyed = gen
            self.tree.rekey_candidates()

    def _engine_key(self, node):
        """The engine's priority of the engine node this leaf ends: its last page's age,
        or the age of the page above it in the same node when the last page is a
        request's last page (see :meth:`HitDensityCore.page_age`); recency breaks ties."""
        t = node.last_access
        core = self.core
        cur = core._cur
        old = core._old
        key = node.key
        end = node.lo + node.weight - 1
        page = key if end == 0 else (key, end)
        packed = cur.get(page)
        if packed is None:
            packed = old.get(page)
            if packed is None:
                return (t + core._ttl[0], t)
        c = (packed >> 8) & 31
        if c == core.classes:
            # the request's last page: ranked by the page above it in the same engine node
            above = None
            if node.weight > 1:
                above = key if end == 1 else (key, end - 1)
            else:
                up = node.parent
                if up is not self.tree.root and up.seg == node.seg:
                    e = up.lo + up.weight - 1
                    above = up.key if e == 0 else (up.key, e)
            if above is not None:
                a = cur.get(above)
                if a is None:
                    a = old.get(above)
                if a is not None:
                    packed = a
                    c = (a >> 8) & 31
        return (t + (core._long[c] if packed & 128 else core._ttl[c]), t)

    # ------------------------------------------------------------- reports
    @property
    def retention(self) -> List[int]:
        """Current retention age per class, in ticks (for reports and tests)."""
        return self.core.retention

    @property
    def _mix(self):
        return self.core._mix

    @property
    def _long(self):
        return self.core._long

    @property
    def _units(self):
        return self.core._units

    @property
    def _pages(self):
        return self.core._pages


register_eviction_policy("hit_density", HitDensityPolicy)

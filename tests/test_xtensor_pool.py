"""xTensor page bookkeeping through the binding, against a brute-force reference model.

The reference keeps the owner of every page and predicts exactly which pages each
operation takes: KV growth the lowest free ids; weights the highest pages of the best-fit
free run (shortest run that fits, ties to the highest run), else the highest free pages;
exhaustion an error that changes nothing. KV caches are off (watermarks 0, no background
thread) so the prediction is exact; cache behaviour is tested in test_xtensor_mapping.py.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from janusd.memory import DevicePool, KvRegion, XTensorError

PAGE = 4096
NUM_PAGES = 48
OWNERS = ("a", "b", "c", "d")


def free_runs(owner_of: list[str | None]) -> list[tuple[int, int]]:
    runs, i = [], 0
    while i < len(owner_of):
        if owner_of[i] is None:
            s = i
            while i < len(owner_of) and owner_of[i] is None:
                i += 1
            runs.append((s, i - s))
        else:
            i += 1
    return runs


def reference_weight_pages(owner_of: list[str | None], n: int) -> tuple[list[int], bool]:
    fits = [(length, start) for start, length in free_runs(owner_of) if length >= n]
    if fits:
        best_len = min(length for length, _ in fits)
        start = max(s for length, s in fits if length == best_len)
        return list(range(start + best_len - n, start + best_len)), True
    free = [i for i, o in enumerate(owner_of) if o is None]
    return sorted(free[-n:]), False


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = DevicePool("cpu", NUM_PAGES, PAGE, background=False)
        self.owner_of: list[str | None] = [None] * NUM_PAGES
        self.regions: list[tuple[str, KvRegion, list[int]]] = []  # (owner, region, model pages)
        self.live: set[str] = set()

    def teardown(self) -> None:
        self.pool.close()

    def free_count(self) -> int:
        return sum(o is None for o in self.owner_of)

    @rule(owner=st.sampled_from(OWNERS), n=st.integers(1, 20), extra=st.integers(0, PAGE - 1))
    def alloc_weights(self, owner: str, n: int, extra: int) -> None:
        nbytes = (n - 1) * PAGE + 1 + extra  # rounds up to exactly n pages
        if n > self.free_count():
            before = self.pool.stats()
            with pytest.raises(XTensorError, match="exhausted"):
                self.pool.alloc_weights(owner, nbytes)
            assert self.pool.stats() == before
            return
        expect, contiguous = reference_weight_pages(self.owner_of, n)
        seg = self.pool.alloc_weights(owner, nbytes)
        assert seg.page_ids == expect
        assert seg.contiguous == contiguous
        assert seg.nbytes == nbytes
        assert seg.global_offset == expect[0] * PAGE
        for p in expect:
            self.owner_of[p] = owner
        self.live.add(owner)

    @rule(owner=st.sampled_from(OWNERS), max_pages=st.integers(1, 30))
    def kv_create(self, owner: str, max_pages: int) -> None:
        kv = self.pool.kv_region(owner, max_pages * PAGE, cache_low=0, cache_high=0)
        assert kv.max_pages == max_pages and kv.mapped_pages == 0
        self.regions.append((owner, kv, []))
        self.live.add(owner)

    @precondition(lambda self: self.regions)
    @rule(data=st.data())
    def kv_resize(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.regions) - 1))
        owner, kv, pages = self.regions[i]
        n = data.draw(st.integers(0, kv.max_pages))
        grow = n - len(pages)
        if grow > self.free_count():
            before = self.pool.stats()
            with pytest.raises(XTensorError, match="exhausted"):
                kv.resize(n)
            assert self.pool.stats() == before and kv.page_ids() == pages
            return
        kv.resize(n)
        if grow > 0:
            new = [p for p, o in enumerate(self.owner_of) if o is None][:grow]
            for p in new:
                self.owner_of[p] = owner
            pages.extend(new)
        else:
            for p in pages[n:]:
                self.owner_of[p] = None
            del pages[n:]
        assert kv.page_ids() == pages
        assert kv.mapped_pages == n

    @rule(owner=st.sampled_from(OWNERS))
    def free(self, owner: str) -> None:
        if owner not in self.live:
            with pytest.raises(XTensorError, match="unknown owner|double free"):
                self.pool.free(owner)
            return
        self.pool.free(owner)
        self.owner_of = [None if o == owner else o for o in self.owner_of]
        self.regions = [r for r in self.regions if r[0] != owner]
        self.live.discard(owner)

    @invariant()
    def consistent(self) -> None:
        self.pool.check_integrity()
        s = self.pool.stats()
        assert s.free_pages == self.free_count()
        counts: dict[str, int] = {}
        for o in self.owner_of:
            if o is not None:
                counts[o] = counts.get(o, 0) + 1
        assert s.pages_by_owner == counts
        runs = free_runs(self.owner_of)
        assert s.largest_free_run == max((length for _, length in runs), default=0)
        assert s.free_runs == len(runs)
        assert s.cached_pages == 0


TestPoolMachine = PoolMachine.TestCase


def test_best_fit_prefers_the_shortest_run_then_the_highest() -> None:
    with DevicePool("cpu", 32, PAGE, background=False) as pool:
        # Layout after freeing x and y: free runs [0,4) len 4 (a KV hole), [10,13) len 3, [20,23) len 3.
        pool.kv_region("kv", 32 * PAGE, cache_low=0, cache_high=0).resize(4)
        hi = pool.alloc_weights("w1", 9 * PAGE)  # 23..31
        assert hi.page_ids == list(range(23, 32))
        pool.alloc_weights("y", 3 * PAGE)  # 20..22
        pool.alloc_weights("w2", 7 * PAGE)  # 13..19
        pool.alloc_weights("x", 3 * PAGE)  # 10..12
        pool.alloc_weights("w3", 6 * PAGE)  # 4..9
        pool.free("kv")
        pool.free("x")
        pool.free("y")
        assert pool.stats().free_pages == 10
        two = pool.alloc_weights("two", 2 * PAGE)  # best fit len 3, highest: [20,23) -> 21,22
        assert two.page_ids == [21, 22] and two.contiguous
        four = pool.alloc_weights("four", 4 * PAGE)  # only [0,4) fits
        assert four.page_ids == [0, 1, 2, 3]
        big = pool.alloc_weights("big", 4 * PAGE)  # no run of 4 left: highest free pages
        assert not big.contiguous and big.page_ids == [10, 11, 12, 20]
        pool.check_integrity()
        assert pool.stats().noncontiguous_segments == 1


def test_kv_takes_the_lowest_free_pages() -> None:
    with DevicePool("cpu", 16, PAGE, background=False) as pool:
        w = pool.alloc_weights("w", 4 * PAGE)
        assert w.page_ids == [12, 13, 14, 15]
        a = pool.kv_region("a", 8 * PAGE, cache_low=0, cache_high=0)
        b = pool.kv_region("b", 8 * PAGE, cache_low=0, cache_high=0)
        a.resize(2)
        b.resize(2)
        a.resize(4)
        assert a.page_ids() == [0, 1, 4, 5] and b.page_ids() == [2, 3]
        a.resize(1)
        b.resize(4)
        assert b.page_ids() == [2, 3, 1, 4]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: p.alloc_weights("m", 0), "nbytes must be >= 1"),
        (lambda p: p.alloc_weights("m", -5), "nbytes must be >= 1"),
        (lambda p: p.alloc_weights("", 10), "owner must be a non-empty str"),
        (lambda p: p.alloc_weights("m", 1.5), "nbytes must be an int"),
        (lambda p: p.alloc_weights("m", 17 * PAGE), "exhausted: 17 pages requested, 16 free"),
        (lambda p: p.kv_region("m", 0), "max_bytes must be >= 1"),
        (lambda p: p.kv_region("m", PAGE, cache_low=3, cache_high=1), "low 3 > high 1"),
        (lambda p: p.kv_region("m", 2 * PAGE, cache_low=0, cache_high=0).resize(3), "exceeds the region's 2 reserved pages"),
        (lambda p: p.kv_region("m", 2 * PAGE, cache_low=0, cache_high=0).resize(-1), "n_pages must be >= 0"),
        (lambda p: p.kv_region("m", 2 * PAGE, cache_low=0, cache_high=0).global_offsets(0, 1), "not inside the region's 0 mapped bytes"),
        (lambda p: p.free("nobody"), "unknown owner"),
        # beyond 64-bit: an XTensorError, not PyO3's OverflowError
        (lambda p: p.alloc_weights("m", 2**70), "nbytes must be <= 9223372036854775807"),
        (lambda p: p.kv_region("m", PAGE, cache_low=2**64, cache_high=2**64), "cache_low must be <= 9223372036854775807"),
        (lambda p: p.kv_region("m", 2 * PAGE, cache_low=0, cache_high=0).resize(2**64), "n_pages must be <= 9223372036854775807"),
    ],
)
def test_bad_input_is_a_clear_error_and_changes_nothing(call, message) -> None:  # type: ignore[no-untyped-def]
    with DevicePool("cpu", 16, PAGE, background=False) as pool:
        before = pool.stats()
        with pytest.raises(XTensorError, match=message):
            call(pool)
        after = pool.stats()
        pool.check_integrity()
        assert after.free_pages == before.free_pages == 16
        assert after.weight_segments == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "tpu"}, "unknown device kind 'tpu'"),
        ({"num_pages": 0}, "num_pages must be >= 1"),
        ({"num_pages": 1 << 40}, "num_pages must be in 1..=16777216"),
        ({"page_size": 3000}, "page_size must be a positive power of two"),
        ({"page_size": 512}, "multiple of the OS page size"),
        ({"device_index": -1}, "device_index must be >= 0"),
    ],
)
def test_bad_pool_arguments(kwargs, message) -> None:  # type: ignore[no-untyped-def]
    args = {"kind": "cpu", "num_pages": 4, "page_size": PAGE} | kwargs
    with pytest.raises(XTensorError, match=message):
        DevicePool(**args)


def test_double_free_and_use_after_close() -> None:
    pool = DevicePool("cpu", 8, PAGE, background=False)
    pool.alloc_weights("m", PAGE)
    pool.free("m")
    with pytest.raises(XTensorError, match="already freed"):
        pool.free("m")
    pool.alloc_weights("m", PAGE)  # the name can be used again
    pool.close()
    with pytest.raises(XTensorError, match="closed"):
        pool.alloc_weights("n", PAGE)
    pool.close()  # idempotent


def test_fragmentation_counts_stranded_free_runs_and_idle_cache() -> None:
    with DevicePool("cpu", 100, PAGE, background=False) as pool:
        assert pool.stats().fragmentation_pct == 0.0
        pool.alloc_weights("a", 10 * PAGE)  # 90..99
        pool.alloc_weights("hole", 3 * PAGE)  # 87..89
        pool.alloc_weights("b", 10 * PAGE)  # 77..86
        pool.free("hole")  # a free run of 3 < smallest weight request (3): not stranded yet
        assert pool.stats().stranded_free_pages == 0
        pool.alloc_weights("c", 5 * PAGE)  # best fit is the big low run; threshold stays 3
        s = pool.stats()
        assert (s.stranded_threshold_pages, s.stranded_free_pages) == (3, 0)
        pool.free("c")
        pool.alloc_weights("d", 2 * PAGE)  # fits the hole exactly: [88, 89]; leaves 87 alone
        s = pool.stats()
        assert s.stranded_threshold_pages == 2 and s.stranded_free_pages == 1
        assert s.fragmentation_pct == pytest.approx(1.0)

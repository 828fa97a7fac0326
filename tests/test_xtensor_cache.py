"""KV caches and reclaim under random interleavings: invariants that must hold whatever
the watermarks (exact page choices are checked in test_xtensor_pool.py with caches off)."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from janusd.memory import DevicePool, XTensorError

PAGE = 4096
NUM_PAGES = 40
OWNERS = ("a", "b", "c")


class CachedPoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = DevicePool("cpu", NUM_PAGES, PAGE, background=False)
        self.regions: list[tuple[str, Any, int]] = []  # (owner, region, cache high watermark)
        self.weights: dict[str, int] = {}

    def teardown(self) -> None:
        self.pool.close()

    @rule(owner=st.sampled_from(OWNERS), n=st.integers(1, 16))
    def alloc_weights(self, owner: str, n: int) -> None:
        before = self.pool.stats()
        try:
            seg = self.pool.alloc_weights(owner, n * PAGE)
        except XTensorError as e:
            assert "exhausted" in str(e)
            assert n > before.free_pages + before.cached_pages
            assert self.pool.stats() == before
            return
        assert n <= before.free_pages + before.cached_pages
        assert len(seg.page_ids) == n
        self.weights[owner] = self.weights.get(owner, 0) + n

    @rule(owner=st.sampled_from(OWNERS), max_pages=st.integers(1, 20), low=st.integers(0, 3), extra=st.integers(0, 4))
    def kv_create(self, owner: str, max_pages: int, low: int, extra: int) -> None:
        kv = self.pool.kv_region(owner, max_pages * PAGE, cache_low=low, cache_high=low + extra)
        self.regions.append((owner, kv, low + extra))

    @precondition(lambda self: self.regions)
    @rule(data=st.data())
    def kv_resize(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.regions) - 1))
        owner, kv, _ = self.regions[i]
        n = data.draw(st.integers(0, kv.max_pages))
        before_ids = kv.page_ids()
        before = self.pool.stats()
        try:
            kv.resize(n)
        except XTensorError as e:
            assert "exhausted" in str(e)
            assert self.pool.stats() == before and kv.page_ids() == before_ids
            return
        ids = kv.page_ids()
        assert len(ids) == n == kv.mapped_pages
        keep = min(n, len(before_ids))
        assert ids[:keep] == before_ids[:keep]  # pages never move inside a region

    @rule(owner=st.sampled_from(OWNERS))
    def free(self, owner: str) -> None:
        live = owner in self.weights or any(o == owner for o, _, _ in self.regions)
        if not live:
            with pytest.raises(XTensorError):
                self.pool.free(owner)
            return
        self.pool.free(owner)
        self.weights.pop(owner, None)
        self.regions = [r for r in self.regions if r[0] != owner]
        assert owner not in self.pool.stats().pages_by_owner

    @invariant()
    def consistent(self) -> None:
        self.pool.check_integrity()
        s = self.pool.stats()
        assert sum(s.pages_by_owner.values()) + s.free_pages == NUM_PAGES
        assert s.weight_pages == sum(self.weights.values())
        assert s.kv_pages == sum(kv.mapped_pages for _, kv, _ in self.regions)
        assert s.weight_pages + s.kv_pages + s.cached_pages + s.free_pages == NUM_PAGES
        assert s.idle_cache_pages == 0  # no background thread: caches are trimmed at once
        for _, kv, high in self.regions:
            assert kv.cached_pages <= high


TestCachedPoolMachine = CachedPoolMachine.TestCase


def test_random_churn_with_the_refill_thread_keeps_every_invariant() -> None:
    rng = random.Random(11)
    with DevicePool("cpu", 64, PAGE, background=True) as pool:
        regions = {name: pool.kv_region(name, 24 * PAGE, cache_low=2, cache_high=5) for name in ("x", "y", "z")}
        for step in range(1500):
            name = rng.choice("xyz")
            kv = regions[name]
            if step % 97 == 0:
                pool.free(name)
                regions[name] = pool.kv_region(name, 24 * PAGE, cache_low=2, cache_high=5)
                continue
            try:
                kv.resize(rng.randint(0, 24))
            except XTensorError as e:
                assert "exhausted" in str(e)
            pool.check_integrity()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            s = pool.stats()
            settled = all(
                min(2, kv.max_pages - kv.mapped_pages) <= kv.cached_pages <= 5 for kv in regions.values()
            ) or s.free_pages == 0
            if settled and s.idle_cache_pages == 0:
                break
            time.sleep(0.01)
        s = pool.stats()
        assert s.idle_cache_pages == 0
        for kv in regions.values():
            assert kv.cached_pages <= 5
        pool.check_integrity()

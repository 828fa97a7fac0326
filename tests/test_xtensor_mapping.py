"""Real mapping on the host backend: one memfd page under two virtual addresses, unmapped
addresses that fault, zero-copy torch views, and the KV cache with its refill thread."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import torch

from janusd.memory import DevicePool, XTensorError

PAGE = 2 << 20


def perms_at(addr: int) -> str:
    """Permissions of the /proc/self/maps entry containing addr ('' if none)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line.split()[1]
    return ""


def test_kv_bytes_appear_in_the_global_region_at_the_page_offset() -> None:
    with DevicePool("cpu", 16, PAGE, background=False) as pool:
        kv = pool.kv_region("m", 4 * PAGE, cache_low=0, cache_high=0)
        other = pool.kv_region("o", 4 * PAGE, cache_low=0, cache_high=0)
        other.resize(1)  # page 0 goes to "o", so "m"'s region page 0 is physical page 1
        kv.resize(3)
        assert kv.page_ids() == [1, 2, 3]
        t = kv.tensor()
        pattern = torch.arange(3 * PAGE, dtype=torch.int64).remainder(251).to(torch.uint8)
        t[: 3 * PAGE] = pattern
        g = pool.global_tensor()
        for i, pid in enumerate(kv.page_ids()):
            assert torch.equal(g[pid * PAGE : (pid + 1) * PAGE], pattern[i * PAGE : (i + 1) * PAGE])
        # And the other direction: a write through the global region shows in the KV view.
        g[2 * PAGE + 5] = 77
        assert int(t[PAGE + 5]) == 77
        assert kv.global_offsets(PAGE - 10, 20) == [(2 * PAGE - 10, 20)]
        kv.resize(3)
        pieces = kv.global_offsets(10, 3 * PAGE - 20)
        assert sum(n for _, n in pieces) == 3 * PAGE - 20 and pieces[0][0] == PAGE + 10
        assert perms_at(kv.base) == "rw-s" and perms_at(pool.global_base) == "rw-s"


def test_unmapped_kv_pages_are_inaccessible_but_stay_reserved() -> None:
    with DevicePool("cpu", 8, PAGE, background=False) as pool:
        kv = pool.kv_region("m", 4 * PAGE, cache_low=0, cache_high=0)
        kv.resize(2)
        top = kv.base + PAGE
        assert perms_at(top) == "rw-s"
        kv.resize(1)
        assert perms_at(kv.base) == "rw-s"
        assert perms_at(top) == "---p"  # reserved, not mapped
        pool.free("m")
        assert perms_at(kv.base) == "---p"


def test_touching_an_unmapped_kv_page_faults() -> None:
    code = textwrap.dedent(
        """
        import ctypes, resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from the expected fault
        from janusd import _native
        pool = _native.XtPool("cpu", 4, 4096, 0, False)
        kv = pool.kv_region("m", 2 * 4096, 0, 0)
        kv.resize(2)
        ctypes.memset(kv.base + 4096, 1, 16)   # mapped: fine
        kv.resize(1)
        print("unmapped", flush=True)
        ctypes.memset(kv.base + 4096, 1, 16)   # must fault
        print("survived", flush=True)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "unmapped" in r.stdout and "survived" not in r.stdout
    assert r.returncode == -11, r.stderr


def test_weight_views_see_writes_made_through_the_global_region() -> None:
    with DevicePool("cpu", 16, PAGE, background=False) as pool:
        seg = pool.alloc_weights("m", 3 * PAGE + 100)
        assert seg.contiguous and seg.page_ids == [12, 13, 14, 15]
        w = seg.view(PAGE, (64, 32), torch.float32)
        g = pool.global_tensor(torch.float32)
        start = (seg.global_offset + PAGE) // 4
        g[start : start + 64 * 32] = torch.arange(64 * 32, dtype=torch.float32)
        assert torch.equal(w.flatten(), torch.arange(64 * 32, dtype=torch.float32))
        x = torch.ones(32, 8)
        assert torch.allclose(w @ x, torch.arange(64 * 32, dtype=torch.float32).view(64, 32).sum(1, keepdim=True).expand(64, 8))
        assert seg.tensor().numel() == seg.nbytes
        assert seg.tensor(torch.float32).data_ptr() == seg.addr


def test_noncontiguous_fallback_maps_scattered_pages_in_order() -> None:
    with DevicePool("cpu", 12, PAGE, background=False) as pool:
        for name in ("a", "b", "c", "d", "e", "f"):
            pool.alloc_weights(name, 2 * PAGE)  # a=10,11 b=8,9 ... f=0,1
        pool.free("b")
        pool.free("d")
        seg = pool.alloc_weights("big", 4 * PAGE)
        assert not seg.contiguous and seg.page_ids == [4, 5, 8, 9]
        t = seg.tensor()
        for i in range(4):
            t[i * PAGE : (i + 1) * PAGE] = i + 1
        g = pool.global_tensor()
        for i, pid in enumerate(seg.page_ids):
            assert int(g[pid * PAGE]) == i + 1 and int(g[(pid + 1) * PAGE - 1]) == i + 1
        assert seg.global_offset == 4 * PAGE
        addr = seg.addr
        pool.free("big")
        assert perms_at(addr) == "---p"


def test_views_check_bounds_and_alignment() -> None:
    with DevicePool("cpu", 4, PAGE, background=False) as pool:
        seg = pool.alloc_weights("m", 1000)
        assert seg.view(996, (1,), torch.float32).numel() == 1
        with pytest.raises(ValueError, match="outside"):
            seg.view(997, (1,), torch.float32)
        with pytest.raises(ValueError, match="not aligned"):
            seg.view(2, (2,), torch.float32)
        with pytest.raises(ValueError, match="outside"):
            seg.view(-4, (1,), torch.float32)
        assert seg.view(0, (0, 5), torch.float16).shape == (0, 5)


def test_kv_cache_serves_growth_without_mapping_and_refills() -> None:
    with DevicePool("cpu", 64, 4096, background=False) as pool:
        kv = pool.kv_region("m", 32 * 4096, cache_low=2, cache_high=4)
        assert (kv.mapped_pages, kv.cached_pages) == (0, 4)  # refilled at creation
        kv.resize(3)  # 3 from the cache, then refill back to 4 (cache fell below 2)
        assert (kv.mapped_pages, kv.cached_pages, kv.cache_misses, kv.cache_hits) == (3, 4, 0, 3)
        kv.resize(10)  # 4 from the cache, 3 mapped on the spot (misses)
        assert (kv.cache_hits, kv.cache_misses) == (7, 3)
        kv.resize(2)  # 8 pages go to the cache; trimmed back to the high watermark
        assert (kv.mapped_pages, kv.cached_pages) == (2, 4)
        assert pool.stats().pages_by_owner == {"m": 6}
        assert pool.stats().fragmentation_pct == 0.0
        pool.check_integrity()


def test_refill_thread_keeps_caches_between_watermarks() -> None:
    with DevicePool("cpu", 64, 4096, background=True) as pool:
        kv = pool.kv_region("m", 32 * 4096, cache_low=2, cache_high=6)
        deadline = time.monotonic() + 5
        while kv.cached_pages < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert kv.cached_pages == 6
        kv.resize(6)  # all from the cache: no map call on this path
        assert kv.cache_misses == 0 and kv.cache_hits == 6
        while kv.cached_pages < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (kv.mapped_pages, kv.cached_pages) == (6, 6)
        kv.resize(0)  # 12 cached: 6 beyond the high watermark count as idle until trimmed
        while kv.cached_pages > 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert kv.cached_pages == 6 and pool.stats().idle_cache_pages == 0
        pool.check_integrity()


def test_exhausted_pool_reclaims_idle_caches_before_failing() -> None:
    with DevicePool("cpu", 16, 4096, background=False) as pool:
        a = pool.kv_region("a", 16 * 4096, cache_low=4, cache_high=8)
        a.resize(5)  # 5 of the 8 cached pages; the cache (3) fell below 4: refilled to 8
        assert a.cached_pages == 8 and pool.stats().free_pages == 3
        seg = pool.alloc_weights("w", 10 * 4096)  # 3 free + 7 taken back from a's cache
        assert len(seg.page_ids) == 10 and a.cached_pages == 1 and a.mapped_pages == 5
        before = pool.stats()
        with pytest.raises(XTensorError, match="exhausted"):
            pool.alloc_weights("x", 2 * 4096)  # 0 free + 1 cached < 2: nothing changes
        assert pool.stats() == before
        pool.check_integrity()

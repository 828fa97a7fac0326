"""The resident zone of a cpu pool (`devices.resident_mib`, memory/residency.py): its pages
are backed from creation, a write into them takes no page faults (the kernel's zero-fill
was paid up front), give_back() keeps them and frees the rest, and bad sizes are errors."""

from __future__ import annotations

import ctypes
import resource

import pytest

from janusd.engine.device_engine import DeviceEngine
from janusd.engine.types import EngineError
from janusd.memory import DevicePool, XTensorError
from janusd.memory.residency import resident_fraction

PAGE = 2 << 20


def faults_writing(addr: int, nbytes: int) -> int:
    """Minor page faults this thread takes writing [addr, addr + nbytes) once."""
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    ctypes.memset(addr, 0x5A, nbytes)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def pages_range(pool: DevicePool, first: int, count: int) -> tuple[int, int]:
    return pool.global_base + first * PAGE, count * PAGE


def test_resident_zone_is_backed_and_written_without_faults():
    with DevicePool("cpu", 12, PAGE, background=False, resident_pages=4) as pool:
        assert pool.resident_pages == 4
        assert resident_fraction(*pages_range(pool, 8, 4)) == 1.0
        assert resident_fraction(*pages_range(pool, 0, 8)) == 0.0
        seg = pool.alloc_weights("w", 6 * PAGE)  # from the high end: pages 6..11, 4 of them resident
        assert sorted(seg.page_ids) == list(range(6, 12))
        os_pages = 4 * PAGE // 4096
        assert faults_writing(*pages_range(pool, 8, 4)) < os_pages // 50
        assert faults_writing(*pages_range(pool, 6, 2)) >= 2 * PAGE // 4096 * 9 // 10  # first touch: one per page
        pool.give_back(seg.page_ids)
        pool.free("w")
        assert resident_fraction(*pages_range(pool, 8, 4)) == 1.0  # kept for the next segment
        assert resident_fraction(*pages_range(pool, 6, 2)) == 0.0  # given back to the OS


def test_without_a_resident_zone_everything_is_given_back():
    with DevicePool("cpu", 4, PAGE, background=False) as pool:
        assert pool.resident_pages == 0 and resident_fraction(*pages_range(pool, 0, 4)) == 0.0
        seg = pool.alloc_weights("w", 4 * PAGE)
        seg.tensor().fill_(1)
        assert resident_fraction(*pages_range(pool, 0, 4)) == 1.0
        pool.give_back(seg.page_ids)
        pool.free("w")
        assert resident_fraction(*pages_range(pool, 0, 4)) == 0.0


def test_bad_resident_sizes_are_errors():
    with pytest.raises(XTensorError, match="resident_pages"):
        DevicePool("cpu", 4, PAGE, background=False, resident_pages=5)
    with pytest.raises(XTensorError, match="resident_pages"):
        DevicePool("cpu", 4, PAGE, background=False, resident_pages=-1)
    with pytest.raises(EngineError, match="resident_bytes"):
        DeviceEngine(memory_bytes=8 * PAGE, resident_bytes=PAGE + 1)
    with pytest.raises(EngineError, match="resident_bytes"):
        DeviceEngine(memory_bytes=8 * PAGE, resident_bytes=16 * PAGE)


def test_device_engine_keeps_a_cold_models_resident_pages():
    """A model leaving for Cold gives back only what lies outside the resident zone."""
    from pathlib import Path
    import tempfile

    from janusd.config import EngineConfig, ModelConfig

    de = DeviceEngine(memory_bytes=16 * PAGE, resident_bytes=16 * PAGE)
    try:
        me = de.load_model(ModelConfig(name="m", checkpoint="demo:llama-tiny", kv_cache_mib=4), EngineConfig(),
                           Path(tempfile.gettempdir()) / "janusd-test-cache")
        pages = me.placement.segment.page_ids
        de.release(de.detach("m"), None, keep_host=False)
        for first, count in ((p, 1) for p in pages):
            assert resident_fraction(*pages_range(de.pool, first, count)) == 1.0
    finally:
        de.pool.close()

"""The engine and the lifecycle on a CUDA device (xTensor's VMM backend underneath):
the same greedy tokens as on the cpu, a Warm -> Active restore from a page-locked host
copy with identical outputs (the out-of-memory rollback runs on cuda in
test_lifecycle_engine.py), cycles that free
the device back to its baseline, and co-located models (one stream each) that match each
alone. Skipped where there is no CUDA driver and device (CI); run on a lent device
machine (bench/RESULTS.md "cuda")."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from engine_fixtures import cuda_available
from janusd.config import EngineConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.restore import Copier
from janusd.engine.types import SamplingParams


pytestmark = pytest.mark.skipif(not cuda_available(), reason="no CUDA driver (libcuda.so.1) / device here")

CACHE = Path(tempfile.gettempdir()) / "janusd-test-cache"
MC = ModelConfig(name="m", checkpoint="demo:llama-tiny", kv_cache_mib=4)
EC = EngineConfig()
PAGE = 2 << 20  # the VMM allocation granularity on current NVIDIA GPUs


def generate(de: DeviceEngine, name: str = "m", seed: int | None = None) -> list[int]:
    params = SamplingParams(max_tokens=12, temperature=0.0 if seed is None else 0.8, seed=seed, ignore_eos=True)
    out = de.models[name].generate({"r": [5, 6, 7, 8, 9, 10, 11]}, params)
    return [t for o in out["r"] for t in o.token_ids]


@pytest.fixture
def de():
    e = DeviceEngine(kind="cuda", memory_bytes=64 << 20, page_size=PAGE)
    e.load_model(MC, EC, CACHE)
    yield e
    e.pool.close()


def test_weights_live_in_the_vmm_pool_and_greedy_matches_cpu(de):
    me = de.models["m"]
    seg = me.placement.segment
    assert seg.tensor().is_cuda and de.pool.kind == "cuda"
    lo, hi = de.pool.global_base, de.pool.global_base + de.pool.global_nbytes
    assert lo <= seg.addr < hi  # the views are into our mapped pages, not torch's allocator
    cpu = DeviceEngine(kind="cpu", memory_bytes=16 << 20)
    cpu.load_model(MC, EC, CACHE)
    assert torch.equal(seg.tensor()[: me.placement.plan.total_bytes].cpu(),
                       cpu.models["m"].placement.segment.tensor()[: me.placement.plan.total_bytes])
    assert generate(de) == generate(cpu)
    cpu.pool.close()


def test_warm_restore_from_pinned_host_copy_is_identical(de):
    greedy, seeded = generate(de), generate(de, seed=7)
    before = de.models["m"].placement.segment.tensor().clone()
    copier = Copier(streams=3, chunk_bytes=64 << 10)  # many async chunks on the copy stream
    host, d2h_s = de.release(de.detach("m"), copier, keep_host=True)
    assert host.pinned and host.buf.is_pinned() and d2h_s > 0
    assert torch.equal(host.buf, before[: host.nbytes].cpu())
    assert de.pool.stats().weight_pages == 0 and de.pool.stats().kv_pages == 0
    phases: dict[str, float] = {}
    de.register(de.restore_model(host, copier, phases))
    assert set(phases) == {"prepare", "transfer", "restore"} and phases["transfer"] > 0
    assert torch.equal(de.models["m"].placement.segment.tensor()[: host.nbytes].cpu(), host.buf)
    assert generate(de) == greedy and generate(de, seed=7) == seeded


def test_cycles_free_the_device_back_to_baseline():
    """Warm and Cold in turns, 40 times: the pool's pages back to where they were, and the
    GPU's free memory (cudaMemGetInfo) and torch's allocator flat: nothing leaks on the
    device or in pinned host memory."""
    de = DeviceEngine(kind="cuda", memory_bytes=64 << 20, page_size=PAGE)
    base = de.pool.stats()
    de.load_model(MC, EC, CACHE)
    ref = generate(de)
    copier = Copier(2, 1 << 20)
    free0 = alloc0 = None
    for i in range(40):
        host, _ = de.release(de.detach("m"), copier, keep_host=i % 2 == 0)
        if host is None:
            host = de.stage_host_copy(MC, EC, CACHE)
        assert host.pinned
        de.register(de.restore_model(host, copier, {}))
        del host
        if i == 3:
            torch.cuda.synchronize()
            free0, alloc0 = torch.cuda.mem_get_info()[0], torch.cuda.memory_allocated()
    assert generate(de) == ref
    torch.cuda.synchronize()
    assert abs(torch.cuda.mem_get_info()[0] - free0) <= 8 << 20
    assert torch.cuda.memory_allocated() - alloc0 <= 1 << 20
    de.unload_model("m")
    de.pool.wait_maintenance()
    end = de.pool.stats()
    assert (end.free_pages, end.weight_pages, end.kv_pages) == (base.free_pages, base.weight_pages, base.kv_pages)
    de.pool.close()


def test_colocated_models_match_each_alone():
    """Two models on one CUDA pool, each stepping on its own stream, batched together by
    DeviceEngine.step: every request's tokens equal those of its model alone."""
    cfgs = [ModelConfig(name=n, checkpoint=f"demo:{n}-tiny", kv_cache_mib=4) for n in ("llama", "qwen2")]
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    prompts = {f"q{i}": [(11 * i + 5 * j) % 470 + 30 for j in range(n)] for i, n in enumerate([4, 13, 22])}

    def run(de: DeviceEngine, names: list[str]) -> dict[tuple[str, str], list[int]]:
        for n in names:
            for rid, p in prompts.items():
                de.models[n].add_request(rid, p, greedy)
        out: dict[tuple[str, str], list[int]] = {}
        while de.has_work():
            for o in de.step():
                out.setdefault((o.model, o.req_id), []).extend(o.token_ids)
        return out

    alone: dict[tuple[str, str], list[int]] = {}
    for c in cfgs:
        solo = DeviceEngine(kind="cuda", memory_bytes=32 << 20, page_size=PAGE)
        solo.load_model(c, EC, CACHE)
        alone.update(run(solo, [c.name]))
        solo.pool.close()
    de = DeviceEngine(kind="cuda", memory_bytes=64 << 20, page_size=PAGE)
    for c in cfgs:
        de.load_model(c, EC, CACHE)
    assert run(de, [c.name for c in cfgs]) == alone
    assert all(len(v) == 16 for v in alone.values()) and len(alone) == 6
    de.pool.close()

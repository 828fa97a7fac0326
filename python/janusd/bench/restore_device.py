"""`janus bench restore-device`: H2D restore and D2H (leaving Active for Warm) on an
accelerator, against the raw copy speed of the same bytes on the same device, in the
same run (issue [L]; `janus bench restore` is the cpu-device version with its daemon).

For each size: a weight segment in a DevicePool of `--kind` (xTensor's VMM pages on
cuda), a page-locked host copy (engine/restore.host_buffer, as a Warm worker keeps it),
filled with random bytes; then, in turns (ABBA, medians):
- restore: engine/restore.Copier.copy (chunks, async on a copy stream), what
  DeviceEngine.restore_model runs; raw: one `dst.copy_(src)` of the same bytes on the
  current stream and a synchronize (`h2d_vs_memcpy` = raw time / restore time);
- the same both ways for D2H (`d2h_vs_memcpy`), what leaving Active for Warm moves;
- one pageable-host raw copy for reference (what a host copy that is not page-locked
  would give: why Warm pins).
The restored bytes are compared with the host copy after the last turn.
Then a demo model on a DeviceEngine of the same kind: first token of a request while the
model is Active, after a Warm -> Active restore, and after a Cold -> Active start
(checkpoint read into a new host copy, then H2D), medians of --model-repeats.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", default="cuda", choices=["cuda", "npu", "cpu"], help="device kind")
    p.add_argument("--device-index", type=int, default=0)
    p.add_argument("--sizes-mib", default="64,256,1024,4096", help="segment sizes (MiB)")
    p.add_argument("--repeats", type=int, default=5, help="turns per size and path (median)")
    p.add_argument("--streams", type=int, default=4, help="Copier streams (threads on cpu)")
    p.add_argument("--chunk-mib", type=int, default=64, help="Copier chunk size")
    p.add_argument("--model", default="demo:llama-small", help="checkpoint for the first-token part ('' skips)")
    p.add_argument("--model-repeats", type=int, default=5)


def _sync(kind: str) -> None:
    import torch

    if kind == "cuda":
        torch.cuda.synchronize()
    elif kind == "npu":
        torch.npu.synchronize()  # type: ignore[attr-defined]


def _timed(fn: Any, kind: str) -> float:
    _sync(kind)
    t0 = time.perf_counter()
    fn()
    _sync(kind)
    return time.perf_counter() - t0


def _copies(size: int, args: argparse.Namespace, pool: Any, copier: Any) -> dict[str, Any]:
    import torch

    from janusd.engine.restore import host_buffer

    seg = pool.alloc_weights("bench", size)
    try:
        dst = seg.tensor()[:size]
        host, pinned = host_buffer(size, args.kind)
        gen = torch.Generator().manual_seed(size)
        step = 64 << 20
        for a in range(0, size, step):
            n = min(step, size - a)
            host[a: a + n].copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen))
        back, _ = host_buffer(size, args.kind)
        pageable = torch.empty(size, dtype=torch.uint8)
        pageable.copy_(host)
        t: dict[str, list[float]] = {"restore": [], "raw_h2d": [], "d2h": [], "raw_d2h": []}
        copier.copy(dst, host)  # warm-up: the copy stream, the first touch of the mappings
        dst.copy_(host)
        for i in range(args.repeats):
            pair = [("restore", lambda: copier.copy(dst, host)), ("raw_h2d", lambda: dst.copy_(host))]
            pair2 = [("d2h", lambda: copier.copy(back, dst)), ("raw_d2h", lambda: back.copy_(dst))]
            for name, fn in (pair if i % 2 == 0 else pair[::-1]) + (pair2 if i % 2 == 0 else pair2[::-1]):
                t[name].append(_timed(fn, args.kind))
        pageable_s = _timed(lambda: dst.copy_(pageable), args.kind)
        copier.copy(dst, host)
        identical = bool(torch.equal(dst.cpu(), host))
        med = {k: statistics.median(v) for k, v in t.items()}
        gib = size / (1 << 30)
        return {
            "mib": size >> 20, "pinned": pinned, "identical": identical,
            "restore_s": med["restore"], "raw_h2d_s": med["raw_h2d"],
            "h2d_vs_memcpy": med["raw_h2d"] / med["restore"],
            "restore_gib_s": gib / med["restore"], "raw_h2d_gib_s": gib / med["raw_h2d"],
            "d2h_s": med["d2h"], "raw_d2h_s": med["raw_d2h"], "d2h_vs_memcpy": med["raw_d2h"] / med["d2h"],
            "pageable_h2d_gib_s": gib / pageable_s,
        }
    finally:
        del seg
        pool.free("bench")


def _first_token(args: argparse.Namespace) -> dict[str, Any]:
    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.restore import Copier
    from janusd.engine.types import SamplingParams

    cache = Path(tempfile.gettempdir()) / "janusd-bench-cache"
    mc, ec = ModelConfig(name="m", checkpoint=args.model, kv_cache_mib=64), EngineConfig()
    de = DeviceEngine(kind=args.kind, device_index=args.device_index, memory_bytes=1 << 30)
    copier = Copier(args.streams, args.chunk_mib << 20)
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompt = {"r": list(range(20, 52))}
    try:
        de.load_model(mc, ec, cache)
        ref = de.models["m"].generate(prompt, one)["r"][0].token_ids
        active, warm, cold, same = [], [], [], True
        for _ in range(args.model_repeats):
            active.append(_timed(lambda: de.models["m"].generate(prompt, one), args.kind))
            host, _ = de.release(de.detach("m"), copier, keep_host=True)
            assert host is not None  # keep_host: the D2H copy
            _sync(args.kind)
            t0 = time.perf_counter()
            de.register(de.restore_model(host, copier, {}))
            same &= de.models["m"].generate(prompt, one)["r"][0].token_ids == ref
            _sync(args.kind)
            warm.append(time.perf_counter() - t0)
            del host
            de.release(de.detach("m"), copier, keep_host=False)
            t0 = time.perf_counter()
            de.register(de.restore_model(de.stage_host_copy(mc, ec, cache), copier, {}))
            same &= de.models["m"].generate(prompt, one)["r"][0].token_ids == ref
            _sync(args.kind)
            cold.append(time.perf_counter() - t0)
        nbytes = de.models["m"].placement.plan.total_bytes  # type: ignore[attr-defined]
    finally:
        de.pool.close()
    return {"model": args.model, "weight_mib": round(nbytes / (1 << 20), 1), "same_tokens": same,
            "active_first_token_s": statistics.median(active), "warm_first_token_s": statistics.median(warm),
            "cold_first_token_s": statistics.median(cold)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from janusd.engine.device_engine import check_device_runtime
    from janusd.engine.restore import Copier
    from janusd.memory import DevicePool

    dev = check_device_runtime(args.kind, args.device_index)
    sizes = [int(s) << 20 for s in args.sizes_mib.split(",") if s.strip()]
    page = 2 << 20
    pool = DevicePool(args.kind, max(sizes) // page + 1, page, args.device_index, background=False)
    copier = Copier(args.streams, args.chunk_mib << 20)
    try:
        rows = [_copies(s, args, pool, copier) for s in sizes]
    finally:
        pool.close()
        copier.close()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
    out: dict[str, Any] = {"kind": args.kind, "device": name, "rows": rows}
    if args.model:
        out.update(_first_token(args))
    out["h2d_vs_memcpy"] = min(r["h2d_vs_memcpy"] for r in rows)
    out["d2h_vs_memcpy"] = min(r["d2h_vs_memcpy"] for r in rows)
    out["all_identical"] = all(r["identical"] for r in rows)
    return out

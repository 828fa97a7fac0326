"""The cpu device's peaks, measured once on this machine and cached.

A cpu "device" is one worker process with `threads` torch threads, so its peaks are what
that process can do: float32 matmul FLOP/s (the CPU engine runs float32) and memory read
bandwidth: bytes READ per second from a buffer larger than the caches, best of a sum and
a mat-vec, which is what a decode step does to its weights. (Version 1 of the cache held a
copy rate over 32 MiB, read + write bytes counted, ~30 GB/s here: a cache-resident figure
twice what a decode reaches, so a roofline on it put SmolLM2's 51.7 ms decode step at 18 ms,
bench/RESULTS.md "engine".) H2D stays a copy rate (`copy_bw`). Measured in a second or two, best of a few
repetitions (the machine is shared: the best run is the closest to the hardware), and
cached in CACHE_DIR/hw/cpu-peaks.json keyed by machine identity (host, CPU model, core
count) and thread count. A cache from another machine, or one that cannot be read, is
measured again and replaced, never trusted.

D2D on cpu is the Mooncake loopback TCP figure measured once here (DESIGN.md: about
1.2 GB/s warm); H2D is the copy bandwidth (host and device memory are the same memory).

The engine's host time per step (spec.py OVERHEAD_FIELDS) is measured on the real
engine, which hw/ must not import: a caller that may (`janus profile`, the daemon's
oracle helper) passes engine/step_probe.py's `measure` as `overhead_probe`; its figures
join the same cache entry, measured once. Without a probe the cached figures are used
when present, else 0 (the plain roofline).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from janusd.hw.spec import OVERHEAD_FIELDS, DeviceSpec

# (threads, {"peak_flops", "mem_bw"}) -> {OVERHEAD_FIELDS...}: engine/step_probe.py's measure
OverheadProbe = Callable[[int, dict[str, float]], dict[str, float]]

CACHE_VERSION = 2  # 2: mem_bw is a read rate from DRAM (module doc), copy_bw added
READ_BYTES = 128 * 2**20  # larger than a VM's reported L3 share, as a decode's weights are
CPU_D2D_BW = 1.2e9  # Mooncake TransferEngine over loopback TCP (DESIGN.md, "Checked to work")
# a tp group's collectives on cpu devices: gloo over loopback tcp, per message hop (hw/spec.py
# tp_comm_s). Measured on this VM (2026-12-07, 2 processes, one thread each, load ~3 on 2 cores,
# medians of 350): an all-reduce of 256 floats 0.61 ms (a ring of 2 hops at tp 2), of 6144
# floats 0.82 ms, a broadcast of 256 ints 0.27 ms (1 hop): the wake-ups, not the bytes
CPU_LINK_LATENCY_S = 3.0e-4
DEFAULT_CACHE_DIR = Path("~/.cache/janusd")


def machine_identity() -> dict[str, Any]:
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"host": platform.node(), "cpu": model, "cores": os.cpu_count() or 1, "machine": platform.machine()}


def read_bandwidth(nbytes: int = READ_BYTES, reps: int = 5) -> float:
    """Bytes READ per second with the current torch threads, best of a float32 sum and a
    float32 mat-vec over `nbytes`, `reps` times each.

    A decode step only reads its weights, and memcpy's rate (each byte read AND written)
    is about half of what reads alone reach, so a roofline from memcpy would be ~2x too
    slow. One owner: the peaks here and `janus bench engine` both use it."""
    import torch
    import torch.nn.functional as F

    w = torch.ones(nbytes // 4 // 4096, 4096)
    x = torch.ones(1, 4096)
    best = float("inf")
    for _ in range(reps):
        for op in (w.sum, lambda: F.linear(x, w)):
            t0 = time.perf_counter()
            op()
            best = min(best, time.perf_counter() - t0)
    return w.numel() * 4 / best


def measure(threads: int = 1, seconds: float = 0.3) -> dict[str, float]:
    """{peak_flops, mem_bw (read), copy_bw} of `threads` torch threads on this machine, now."""
    import numpy as np
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = 512
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)  # warm
        best_flops = 0.0
        for _ in range(5):
            reps, t0 = 0, time.perf_counter()
            while (dt := time.perf_counter() - t0) < seconds / 5:
                torch.mm(a, b)
                reps += 1
            best_flops = max(best_flops, 2.0 * n**3 * reps / dt)
        best_read = read_bandwidth(READ_BYTES, reps=4)
    finally:
        torch.set_num_threads(old)
    src = np.ones(32 * 2**20 // 8)
    dst = np.empty_like(src)
    best_copy = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best_copy = max(best_copy, 2.0 * src.nbytes / (time.perf_counter() - t0))
    return {"peak_flops": best_flops, "mem_bw": best_read, "copy_bw": best_copy}


def _has_overheads(entry: dict[str, Any]) -> bool:
    return all(isinstance(entry.get(k), float) and entry[k] >= 0 for k in OVERHEAD_FIELDS)


def cached_peaks(cache_dir: Path | None, threads: int = 1, overhead_probe: OverheadProbe | None = None
                 ) -> dict[str, float]:
    """The cached peaks for this machine and thread count; measured and stored if absent.
    With an overhead_probe, the host time per step too (module doc)."""
    path = (cache_dir or DEFAULT_CACHE_DIR).expanduser() / "hw" / "cpu-peaks.json"
    ident = machine_identity()
    key = str(threads)
    data: dict[str, Any] = {}
    peaks: dict[str, float] | None = None
    try:
        data = json.loads(path.read_text())
        if not (isinstance(data, dict) and data.get("version") == CACHE_VERSION and data.get("machine") == ident):
            data = {}
        hit = data.get("threads", {}).get(key)
        if isinstance(hit, dict) and all(isinstance(hit.get(k), float) and hit[k] > 0 for k in ("peak_flops", "mem_bw")):
            if overhead_probe is None or _has_overheads(hit):
                return hit
            peaks = {k: hit[k] for k in ("peak_flops", "mem_bw", "copy_bw") if k in hit}  # only the probe is missing
    except (OSError, ValueError, AttributeError):
        data = {}
    if peaks is None:
        peaks = measure(threads)
    if overhead_probe is not None:
        over = overhead_probe(threads, peaks)
        peaks = {**peaks, **{k: float(over[k]) for k in OVERHEAD_FIELDS}}
    data = {"version": CACHE_VERSION, "machine": ident, "threads": {**data.get("threads", {}), key: peaks}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache costs a measurement next time, nothing else
    return peaks


def cpu_spec(cache_dir: Path | None, hbm_bytes: float, threads: int = 1,
             overhead_probe: OverheadProbe | None = None) -> DeviceSpec:
    p = cached_peaks(cache_dir, threads, overhead_probe)
    over = {k: float(p.get(k, 0.0)) for k in OVERHEAD_FIELDS}
    return DeviceSpec(name="cpu", hbm_bytes=float(hbm_bytes), peak_flops=p["peak_flops"], hbm_bw=p["mem_bw"],
                      d2d_bw=CPU_D2D_BW, h2d_bw=p.get("copy_bw", p["mem_bw"]), link_latency_s=CPU_LINK_LATENCY_S,
                      source=f"measured on {machine_identity()['cpu'] or 'this cpu'}, {threads} thread(s)"
                             + ("" if _has_overheads(p) else "; no host time per step measured"), **over)

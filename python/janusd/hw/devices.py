"""Device presets, one per device kind, and the lookup by name (`device_spec`); the spec
itself is spec.py's DeviceSpec.

Sources of the presets:
- h100: NVIDIA H100 Tensor Core GPU datasheet, SXM5 column: 80 GB HBM3, 3.35 TB/s,
  BF16 Tensor Core 1,979 TFLOP/s *with sparsity*, i.e. 989.5 dense; NVLink 4 900 GB/s
  total = 450 GB/s per direction; host link PCIe Gen5 x16, 64 GB/s per direction.
- h200: NVIDIA H200 datasheet, SXM column: 141 GB HBM3e, 4.8 TB/s; same Hopper compute
  and links as the H100 SXM (989.5 dense BF16 TFLOP/s, 450 GB/s NVLink per direction,
  PCIe Gen5 64 GB/s).
- ascend-910c-die: one of the two dies of an Ascend 910C. Per chip as reported for
  CloudMatrix384 (Zuo et al., "Serving Large Language Models on Huawei CloudMatrix384",
  arXiv 2506.12708, 2025): 752 dense BF16 TFLOP/s, 128 GB HBM at 3.2 TB/s, so per die
  376 TFLOP/s, 64 GB, 1.6 TB/s. Links: the Janus paper's measured 163.6 GB/s D2D per
  device and 59.0 GB/s H2D (PAPER.md §8).
- cpu: peaks measured on this machine (cpu_peaks.py); the HBM figure is the configured
  page pool of one virtual device (`devices.memory_mib`), passed in by the caller; the link
  latency is gloo's over loopback tcp, measured here (cpu_peaks.py CPU_LINK_LATENCY_S).
- link latency of the accelerator presets: estimates (NVLINK_HOP_S, UB_HOP_S below).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from janusd.hw.cpu_peaks import cpu_spec
from janusd.hw.spec import OVERHEAD_FIELDS, DeviceSpec

__all__ = ["ACCEL_OVERHEADS", "DEFAULT_FOR_KIND", "DEVICE_NAMES", "OVERHEAD_FIELDS", "PRESETS", "DeviceSpec",
           "device_spec"]  # DeviceSpec and OVERHEAD_FIELDS are spec.py's, named here for the presets' users

_GB = 1e9
_TF = 1e12

# Host time per step of our eager-mode engine on an accelerator (no CUDA graphs): an
# ESTIMATE, not a measurement. Per layer, the forward issues about 30 kernels (norms,
# fused qkv, rope, attention gather + SDPA, o-proj, gated MLP, residuals:
# engine/models/llama.py) at ~5 us of host launch path each (the order NVIDIA's CUDA
# Graphs material and TaxBreak, arXiv 2603.12465, report for H100/H200 eager launches):
# 0.15 ms per layer; ~1 ms per step of scheduling, metadata upload and the logits'
# device-to-host copy for sampling; ~20 us per sequence of Python bookkeeping (the CPU
# engine's measured per-sequence cost is ~100 us on a slow VM core); no per prompt token
# cost (a prefill's rows run in one kernel per op on an accelerator). Replace by a
# profile's measurement when one exists.
ACCEL_OVERHEADS = {"step_overhead_s": 1e-3, "layer_overhead_s": 1.5e-4, "seq_overhead_s": 2e-5,
                   "prefill_token_overhead_s": 0.0}

# Latency per message hop of a collective over the device link (DeviceSpec.link_latency_s,
# hw/spec.py tp_comm_s): ESTIMATES, not measurements (no accelerator was lent to measure).
# NVLink 4 through NVSwitch: ~1 us a hop, so a small all-reduce of 8 GPUs (a ring of 14 hops)
# costs ~14 us, the order small-message NCCL all-reduces are commonly reported at on one
# 8-GPU H100 node (nccl-tests all_reduce_perf at 8 B; NCCL's tree and NVLS algorithms do
# better at large counts, which the ring form overstates). Ascend's UB through HCCL: 2 us a
# hop, twice NVLink's (no published small-message figure found; CloudMatrix384's paper
# reports bandwidth, not this). A `janus bench tp` on the device measures the real one.
NVLINK_HOP_S = 1e-6
UB_HOP_S = 2e-6

PRESETS: dict[str, DeviceSpec] = {
    "h100": DeviceSpec(name="h100", hbm_bytes=80 * _GB, peak_flops=989.5 * _TF, hbm_bw=3350 * _GB,
                       d2d_bw=450 * _GB, h2d_bw=64 * _GB, source="NVIDIA H100 SXM5 datasheet", **ACCEL_OVERHEADS,
                       link_latency_s=NVLINK_HOP_S),
    "h200": DeviceSpec(name="h200", hbm_bytes=141 * _GB, peak_flops=989.5 * _TF, hbm_bw=4800 * _GB,
                       d2d_bw=450 * _GB, h2d_bw=64 * _GB, source="NVIDIA H200 SXM datasheet", **ACCEL_OVERHEADS,
                       link_latency_s=NVLINK_HOP_S),
    "ascend-910c-die": DeviceSpec(name="ascend-910c-die", hbm_bytes=64 * _GB, peak_flops=376 * _TF,
                                  hbm_bw=1600 * _GB, d2d_bw=163.6 * _GB, h2d_bw=59.0 * _GB,
                                  source="CloudMatrix384 paper (per chip / 2); links: Janus paper §8",
                                  **ACCEL_OVERHEADS, link_latency_s=UB_HOP_S),
}
DEVICE_NAMES = ("cpu", *PRESETS)
# The preset a device kind of the engine gets when none is named.
DEFAULT_FOR_KIND = {"cpu": "cpu", "cuda": "h100", "npu": "ascend-910c-die"}


def device_spec(name: str, *, hbm_bytes: float | None = None, cache_dir: Path | None = None,
                overhead_probe: Any = None) -> DeviceSpec:
    """The spec of a named device. `hbm_bytes` overrides the memory figure (required
    meaning for cpu: the virtual device's pool). For cpu the peaks are measured once and
    cached under `cache_dir` (cpu_peaks.py), and the host time per step with them when
    an `overhead_probe` (engine/step_probe.py's measure) is given. ValueError for an
    unknown name."""
    if name == "cpu":
        spec = cpu_spec(cache_dir, hbm_bytes if hbm_bytes is not None else 1024 * 2**20,
                        overhead_probe=overhead_probe)
    elif name in PRESETS:
        spec = PRESETS[name]
        if hbm_bytes is not None:
            spec = msgspec.structs.replace(spec, hbm_bytes=float(hbm_bytes))
    else:
        raise ValueError(f"unknown device {name!r} (known: {', '.join(DEVICE_NAMES)})")
    spec.check()
    return spec

"""DeviceSpec: the figures a roofline needs of one device (HBM capacity, peak compute, HBM
bandwidth, device-to-device and host-to-device link bandwidth) and the host time per
engine step, and the ring all-reduce a tensor-parallel group's step pays over its link
(allreduce_s). Its own module because both the presets (devices.py) and the cpu device's
measurement (cpu_peaks.py) build one: each imports this, neither the other's importer.

Collectives of a tensor-parallel group (tp_comm_s): a latency per message hop
(`link_latency_s`, alpha) plus bytes over the link (`d2d_bw`), alpha-beta.

Units: bytes and bytes per second (decimal, as vendors quote them), FLOP/s. Peaks are
dense (no structured sparsity) in the device's serving dtype (bf16; float32 on cpu, which
is what our CPU engine runs). Link figures are one direction, per device.

Host time per engine step (the roofline's blind spot): a step also costs time that no
FLOP or byte explains: the engine's scheduling, sampling and bookkeeping (`step_overhead_s`),
the op dispatch of every decoder layer (`layer_overhead_s`: Python and framework work per
op, a kernel launch on an accelerator) and per-sequence work (`seq_overhead_s`: a row's
sampling, detokenization, block tables). step_time_floor() adds them up. A prefill also
pays per prompt token per layer (`prefill_token_overhead_s`: what a row costs beyond its
counted FLOPs: the attention kernel, norms, RoPE, the KV cache write; prefill_time_floor()).
On this VM it is small, ~5 us per token-layer (a prefill's GEMMs run at about the 512^3
matmul peak the cpu's peak_flops comes from: engine/step_probe.py). On a CPU they
dominate small models (a 4-layer demo model decodes in ~1.7 ms where its roofline is
~0.4 ms: bench/RESULTS.md "engine"), so without them a roofline predicts no load ever
hurts. cpu: measured once per machine on the real engine (engine/step_probe.py, cached
with the peaks). Accelerator presets: estimates for our eager-mode engine, not
measurements (devices.py ACCEL_OVERHEADS says how they were set); a `janus profile` on the
device measures the real figures (its points keep the spec they were measured against).
A spec with all three at 0 is the plain roofline (profiles written before these fields).
"""

from __future__ import annotations

import math

import msgspec

def allreduce_s(nbytes: float, tp: int, link_bw: float) -> float:
    """Seconds a tp-device group takes to move `nbytes` per device through a ring
    all-reduce over links of `link_bw` bytes/s per direction (DeviceSpec.d2d_bw: the
    device-to-device link, NVLink or the supernode's UB): each device sends and receives
    2 (tp - 1) / tp of the buffer (Patarasuk and Yuan 2009). The bandwidth term only;
    tp_comm_s adds the per-message latency. 0.0 exactly at tp 1."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (tp - 1) / tp * nbytes / link_bw


OVERHEAD_FIELDS = ("step_overhead_s", "layer_overhead_s", "seq_overhead_s", "prefill_token_overhead_s")


class DeviceSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    hbm_bytes: float  # memory one device offers to models
    peak_flops: float  # dense FLOP/s in the serving dtype
    hbm_bw: float  # bytes/s between device memory and compute
    d2d_bw: float  # bytes/s, device to device, one direction
    h2d_bw: float  # bytes/s, pinned host memory to device
    source: str  # where the figures come from (shown by tools, stored in profiles)
    step_overhead_s: float = 0.0  # host seconds per engine step, whatever it runs (module doc)
    layer_overhead_s: float = 0.0  # host seconds per decoder layer per step
    seq_overhead_s: float = 0.0  # host seconds per sequence in a step
    prefill_token_overhead_s: float = 0.0  # host seconds per prompt token per decoder layer of a prefill
    # seconds per message of one hop of a collective over the device link (the alpha of the
    # alpha-beta model; tp_comm_s): what a small all-reduce costs whatever its bytes
    link_latency_s: float = 0.0

    def check(self) -> None:
        """ValueError naming the field unless every peak is finite and > 0 and every
        overhead finite and >= 0."""
        for f in ("hbm_bytes", "peak_flops", "hbm_bw", "d2d_bw", "h2d_bw"):
            v = getattr(self, f)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"device spec {self.name!r}: {f} must be a finite number > 0, got {v!r}")
        for f in (*OVERHEAD_FIELDS, "link_latency_s"):
            v = getattr(self, f)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"device spec {self.name!r}: {f} must be a finite number >= 0, got {v!r}")

    @property
    def host_is_device(self) -> bool:
        """The host's work per step runs on the cores that compute (a cpu device): another
        model's steps wait for it, so it counts in the device's compute share; on an
        accelerator it overlaps other workers' kernels."""
        return self.name == "cpu"

    def step_time_floor(self, layers: int, batch: float) -> float:
        """Seconds one engine step of a `layers`-layer model over `batch` sequences costs
        besides its FLOPs and bytes (module doc)."""
        return self.step_overhead_s + layers * self.layer_overhead_s + max(batch, 0.0) * self.seq_overhead_s

    def prefill_time_floor(self, layers: int, tokens: float) -> float:
        """Seconds a prefill of `tokens` prompt tokens (one sequence, one step) costs besides
        its FLOPs and bytes (module doc)."""
        return self.step_time_floor(layers, 1.0) + layers * max(tokens, 0.0) * self.prefill_token_overhead_s


def tp_comm_s(device: DeviceSpec, tp: int, nbytes: float, collectives: float) -> float:
    """Seconds one step of a tp-device group spends in its `collectives` collectives
    moving `nbytes` per device (alpha-beta: Hockney's model of a message): each collective
    a ring of 2 (tp - 1) hops paying DeviceSpec.link_latency_s each, plus the bytes over the
    link (allreduce_s). The latency is most of a decode step's communication: a step
    all-reduces a few KB per layer (on cpu gloo over loopback a bare all-reduce of one
    step's rows costs ~0.5-1.3 ms whatever its bytes: `janus bench tp`). 0.0 exactly at
    tp 1 or with nothing to move. The one formula the oracle's prior (oracle/prior.py) and
    the simulator's performance model (sim/perfmodel.py) both charge."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    return collectives * 2.0 * (tp - 1) * device.link_latency_s + allreduce_s(nbytes, tp, device.d2d_bw)

"""The simulator's performance model: how long a device step takes, how much KV fits.

A device runs engine steps. One step does, for each model resident on the device that
has work, the prefill of the prompts it admits this step plus one decode token for every
sequence it is decoding (continuous batching, prefill mixed with decode). The step time
is a roofline over everything the step does on the device:

    step_s = overhead_s + seq_overhead_s x sequences
             + max(sum FLOPs / (peak_flops x compute_eff), sum bytes / (hbm_bw x bandwidth_eff))

Summing over co-located models is the sharing: their kernels interleave on one device
(PAPER.md §7: one stream per model, compute and bandwidth shared, no isolation), so a
busy neighbour slows every model on the device. Per model and step: FLOPs = 2 x active
parameters x (prompt tokens + decoding sequences) + attention over the context; bytes =
the weights once + the KV read (every context token) and written. An instance of tp
devices splits both evenly and its step adds its collectives over the device link (comm_s:
hw/spec.py tp_comm_s, a latency per message hop, DeviceSpec.link_latency_s, and the ring
all-reduce of its tokens' rows over DeviceSpec.d2d_bw at the link's full rate: no
efficiency), the same term the oracle's prior charges (oracle/prior.py).
The step of a device group is one worker's (sim/cluster.py): the control room keeps a
group's devices to the instances of that group (control/groups.py).

KV capacity: HBM x usable_frac minus every resident's weight shard, in 2 MiB pages (the
xTensor page), one pool that every resident draws from as its requests need it (xTensor,
PAPER.md §7: the engine's models on a device share one page pool, engine/scheduler.py);
a sequence holds its prompt plus its output tokens (the engine reserves them as it
admits, so nothing is preempted). Until 2026-12-03 the pool was split evenly between the
residents, which left a busy model beside three quiet ones a quarter of the pages.

The efficiencies and overhead default to typical serving figures (about 60% of peak
FLOP/s in prefill-heavy steps, 80% of HBM bandwidth in decode, 5 ms of fixed launch and
scheduling cost per step, no per-sequence cost); sim/calibrate.py fits all four to an
engine's measured step times. `seq_overhead_s` is the host's work per sequence in a step
(sampling, scheduler and output bookkeeping): small beside an accelerator's step, it is
most of a small model's decode step on the cpu engine (bench/RESULTS.md "engine":
demo:llama-small decodes 1 sequence in 1.7 ms and 32 in 6.5 ms).
"""

from __future__ import annotations

from dataclasses import dataclass

from janusd.hw.devices import DeviceSpec
from janusd.hw.spec import tp_comm_s
from janusd.sim.specs import SimModel

PAGE_BYTES = 2 * 2**20


@dataclass(frozen=True)
class PerfModel:
    device: DeviceSpec
    overhead_s: float = 0.005
    seq_overhead_s: float = 0.0  # per sequence (prefilling or decoding) in a step
    compute_eff: float = 0.6
    bandwidth_eff: float = 0.8
    usable_frac: float = 0.9  # of HBM, the rest for activations and the runtime

    def __post_init__(self) -> None:
        for f in ("overhead_s", "seq_overhead_s", "compute_eff", "bandwidth_eff", "usable_frac"):
            v = getattr(self, f)
            if not (v >= 0 and (f.endswith("overhead_s") or 0 < v <= 1)):
                raise ValueError(f"perf model: {f} = {v!r} out of range")

    # ---- work of one model in one step, per device of its instance
    @staticmethod
    def work(m: SimModel, prefill_tokens: float, prefill_pairs: float, decode_batch: float,
             decode_context: float) -> tuple[float, float]:
        """(FLOPs, bytes) per device: `prefill_tokens` new prompt tokens whose attention
        covers `prefill_pairs` (token, context) pairs, and one token for each of
        `decode_batch` sequences holding `decode_context` tokens in all."""
        if prefill_tokens <= 0 and decode_batch <= 0:
            return 0.0, 0.0
        flops = (m.matmul_flops_per_token * (prefill_tokens + decode_batch)
                 + m.attn_flops_per_ctx * (prefill_pairs + decode_context))
        nbytes = m.weight_bytes + m.kv_bytes_per_token * (decode_context + decode_batch + prefill_tokens)
        return flops / m.tp, nbytes / m.tp

    def comm_s(self, m: SimModel, tokens: float) -> float:
        """Seconds of the all-reduces of a step of `m` carrying `tokens` tokens (prompt
        tokens + decoding sequences); 0.0 at tp 1 (module doc)."""
        if m.tp <= 1 or tokens <= 0:
            return 0.0
        return tp_comm_s(self.device, m.tp, tokens * m.allreduce_bytes_per_token, m.collectives_per_step)

    def step_s(self, flops: float, nbytes: float, seqs: int = 0) -> float:
        """One device step doing `flops` and moving `nbytes` for `seqs` sequences (all its
        models together)."""
        if flops <= 0 and nbytes <= 0:
            return 0.0
        return self.overhead_s + self.seq_overhead_s * seqs + max(
            flops / (self.device.peak_flops * self.compute_eff), nbytes / (self.device.hbm_bw * self.bandwidth_eff))

    # ---- convenience for one model alone on its devices
    def prefill_s(self, m: SimModel, tokens: int) -> float:
        """A step prefilling one prompt of `tokens` tokens and nothing else."""
        return self.step_s(*self.work(m, tokens, tokens * (tokens + 1) / 2.0, 0, 0), 1) + self.comm_s(m, tokens)

    def decode_step_s(self, m: SimModel, batch: int, context_per_seq: float) -> float:
        """A decode step of `batch` sequences of `context_per_seq` tokens each."""
        return self.step_s(*self.work(m, 0, 0, batch, batch * context_per_seq), batch) + self.comm_s(m, batch)

    # ---- memory
    def weights_fit(self, residents: list[SimModel]) -> bool:
        """Whether the weight shards of these co-located models fit in usable HBM, with at
        least one KV page left per model."""
        return self.kv_pool_pages(residents) >= max(1, len(residents))

    def kv_pool_pages(self, residents: list[SimModel]) -> int:
        """KV pages of a device holding these models' weight shards: one pool all of them
        draw from (xTensor, PAPER.md §7; engine/scheduler.py's shared pool)."""
        if not residents:
            return 0
        usable = self.device.hbm_bytes * self.usable_frac
        weights = sum(m.weight_bytes / m.tp for m in residents)
        return max(0, int((usable - weights) // PAGE_BYTES))

    def kv_pool_bytes(self, residents: list[SimModel]) -> int:
        return self.kv_pool_pages(residents) * PAGE_BYTES

    def kv_capacity_tokens(self, m: SimModel, residents: list[SimModel]) -> int:
        """Tokens of KV `m` can hold on a device shared with `residents` (m included) when
        it has the whole pool to itself (the others hold no KV)."""
        return int(self.kv_pool_bytes(residents) // self.kv_token_bytes(m))

    @staticmethod
    def kv_token_bytes(m: SimModel) -> float:
        """KV bytes one token of `m` takes on each device of its instance."""
        return m.kv_bytes_per_token / m.tp

    def load_s(self, m: SimModel, link_bw: float) -> float:
        """Seconds to move one device's weight shard over a link of `link_bw` bytes/s."""
        return m.weight_bytes / m.tp / link_bw

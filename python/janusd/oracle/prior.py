"""The roofline prior: predictions from the model config and the device spec alone.

Used for a model with no profile (and shown as source "prior"); `janus oracle eval`
reports its error beside the GPs'. Pure arithmetic, no fitting.

Time of work on one device (hw/model_spec.py counts, hw/devices.py peaks): a piece of
work takes max(FLOPs / peak FLOP/s, bytes / peak bandwidth), and every engine step adds
the device's host time per step (DeviceSpec.step_time_floor: a fixed part, a part per
decoder layer, a part per sequence in the step), and a prefill its host time per prompt
token per layer (DeviceSpec.prefill_time_floor). Without those terms the prior saw no
cost in a CPU step of a small model beyond its few FLOPs and predicted attainment ~1.0
at any load (bench/RESULTS.md "oracle").
- prefill of a mean prompt: t_pf = prefill floor + roofline(prefill_flops(L),
  prefill_bytes(L)), with the causal attention term taken at E[L^2] = mean^2 + var;
- decode: the mean number of sequences decoding B solves B = (rate / m) * out_mean *
  t_step(B) (Little's law), t_step(B) = roofline of one step of B sequences at the mean
  context (iterated from B = 1; capped when it diverges: overload).
Capacity of one instance carrying the load z:
- compute = (rate * FLOPs per request) / peak, plus, on a cpu device (where the engine's
  host time per step runs on the very cores that compute: DeviceSpec.host_is_device), the
  share of time that host work takes: rate * prefill host time + decode steps per second
  * host time per step. Without it two bursty demo models were packed on one cpu device
  as if free ("Phi 0.0001") and shared its cores at their bursts;
- bandwidth = (decode steps per second * bytes per step + prefill bytes per second) /
  peak bandwidth, with steps per second = P(some sequence decodes) / t_step, P = 1 -
  exp(-B) (M/G/inf occupancy);
- HBM = (weights + KV of the requests in flight, by Little's law: rate * (t_pf + out_mean
  * t_step) requests of in_mean + out_mean tokens) / device memory.
Attainment with m instances: a pressure rho = max(time share, SLO share), time share =
(rate / m) * (t_pf + out_mean * t_tok), t_tok the compute time of one decode token at the
mean context plus its per-sequence host time (the device time the load asks for, per
second; decode batching shares the weight reads and the per-step host time, not the
FLOPs or a row's own host work), SLO share = max(t_pf / TTFT, t_step(B) / TPOT) (B diverges
as decode saturates, and t_step with it); attainment = 1 / (1 + exp(
STEEPNESS * (rho - 1))), i.e. 0.5 at full pressure. Every term falls as m grows, so the
prior is non-decreasing in m by construction.

Tensor parallelism (`tp` = N devices per instance, [P]): the figures are one shard's, on
one device of the group: FLOPs, weight and KV bytes divided by N (Megatron-style sharding
splits every linear layer and the KV heads evenly: engine/tp/), plus the collectives a
step pays over the device-to-device link (hw/spec.py tp_comm_s: ModelSpec.
tp_collectives_per_step messages at DeviceSpec.link_latency_s a hop, and
ModelSpec.allreduce_bytes_per_token per token the step carries over DeviceSpec.d2d_bw),
added to t_pf, t_step and t_tok. The host time per step is not divided (every shard's host does its
own). The capacity vector is one device's (each of the group's N devices carries it: the
control room places the group whole, control/groups.py); the all-reduce takes link time,
none of the three dimensions. sim/perfmodel.py charges the same division and the same
all-reduce term, so the simulator's controller plans with its own performance model.
At tp 1 every figure is the one without this paragraph (the all-reduce is 0.0 exactly).
"""

from __future__ import annotations

import math

import numpy as np

from janusd.hw.devices import DeviceSpec
from janusd.hw.model_spec import ModelSpec
from janusd.hw.spec import tp_comm_s
from janusd.oracle.types import AttainmentEstimate, LoadFeatures, ResourceEstimate

STEEPNESS = 10.0
_B_CAP = 1e6


class RooflinePrior:
    # every term of the pressure falls as m grows and std is 0, so the raw attainment is
    # non-decreasing in m: elasticity.min_instances may search single counts (module doc there)
    monotone_in_m = True

    def __init__(self, model: ModelSpec, device: DeviceSpec, ttft_slo_s: float, tpot_slo_s: float,
                 tp: int = 1) -> None:
        if not (ttft_slo_s > 0 and tpot_slo_s > 0):
            raise ValueError("SLOs must be > 0")
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be an integer >= 1, got {tp!r}")
        self.tp = tp
        self.model = model
        self.device = device
        self.ttft_slo_s = float(ttft_slo_s)
        self.tpot_slo_s = float(tpot_slo_s)

    def _roof(self, flops: float, nbytes: float) -> float:
        """One shard's roofline time of whole-model work (module doc: divided by tp)."""
        return max(flops / self.tp / self.device.peak_flops, nbytes / self.tp / self.device.hbm_bw)

    def _comm(self, tokens: float) -> float:
        """Collective seconds of a step carrying `tokens` tokens (0.0 at tp 1)."""
        return tp_comm_s(self.device, self.tp, tokens * self.model.allreduce_bytes_per_token,
                         self.model.tp_collectives_per_step)

    def _floor(self, batch: float) -> float:
        """Host seconds of one step over `batch` sequences (hw/devices.py)."""
        return self.device.step_time_floor(self.model.layers, batch)

    def _prefill(self, z: LoadFeatures) -> tuple[float, float, float]:
        """(seconds, FLOPs, bytes) of one mean prefill."""
        L, var = z.input_len_mean, z.input_len_var
        s = self.model
        flops = s.prefill_flops(L) + s.attn_flops_per_ctx * var / 2.0  # causal pairs at E[L^2]
        nbytes = s.prefill_bytes(L)
        return self.device.prefill_time_floor(s.layers, L) + self._roof(flops, nbytes) + self._comm(L), flops, nbytes

    def _ctx(self, z: LoadFeatures) -> float:
        return z.input_len_mean + z.output_len_mean / 2.0

    def _step(self, batch: float, z: LoadFeatures) -> float:
        return self.decode_step_s(max(batch, 1.0), self._ctx(z))

    def decode_step_s(self, batch: float, context: float) -> float:
        """Seconds of one decode step of `batch` sequences holding `context` tokens each:
        host time, one shard's roofline and the group's collectives (`janus bench tp` sets
        it beside its measured step: tests/test_tp_comm_prior.py)."""
        b = batch
        return self._floor(b) + self._roof(self.model.decode_step_flops(b, b * context),
                                           self.model.decode_step_bytes(b, b * context)) + self._comm(b)

    def comm_s(self, tokens: float) -> float:
        """The collectives' seconds of a step carrying `tokens` tokens (0.0 at tp 1)."""
        return self._comm(tokens)

    def _decode(self, rate: float, z: LoadFeatures) -> tuple[float, float]:
        """(B, t_step): mean decoding sequences and step time at that batch (module doc)."""
        demand = rate * z.output_len_mean
        b = demand * self._step(1.0, z)
        for _ in range(50):
            nb = demand * self._step(b, z)
            if nb > _B_CAP:
                return _B_CAP, self._step(_B_CAP, z)
            if abs(nb - b) <= 1e-9 * max(1.0, b):
                b = nb
                break
            b = nb
        return b, self._step(b, z)

    # ---- capacity
    def capacity(self, model: str, load: LoadFeatures) -> ResourceEstimate:
        z, s, d = load, self.model, self.device
        t_pf, pf_flops, pf_bytes = self._prefill(z)
        b, t_step = self._decode(z.request_rate, z)
        ctx = self._ctx(z)
        dec_flops = z.output_len_mean * (2.0 * s.matmul_params + s.attn_flops_per_ctx * ctx)
        compute = z.request_rate * (pf_flops + dec_flops) / self.tp / d.peak_flops
        steps = (1.0 - math.exp(-b)) / t_step if t_step > 0 else 0.0
        if d.host_is_device:  # the engine's host time runs on the cores that compute (module doc)
            compute += z.request_rate * d.prefill_time_floor(s.layers, z.input_len_mean) + steps * self._floor(b)
        bw = (steps * s.decode_step_bytes(b, b * ctx) + z.request_rate * pf_bytes) / self.tp / d.hbm_bw
        in_flight = z.request_rate * (t_pf + z.output_len_mean * t_step)
        kv = in_flight * (z.input_len_mean + z.output_len_mean) * s.kv_bytes_per_token
        hbm = (s.weight_bytes + kv) / self.tp / d.hbm_bytes
        return ResourceEstimate((hbm, compute, bw), (0.0, 0.0, 0.0), "prior")

    # ---- attainment
    def pressure(self, load: LoadFeatures, instances: int) -> float:
        z = load
        rate = z.request_rate / instances
        t_pf = self._prefill(z)[0]
        b, t_step = self._decode(rate, z)
        s = self.model
        t_tok = ((2.0 * s.matmul_params + s.attn_flops_per_ctx * self._ctx(z)) / self.tp
                 / self.device.peak_flops + self.device.seq_overhead_s + self._comm(1.0))
        time_share = rate * (t_pf + z.output_len_mean * t_tok)
        slo_share = max(t_pf / self.ttft_slo_s, t_step / self.tpot_slo_s)
        return max(time_share, slo_share)

    def prefill_stall(self, load: LoadFeatures, instances: int) -> float:
        """How hard prefills press on the TPOT of the tokens decoding beside them (not a term
        of the pressure above; the oracle's "interference" calibration learns its weight):
        the share of time one instance spends in prefills, (rate / m) * t_pf, times the share
        of a token's TPOT budget one prefill takes, t_pf / TPOT. A decode step waits for the
        prefill scheduled before it, so long prompts at a moderate rate miss TPOT where the
        time share says there is room (bench/RESULTS.md "oracle", 2026-12-06)."""
        t_pf = self._prefill(load)[0]
        return load.request_rate / instances * t_pf * t_pf / self.tpot_slo_s

    def raw_attainment(self, load: LoadFeatures, instances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rho = np.array([self.pressure(load, int(m)) for m in instances], dtype=np.float64)
        mean = 1.0 / (1.0 + np.exp(np.clip(STEEPNESS * (rho - 1.0), -700, 700)))
        return mean, np.zeros_like(mean)

    def attainment(self, model: str, load: LoadFeatures, instances: int) -> AttainmentEstimate:
        mean, std = self.raw_attainment(load, np.array([instances]))
        return AttainmentEstimate(float(mean[0]), float(std[0]), "prior")

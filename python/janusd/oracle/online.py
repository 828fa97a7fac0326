"""Online training points from the daemon's own telemetry, kept bounded (pure).

Every sample period the daemon turns each model's telemetry window into one point:
- load features: LoadFeatures.from_window (telemetry's rules);
- m: the model's Active instances;
- attainment: the window's tokens on time / tokens counted (requests that ended in it);
- HBM per instance: the weights (from the model config) plus the KV in use (the workers'
  KV usage fraction x the model's KV region), over the device's memory;
- compute per instance: FLOPs of the window's prompt tokens (arrival rate) and delivered
  output tokens, counted from the model config at the window's mean lengths, over peak;
- bandwidth per instance: decode steps per second (delivered tokens per instance / the
  sequences decoding per instance, at least 1) x the weight bytes, plus the KV each
  delivered token reads at the mean context, over peak bandwidth. An approximation (the
  profile measures step times; a window only has counts), documented as such.
- on a device whose host work runs on the cores that compute (DeviceSpec.host_is_device:
  cpu), compute adds the engine's host seconds per second the prior counts (oracle/prior.py):
  a prefill's floor per request plus a step's floor per decode step. Without it the GP,
  once fitted, would see the small models as nearly free again where the prior does not.
A point needs traffic: no counted tokens or no Active instance, no point. The buffer of
a model keeps the newest `max_points` (the oldest go first: the load the model sees now
matters more than last week's) and says when a refit is due.
"""

from __future__ import annotations

import numpy as np

from janusd.hw.devices import DeviceSpec
from janusd.hw.model_spec import ModelSpec
from janusd.oracle.dataset import Points
from janusd.oracle.features import window_attainment
from janusd.oracle.types import LoadFeatures
from janusd.telemetry.telemetry import ModelWindow


def window_usage(w: ModelWindow, instances: int, spec: ModelSpec, device: DeviceSpec, kv_used_bytes: float
                 ) -> tuple[float, float, float]:
    """(hbm, compute, bandwidth) per instance as fractions of the device (module doc)."""
    m = max(1, instances)
    attn = spec.attn_flops_per_ctx
    head = 2.0 * spec.vocab * spec.hidden  # a prefill runs the LM head on its last row only (ModelSpec.prefill_flops)
    pf_tok = 2.0 * spec.matmul_params - head + attn * w.input_len_mean / 2.0
    ctx = w.input_len_mean + w.output_len_mean / 2.0
    dec_tok = 2.0 * spec.matmul_params + attn * ctx
    compute = (w.input_token_rate * pf_tok + w.request_rate * head + w.output_token_rate * dec_tok) / m / device.peak_flops
    per_inst_tokens = w.output_token_rate / m
    seqs = max(1.0, w.in_flight / m)
    steps = per_inst_tokens / seqs
    if device.host_is_device:  # host time on the computing cores (module doc)
        compute += (w.request_rate / m * device.prefill_time_floor(spec.layers, w.input_len_mean)
                    + steps * device.step_time_floor(spec.layers, seqs))
    bw = (steps * spec.weight_bytes + per_inst_tokens * spec.kv_bytes_per_token * ctx) / device.hbm_bw
    hbm = (spec.weight_bytes + kv_used_bytes) / device.hbm_bytes
    return hbm, compute, bw


def has_point(w: ModelWindow, instances: int) -> bool:
    """Whether the window makes a point (module doc: traffic, counted tokens, an instance)."""
    return window_attainment(w) is not None and instances >= 1 and w.request_rate > 0


class OnlinePoints:
    """One model's bounded buffer of online points (arrival order)."""

    def __init__(self, header: dict, max_points: int) -> None:
        if max_points < 1:
            raise ValueError("max_points must be >= 1")
        self.max_points = max_points
        self.points = Points.empty(header)
        self.new_since_fit = 0
        self._next_id = 0

    def seed(self, points: Points) -> None:
        """Start from earlier points (a stored fit's): they count as already fitted."""
        self.points = points.take(np.ones(len(points), dtype=bool))
        self._trim()
        self._next_id = int(points.point_id.max()) + 1 if len(points) else 0

    def add(self, w: ModelWindow, instances: int, spec: ModelSpec, device: DeviceSpec, kv_used_bytes: float) -> bool:
        """Append the window's point; False (nothing added) without traffic or instances."""
        att = window_attainment(w)
        if att is None or not has_point(w, instances):
            return False
        usage = window_usage(w, instances, spec, device, kv_used_bytes)
        one = Points(self.points.header, np.array([LoadFeatures.from_window(w).vector()]),
                     np.array([instances]), np.array([usage]), np.array([min(1.0, max(0.0, att))]),
                     np.array([self._next_id]))
        self._next_id += 1
        self.points = self.points.append(one)
        self.new_since_fit += 1
        self._trim()
        return True

    def _trim(self) -> None:
        if len(self.points) > self.max_points:
            keep = np.zeros(len(self.points), dtype=bool)
            keep[-self.max_points:] = True
            self.points = self.points.take(keep)

    def due(self, min_points: int, min_new: int) -> bool:
        return len(self.points) >= min_points and self.new_since_fit >= min_new

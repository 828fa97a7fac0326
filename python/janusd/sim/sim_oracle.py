"""The oracle the control room asks in the simulator: the roofline prior of each served
model on the simulated device as the performance model runs it (no GP fitting in the
loop), so the room plans with the simulator's own performance model. `janus sim` could
hand it an oracle with the real one's measured error instead (not built yet)."""

from __future__ import annotations

import msgspec

from janusd.hw.devices import DeviceSpec
from janusd.oracle.oracle import Oracle
from janusd.oracle.prior import RooflinePrior
from janusd.sim.cluster import Cluster
from janusd.sim.served import Served


class ControllerError(ValueError):
    """A served model the controller cannot plan for (says which and why)."""


def build_oracle(served: list[Served], cluster: Cluster) -> Oracle:
    """One roofline prior per served model on the simulator's device as the performance
    model runs it: peak FLOP/s, bandwidth and memory derated by its efficiencies, and the
    bandwidth further by the fixed per-step cost at the model's own decode step (the prior
    has no per-step term: a decode step that reads 16 GB of weights in 12.5 ms takes
    17.5 ms with the 5 ms overhead, so without it the prior saw 40% more decode capacity
    than the simulator gives). A model of tp N devices gets the prior of one shard (tp=N:
    a shard's FLOPs and bytes, the all-reduce over the device link, oracle/prior.py), its
    per-step derating at the shard's own weight read. A mixture of experts is counted by its
    ModelSpec like any other (hw/model_spec.py); a model given only as figures (no spec)
    is refused."""
    perf = cluster.perf
    dev: DeviceSpec = msgspec.structs.replace(perf.device, peak_flops=perf.device.peak_flops * perf.compute_eff,
                                              hbm_bw=perf.device.hbm_bw * perf.bandwidth_eff,
                                              hbm_bytes=perf.device.hbm_bytes * perf.usable_frac,
                                              step_overhead_s=perf.overhead_s, layer_overhead_s=0.0,
                                              seq_overhead_s=0.0)  # the perf model's step cost, no other
    o = Oracle()
    for s in served:
        if s.arch.spec is None:
            raise ControllerError(f"model {s.name} ({s.arch.name}, tp {s.arch.tp}): the controller's oracle prior "
                                  "needs the model's shape (a ModelSpec), not only its figures")
        weights_s = s.arch.weight_bytes / s.arch.tp / dev.hbm_bw
        step_dev = msgspec.structs.replace(dev, hbm_bw=dev.hbm_bw * weights_s / (weights_s + perf.overhead_s))
        o.set_prior(s.name, RooflinePrior(s.arch.spec, step_dev, s.ttft_slo_ms / 1000, s.tpot_slo_ms / 1000,
                                          tp=s.arch.tp))
    return o

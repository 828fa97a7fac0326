"""The systems `janus sim --policy` compares: a small registry, one entry per policy.

Each entry says how requests are dispatched (a DispatchConfig for the Rust Dispatcher,
the same object the daemon builds from its config) and how instances are placed before
the first arrival (and, for controllers, changed later). Rules, and what PAPER.md §9 says
of the system each one stands for, are in docs/DESIGN.md "Simulator".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from janusd.config import DispatchConfig
from janusd.sim.cluster import Cluster
from janusd.sim.served import Served
from janusd.sim.perfmodel import PerfModel
from janusd.sim.placement import even, lay_out, split_groups
from janusd.trace.formats import Trace

import numpy as np


def peer_router(policy: str) -> DispatchConfig:
    """A baseline router as peer systems run it (PAPER.md §6's comparison): the rule picks
    the instance and nothing knows a deadline: a late request is served late, never
    refused (requeue = keep), none is refused at admission, no decode guard. The same
    keys as `janus bench dispatch-replay --baselines peer`."""
    return DispatchConfig(policy=policy, requeue="keep", admission="queue",  # type: ignore[arg-type]
                          decode_guard=False)


@dataclass(frozen=True)
class Policy:
    name: str
    summary: str
    dispatch: DispatchConfig
    # (cluster, served, trace, request model per row, oracle error, its seed): the last two
    # are the controller's (sim/oracle_error.py); fixed placements take and ignore them
    setup: Callable[[Cluster, list[Served], Trace, "np.ndarray", float, int], None]
    controlled: bool = False


def work_s(served: list[Served], trace: Trace, request_model: np.ndarray, perf: PerfModel) -> dict[str, float]:
    """Device-seconds each served model's requests ask for, by the performance model: a
    prefill of the mean prompt plus the mean output at a decode batch of 32, per request."""
    out: dict[str, float] = {}
    counts = np.bincount(request_model, minlength=len(served))
    ins = np.bincount(request_model, weights=trace.input_tokens, minlength=len(served))
    outs = np.bincount(request_model, weights=trace.output_tokens, minlength=len(served))
    for k, s in enumerate(served):
        n = int(counts[k])
        if n == 0:
            out[s.name] = 0.0
            continue
        mi, mo = ins[k] / n, outs[k] / n
        per = perf.prefill_s(s.arch, max(1, round(mi))) + mo * perf.decode_step_s(s.arch, 32, mi + mo / 2) / 32
        out[s.name] = n * per * s.arch.tp
    return out


def _place_fixed(count: dict[str, int], cluster: Cluster, served: list[Served]) -> None:
    tps = {s.name: s.arch.tp for s in served}
    for name, groups in lay_out(count, tps).items():
        for g in groups:
            cluster.place(name, g, 0.0)


def _even(cluster: Cluster, served: list[Served], trace: Trace, request_model: np.ndarray, *_: object) -> None:
    _place_fixed(even({s.name: s.arch.tp for s in served}, cluster.n_devices), cluster, served)


def _proportional(cluster: Cluster, served: list[Served], trace: Trace, request_model: np.ndarray,
                  *_: object) -> None:
    w = work_s(served, trace, request_model, cluster.perf)
    _place_fixed(split_groups({s.name: s.arch.tp for s in served}, w, cluster.n_devices), cluster, served)


def _controlled(mode: str) -> Callable[[Cluster, list[Served], Trace, np.ndarray, float, int], None]:
    def setup(cluster: Cluster, served: list[Served], trace: Trace, request_model: np.ndarray,
              oracle_error: float = 0.0, oracle_seed: int = 0) -> None:
        from janusd.sim.control_shell import SimControl

        SimControl(cluster, served, mode, oracle_error=oracle_error, oracle_seed=oracle_seed).start()

    return setup


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("janus", "Janus: bursty/hot apps elastic (whole devices, scaled every 0.5 s under one budget), the rest "
           "co-located in the steady pool (placement every 30 s and on change); D2D fork, H2D restore",
           DispatchConfig(), _controlled("janus"), controlled=True),
    Policy("steady-only", "ablation: every app in the steady pool (co-located, placement every 30 s)",
           DispatchConfig(), _controlled("steady-only"), controlled=True),
    Policy("elastic-only", "ablation: every app elastic (whole devices, one global budget)",
           DispatchConfig(), _controlled("elastic-only"), controlled=True),
    Policy("prism", "Prism-like: periodic placement inside the pool, no per-app budget re-allocation at run "
           "time, every load from host memory (no fork)", DispatchConfig(), _controlled("prism"), controlled=True),
    Policy("blitzscale", "BlitzScale-like: per-app autoscaling on whole devices with fast (D2D) loading, each app "
           "scaled to its own need first come first served, no global allocator",
           DispatchConfig(), _controlled("blitzscale"), controlled=True),
    Policy("static", "devices split evenly and bound to apps for the run (ServerlessLLM-like); LST-IMH dispatch",
           DispatchConfig(), _even),
    Policy("rr", "pool split by the trace's work per app; round-robin dispatch as a peer's router runs it "
           "(no deadlines: late requests served late, never refused, no decode guard)",
           peer_router(policy="round_robin"), _proportional),
    Policy("least-load", "pool split by the trace's work per app; least-load dispatch as a peer's router runs it "
           "(no deadlines: late requests served late, never refused, no decode guard)",
           peer_router(policy="least_load"), _proportional),
    Policy("lst-imh-reject", "pool split by the trace's work per app; LST-IMH, late requests rejected",
           DispatchConfig(policy="lst_imh", requeue="reject"), _proportional),
    Policy("lst-imh-relax", "pool split by the trace's work per app; LST-IMH, late requests re-queued "
           "with relaxed deadlines", DispatchConfig(policy="lst_imh", requeue="relax"), _proportional),
)}

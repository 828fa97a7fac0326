"""Where the models the controller places start (before any instance serves): packed by
policy/start_placement.py the way the first slow tick would pack them at zero load,
around the pinned models; those it cannot size or place spread round robin over the
pool. Both shells start this way: the daemon at start and on a reload that adds models
(server/steady_start.py, after the oracle read their checkpoints), the simulator at
time 0 (sim/control_shell.py)."""

from __future__ import annotations

from collections.abc import Sequence

from janusd.oracle.types import CapacityPredictor
from janusd.policy.demand import SteadyModel
from janusd.policy.policy_config import DemandConfig, PlacementConfig
from janusd.policy.start_placement import start_placement


def pack_start(names: Sequence[str], pinned: list[SteadyModel], pool: Sequence[int], pred: CapacityPredictor,
               demand: DemandConfig, placement: PlacementConfig, elastic_devs: list[int],
               out: dict[str, list[int]], spread: bool = True) -> list[str]:
    """`out[name]` for each of `names` (module doc); without `spread` a model the packing
    leaves out keeps what `out` has. Returns the log lines that say what happened."""
    try:
        res = start_placement(list(names), pinned, tuple(pool), pred, demand, placement, elastic_devs)
    except ValueError as e:  # a policy's refusal of odd input: round robin as before
        res = None
        lines = [f"start placement: {e}; models without devices start round robin"]
    k = 0
    for n in names:
        if res is not None and n in res.placed:
            out[n] = list(res.placed[n])
        elif pool and spread:
            out[n] = [pool[k % len(pool)]]
            k += 1
    if res is not None:
        p = res.plan
        lines = ["start placement: " + ", ".join(f"{n} -> {out.get(n)}" for n in sorted(names))
                 + (f" ({p.bins_used} device(s), Phi {p.phi:.4f})" if p is not None else "")
                 + "".join(f"; {note}" for note in res.notes)]
    return lines

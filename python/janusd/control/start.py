"""Where the models the controller places start (before any instance serves): one device
each while the pool has a free device per model (nothing has served yet, so there is no
load to pack by: a zero-load packing put every model on one device, "Phi 0.0001", and the
first bursts hit them there; the consolidation at the first slow tick packs them by what
they served), else packed by policy/start_placement.py the way the first slow tick would
pack them at zero load, around the pinned models; those it cannot size or place spread
round robin over the pool. Both shells start this way: the daemon at start and on a reload that adds models
(server/steady_start.py, after the oracle read their checkpoints), the simulator at
time 0 (sim/control_shell.py). A tp > 1 model starts first, on an aligned free group of
its own (start_groups, control/groups.py; both shells: server/steady_start.py in the daemon)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from janusd.control.groups import free_groups, take
from janusd.oracle.types import CapacityPredictor
from janusd.policy.demand import SteadyModel
from janusd.policy.policy_config import DemandConfig, PlacementConfig
from janusd.policy.start_placement import start_placement


def pack_start(names: Sequence[str], pinned: list[SteadyModel], pool: Sequence[int], pred: CapacityPredictor,
               demand: DemandConfig, placement: PlacementConfig, elastic_devs: list[int],
               out: dict[str, list[int]], spread: bool = True, one_each: bool = True) -> list[str]:
    """`out[name]` for each of `names` (module doc); without `spread` a model the packing
    leaves out keeps what `out` has; without `one_each` (a reload adding models beside
    what serves) they are packed even when free devices abound. Returns the log lines."""
    taken = {d for m in pinned for d in m.devices} | set(elastic_devs)
    room = [d for d in pool if d not in taken]
    if one_each and len(names) <= len(room):  # one device each: nothing is known yet to pack by
        for n, d in zip(sorted(names), room):
            out[n] = [d]
        return [f"start placement: one device each, {len(names)} model(s) on {len(room)} free device(s) "
                "(packed by measured load at the first slow tick)"]
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


def start_groups(tps: Mapping[str, int], pool: Sequence[int], taken: Collection[int]) -> tuple[dict[str, int], list[str]]:
    """Where tp > 1 models start: one aligned free group each (the largest tp first, then
    by name, each on the lowest free lead), before the tp-1 models are packed on what is
    left (pack_start). Returns lead per model placed and the log lines (a model no
    group is free for starts nowhere: its first request wakes nothing, said here)."""
    free = [d for d in pool if d not in taken]
    out: dict[str, int] = {}
    lines: list[str] = []
    for name in sorted((n for n, t in tps.items() if t > 1), key=lambda n: (-tps[n], n)):
        leads = free_groups(free, tps[name])
        if not leads:
            lines.append(f"start placement: {name} (tp {tps[name]}): no free aligned group of {tps[name]} devices")
            continue
        out[name] = leads[0]
        take(free, leads[0], tps[name])
        lines.append(f"start placement: {name} (tp {tps[name]}) -> devices {leads[0]}-{leads[0] + tps[name] - 1}")
    return out, lines

"""The first placement, at start: where the models the controller places (no `devices`)
come up, packed by policy/placement.py instead of spread round robin (policy/pinned.py).

At start nothing has served yet, so every model is sized at its load then: none (the
telemetry window is empty), as the first slow tick will size it too (control/steady.py);
its capacity vector is then its weights' share of a device's memory plus what the oracle
adds at zero load. The snapshot is the one the slow tick would build: pinned steady
models are pinned items on the devices they start Active on, the devices of pinned
elastic models are elastic devices (taken last), and every managed model is a new item
(replicas when one device is too small: policy/demand.py). placement.plan packs the new
items as a batch (the best of its first-fit-decreasing runs) and consolidates with a
budget of several moves per item (moving costs nothing yet), so the first slow tick
finds the pool already as it would make it and plans no move for it.

A model the oracle cannot size (no prior: its checkpoint could not be read, or the read
did not finish in time), one that fits no device even split, or one the plan leaves
unplaced is not in the result: the caller spreads those round robin as before and the
slow ticks place them once sized. Pure as long as the predictor is.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from janusd.oracle.types import CapacityPredictor, LoadFeatures
from janusd.policy.demand import SteadyModel, steady_items
from janusd.policy.placement import plan as placement_plan
from janusd.policy.policy_config import DemandConfig, PlacementConfig
from janusd.policy.snapshot import PlacementPlan, PlacementSnapshot, SteadyItem

NO_LOAD = LoadFeatures(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
# consolidation's budget at start: moves cost nothing before anything loads, so enough for
# it to run out of gains (each move lowers Phi by min_phi_gain or frees a device) first
_START_BUDGET_PER_ITEM = 8


class StartPlacement(msgspec.Struct, frozen=True, kw_only=True):
    placed: dict[str, tuple[int, ...]]  # managed model -> the devices it starts Active on
    notes: tuple[str, ...]  # why a managed model is not placed here (round robin instead)
    plan: PlacementPlan | None = None  # the plan they come from (None: nothing to place)


def start_placement(managed: Sequence[str], pinned: Sequence[SteadyModel], pool: Sequence[int],
                    pred: CapacityPredictor, demand: DemandConfig, placement: PlacementConfig,
                    elastic_devices: Sequence[int] = ()) -> StartPlacement:
    """Devices for each managed model (module doc). `pinned`: steady models with their
    start devices (their vectors count there, at their `load`: none at start, the load
    now when a reload adds models beside serving ones); `elastic_devices`: devices
    pinned elastic models hold."""
    notes: list[str] = []
    sized: list[SteadyModel] = []
    frozen: list[SteadyItem] = []
    for name in sorted(set(managed)):
        try:
            pred.capacity(name, NO_LOAD)
        except KeyError as e:
            notes.append(f"{name}: {e}; spread round robin")
            continue
        sized.append(SteadyModel(model=name, load=NO_LOAD))
    for m in sorted(pinned, key=lambda m: m.model):
        if not m.devices:
            raise ValueError(f"pinned model {m.model!r} has no devices")
        try:
            pred.capacity(m.model, NO_LOAD)
        except KeyError:  # counts on its devices as nothing, as in the slow tick's snapshot
            frozen += [SteadyItem(key=f"{m.model}@{d}", model=m.model, vector=(0.0, 0.0, 0.0), pinned_device=d)
                       for d in sorted(set(m.devices))]
            continue
        sized.append(SteadyModel(model=m.model, load=m.load, devices=m.devices))
    if not any(not m.devices for m in sized):
        return StartPlacement(placed={}, notes=tuple(notes))
    items = list(frozen)
    for d in steady_items(sized, pred, demand):
        if not d.items:
            notes.append(f"{d.model}: {d.reason}; spread round robin")
        items += d.items
    snap = PlacementSnapshot(pool=tuple(sorted(set(pool))), items=tuple(sorted(items, key=lambda i: i.key)),
                             elastic_devices=tuple(sorted(set(elastic_devices) & set(pool))))
    p = placement_plan(snap, placement, consolidate=True, migrations_left=_START_BUDGET_PER_ITEM * len(items))
    unplaced = {u.model for u in p.unplaced}
    for u in p.unplaced:
        notes.append(f"{u.key}: unplaced ({u.reason}); spread round robin")
    managed_keys = {it.key: it.model for it in items if it.pinned_device is None}
    placed: dict[str, set[int]] = {}
    for a in p.assignment:
        model = managed_keys.get(a.key)
        if model is not None and model not in unplaced:
            placed.setdefault(model, set()).add(a.device)
    return StartPlacement(placed={m: tuple(sorted(ds)) for m, ds in sorted(placed.items())}, notes=tuple(notes),
                          plan=p)

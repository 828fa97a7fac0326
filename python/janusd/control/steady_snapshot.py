"""The steady pool as policy/placement.py sees it (control/steady.py, step 1): the
PlacementSnapshot of what serves now. Its own module because the steady planner and the
start placement (server/steady_start.py) both read it. A pure function of the room's
snapshot and the oracle."""

from __future__ import annotations

from collections.abc import Iterable

from janusd.control.groups import held_devices
from janusd.control.snapshot import ControlSnapshot
from janusd.policy.demand import SteadyModel, steady_items
from janusd.policy.policy_config import DemandConfig
from janusd.policy.snapshot import Assignment, PlacementSnapshot, SteadyItem


def placement_snapshot(snap: ControlSnapshot, demand: DemandConfig, elastic: Iterable[str], last: dict[str, int],
                       resting: Iterable[str] = (), extras: dict[str, set[int]] | None = None,
                       ) -> tuple[PlacementSnapshot, list[str]]:
    """The steady pool now and the reasons for what was left out. Each model that serves
    is one or more steady items, its capacity vector from the oracle over its telemetry
    window (mean + capacity_margin x std; replicas when one device is too small); pinned
    non-elastic models are pinned items where they serve; the devices elastic models
    serve on are `elastic_devices` (taken last). `elastic`: models the classifier has in
    the elastic pool; `last`: item key -> device of the last plan (a key keeps it where
    the model still serves); `resting`: models going Warm/Cold now (keep-alive): not
    placed; `extras`: model -> devices of its elastic replicas (not the steady pool's:
    left out of its current devices, counted as elastic devices). A model the oracle
    cannot size yet stays where it is. A tp > 1 model is no steady item (its groups are
    held whole and sized by control/groups.py): the devices of its serving groups and
    extra replicas leave the pool the packing may use."""
    extras = extras or {}
    elastic, resting = set(elastic), set(resting)
    pred = snap.predictor
    notes: list[str] = []
    models: list[SteadyModel] = []
    serving: dict[str, list[int]] = {}
    frozen: list[SteadyItem] = []
    elastic_devs: set[int] = set()
    for m in sorted(snap.models.values(), key=lambda m: m.name):
        mine = extras.get(m.name, set())
        elastic_devs.update(d for d in m.serving_devices() if d in mine)
        devs = [d for d in m.serving_devices() if d not in mine]
        if not devs or m.pd or m.name in resting or m.tp > 1:
            continue
        placed = snap.placed_by_controller(m)
        if m.name in elastic:  # isolated in the elastic pool: where it serves is the elastic pool's
            elastic_devs.update(devs)
            continue
        load = m.load
        try:
            pred.capacity(m.name, load)
        except KeyError as e:  # no prior yet (its spec is being read): it stays where it serves
            notes.append(f"{m.name}: {e}; kept where it is")
            frozen += [SteadyItem(key=f"{m.name}@{d}", model=m.name, vector=(0.0, 0.0, 0.0), pinned_device=d)
                       for d in devs]
            continue
        if placed:
            models.append(SteadyModel(model=m.name, load=load))
            serving[m.name] = devs
        else:
            models.append(SteadyModel(model=m.name, load=load, devices=tuple(devs)))
    items = list(frozen)
    current: list[Assignment] = []
    for d in steady_items(models, pred, demand):
        items += d.items
        devs = list(serving.get(d.model, ()))
        if not d.items:  # fits no device even split: left where it serves (noted), never drained for it
            notes.append(f"{d.model}: {d.reason}; kept where it is")
            continue
        if not devs:
            continue
        current += _current(d.model, [it.key for it in d.items if it.pinned_device is None], devs, last)
    held = held_devices(snap.models.values(), extras)
    out = PlacementSnapshot(pool=tuple(d for d in snap.pool if d not in held), items=tuple(sorted(items, key=lambda i: i.key)),
                            current=tuple(sorted(current, key=lambda a: a.key)),
                            elastic_devices=tuple(sorted((elastic_devs & set(snap.pool)) - held)))
    return out, notes


def _current(model: str, keys: list[str], devs: list[int], last: dict[str, int]) -> list[Assignment]:
    """Where a model's items are now: a key keeps the device the last plan gave it where
    the model still serves, the rest take the other devices it serves on in order; what
    serves beyond the items (fewer replicas wanted now) are leavers the plan removes."""
    mine: dict[str, int] = {}
    for k in keys:
        dv = last.get(k)
        if dv is not None and dv in devs:
            mine[k] = dv
            devs.remove(dv)
    for k in keys:
        if k not in mine and devs:
            mine[k] = devs.pop(0)
    return [Assignment(key=k, device=dv) for k, dv in mine.items()] + \
        [Assignment(key=f"{model}#surplus{dv}", device=dv) for dv in devs]

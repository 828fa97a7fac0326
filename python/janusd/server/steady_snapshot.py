"""The steady pool as policy/placement.py sees it (server/steady.py, step 1): which models
the controller places, on which devices, and the PlacementSnapshot of what serves now.
Its own module because three readers share it (the executor's slow tick, the
controller's elastic budget and extras, the start placement) and none of them owns it.
No awaiting, no I/O: a pure function of the registry, telemetry and the oracle."""

from __future__ import annotations

from collections.abc import Iterable

from janusd.config import JanusConfig
from janusd.core.registry import Model, Registry
from janusd.lifecycle.states import COMING_UP, InstanceState
from janusd.oracle.types import CapacityPredictor, LoadFeatures
from janusd.policy.demand import SteadyModel, steady_items
from janusd.policy.snapshot import Assignment, PlacementSnapshot, SteadyItem
from janusd.telemetry.telemetry import Telemetry

S = InstanceState


def placed_by_controller(cfg: JanusConfig, m: Model) -> bool:
    """A model the steady placement moves: managed mode, no `devices`, not P/D."""
    return cfg.control.managed and not m.cfg.devices and not m.cfg.prefill_devices


def pool_devices(cfg: JanusConfig) -> tuple[int, ...]:
    """The devices the controller may place on: `control.pool_devices`, else all."""
    n = cfg.devices.count
    return tuple(sorted({d for d in cfg.control.pool_devices if d < n})) if cfg.control.pool_devices \
        else tuple(range(n))


def serving_devices(m: Model) -> list[int]:
    """Devices where `m` is Active or on its way there: where it serves."""
    return sorted(d for d, i in m.instances.items() if i.state is S.ACTIVE or i.state in COMING_UP)


def placement_snapshot(cfg: JanusConfig, registry: Registry, telemetry: Telemetry, pred: CapacityPredictor,
                       elastic: Iterable[str], last: dict[str, int], now: float,
                       resting: Iterable[str] = (), extras: dict[str, set[int]] | None = None,
                       ) -> tuple[PlacementSnapshot, list[str]]:
    """The steady pool now (module doc, step 1) and the reasons for what was left out.
    `elastic`: models the classifier has in the elastic pool; `last`: item key -> device
    of the last plan; `resting`: models going Warm/Cold now (keep-alive): not placed;
    `extras`: model -> devices of its elastic replicas (not the steady pool's: left out
    of its current devices, counted as elastic devices)."""
    extras = extras or {}
    elastic, resting = set(elastic), set(resting)
    notes: list[str] = []
    models: list[SteadyModel] = []
    serving: dict[str, list[int]] = {}
    frozen: list[SteadyItem] = []
    elastic_devs: set[int] = set()
    for m in sorted(registry.models.values(), key=lambda m: m.name):
        mine = extras.get(m.name, set())
        elastic_devs.update(d for d in serving_devices(m) if d in mine)
        devs = [d for d in serving_devices(m) if d not in mine]
        if not devs or m.cfg.prefill_devices or m.name in resting:
            continue
        if not placed_by_controller(cfg, m):
            if m.name in elastic:
                elastic_devs.update(devs)
                continue
        load = LoadFeatures.from_window(telemetry.model(m.name, now))
        try:
            pred.capacity(m.name, load)
        except KeyError as e:  # no prior yet (its spec is being read): it stays where it serves
            notes.append(f"{m.name}: {e}; kept where it is")
            frozen += [SteadyItem(key=f"{m.name}@{d}", model=m.name, vector=(0.0, 0.0, 0.0), pinned_device=d)
                       for d in devs]
            continue
        if placed_by_controller(cfg, m):
            models.append(SteadyModel(model=m.name, load=load))
            serving[m.name] = devs
        else:
            models.append(SteadyModel(model=m.name, load=load, devices=tuple(devs)))
    items = list(frozen)
    current: list[Assignment] = []
    for d in steady_items(models, pred, cfg.control.demand):
        items += d.items
        devs = list(serving.get(d.model, ()))
        if not d.items:  # fits no device even split: left where it serves (noted), never drained for it
            notes.append(f"{d.model}: {d.reason}; kept where it is")
            continue
        if not devs:
            continue
        keys = [it.key for it in d.items if it.pinned_device is None]
        # a key keeps the device the last plan gave it, where the model still serves
        mine: dict[str, int] = {}
        for k in keys:
            dv = last.get(k)
            if dv is not None and dv in devs:
                mine[k] = dv
                devs.remove(dv)
        for k in keys:
            if k not in mine and devs:
                mine[k] = devs.pop(0)
        current += [Assignment(key=k, device=dv) for k, dv in mine.items()]
        # serving beyond the items (fewer replicas wanted now): leavers, removed by the plan
        current += [Assignment(key=f"{d.model}#surplus{dv}", device=dv) for dv in devs]
    pool = pool_devices(cfg)
    snap = PlacementSnapshot(pool=pool, items=tuple(sorted(items, key=lambda i: i.key)),
                             current=tuple(sorted(current, key=lambda a: a.key)),
                             elastic_devices=tuple(sorted(elastic_devs & set(pool))))
    return snap, notes

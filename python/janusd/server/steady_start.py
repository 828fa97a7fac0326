"""Where models without `devices` start, in the daemon (control/start.py's rule):
at daemon start (`first_placement`, with control.place_at_start), before any model
loads, the oracle reads every model's checkpoint for its prior (bounded by
server.worker_ready_timeout_s) and policy/start_placement.py packs the models without
`devices` the way the first slow tick would (at zero load); those it cannot size or
place are spread round robin over the pool, as policy/pinned.py does without it.
Models a SIGHUP reload adds (`added_placement`) are placed the same way around what
serves then: every model with a serving instance counts where it serves, at its load now,
and is never moved by this (the next slow tick may); only the new ones are packed.
A tp > 1 model the controller places starts first, on a free aligned group of its own
(control/start.py start_groups, as in the simulator); the rest are packed around the groups.
Apart from the executor: it runs once per start or reload, before any move exists."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from janusd.config import JanusConfig, ModelConfig
from janusd.control.observe import pool_devices
from janusd.control.start import pack_start, start_groups
from janusd.core import ServingCore
from janusd.lifecycle.states import COMING_UP, InstanceState
from janusd.log import log
from janusd.oracle.types import CapacityPredictor, LoadFeatures
from janusd.policy.demand import SteadyModel
from janusd.policy.pinned import place
from janusd.policy.start_placement import NO_LOAD

S = InstanceState


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


async def _describe(cfg: JanusConfig, models: Sequence[ModelConfig],
                    describe: Callable[[Sequence[ModelConfig]], list[asyncio.Task[Any]]]) -> None:
    """Start the oracle's checkpoint reads of `models` and wait for them, bounded by
    server.worker_ready_timeout_s (not cancelled on timeout: the oracle keeps them)."""
    tasks = describe(models)
    if tasks:
        t0 = asyncio.get_running_loop().time()
        _, late = await asyncio.wait(tasks, timeout=cfg.server.worker_ready_timeout_s)
        if late:
            _log(f"start placement: {len(late)} checkpoint read(s) not done after "
                 f"{cfg.server.worker_ready_timeout_s:g} s; those models start round robin", logging.WARNING)
        _log(f"start placement: the oracle read {len(tasks)} checkpoint(s) in "
             f"{asyncio.get_running_loop().time() - t0:.2f} s", logging.DEBUG)


def _pack(cfg: JanusConfig, managed: Sequence[ModelConfig], pinned: list[SteadyModel], elastic_devs: list[int],
          pred: CapacityPredictor, out: dict[str, list[int]], spread: bool = True) -> None:
    """`out[m]` for each managed model, by the control room's start rule (control/start.py): at
    start (`spread`) one device each while they last; on a reload, packed beside what serves."""
    pool = pool_devices(cfg.devices.count, cfg.control.pool_devices)
    for line in pack_start([m.name for m in managed], pinned, pool, pred, cfg.control.demand, cfg.control.placement,
                           elastic_devs, out, spread, one_each=spread):
        _log(line, logging.ERROR if "round robin" in line else logging.INFO)


def _configured(m: ModelConfig, pinned: list[SteadyModel], elastic_devs: list[int]) -> None:
    """A pinned model's start devices: steady items there, or elastic devices (a tp group's
    other devices are taken as elastic ones: nothing is packed inside a group)."""
    up = tuple(d for d in sorted(set(m.devices)) if m.start_state(d) == "active")
    if m.pool == "elastic":
        elastic_devs += up
    elif up:
        pinned.append(SteadyModel(model=m.name, load=NO_LOAD, devices=up))
    elastic_devs += [x for d in m.devices for x in range(d + 1, d + m.tp)]


def _groups(cfg: JanusConfig, managed: Sequence[ModelConfig], taken: Iterable[int], elastic_devs: list[int],
            out: dict[str, list[int]]) -> list[ModelConfig]:
    """The tp > 1 models of `managed` on free aligned groups of the pool, one each (control/start.py
    start_groups: the simulator's rule), their devices taken for the packing of the rest
    (`elastic_devs`); a model no group is free for starts nowhere (logged). Returns the tp-1 ones."""
    tps = {m.name: m.tp for m in managed if m.tp > 1}
    if not tps:
        return list(managed)
    pool = pool_devices(cfg.devices.count, cfg.control.pool_devices)
    leads, lines = start_groups(tps, pool, set(taken) | set(elastic_devs))
    for line in lines:
        _log(line, logging.ERROR if "no free" in line else logging.INFO)
    for name in tps:
        out[name] = [leads[name]] if name in leads else []
        elastic_devs += [x for lead in out[name] for x in range(lead, lead + tps[name])]
    return [m for m in managed if m.tp <= 1]


async def first_placement(cfg: JanusConfig, describe: Callable[[Sequence[ModelConfig]], list[asyncio.Task[Any]]],
                          pred: CapacityPredictor) -> dict[str, list[int]]:
    """The devices every configured model starts on (module doc, "At start"): pinned
    models as configured; the controller's own packed when the oracle sizes them in time,
    else round robin over the pool. `describe(models)` starts the oracle's checkpoint
    reads (OracleRefit.describe_now) and returns their tasks."""
    out = place(list(cfg.models), cfg.devices.count)
    managed = [m for m in cfg.models if not m.devices and not m.prefill_devices]
    if not (cfg.control.managed and cfg.control.place_at_start and managed):
        return out
    await _describe(cfg, cfg.models, describe)
    pinned: list[SteadyModel] = []
    elastic_devs: list[int] = []
    for m in cfg.models:
        if m.devices and not m.prefill_devices:
            _configured(m, pinned, elastic_devs)
    managed = _groups(cfg, managed, {d for p in pinned for d in p.devices}, elastic_devs, out)
    if managed:
        _pack(cfg, managed, pinned, elastic_devs, pred, out)
    return out


async def added_placement(cfg: JanusConfig, added: Sequence[ModelConfig], core: ServingCore,
                          describe: Callable[[Sequence[ModelConfig]], list[asyncio.Task[Any]]],
                          pred: CapacityPredictor, elastic: Iterable[str], now: float) -> dict[str, list[int]]:
    """The devices of models a SIGHUP reload adds (`cfg`: the new config; module doc):
    pinned ones as configured, the controller's own packed around what serves now (each
    serving model at its current devices and load, elastic ones' devices taken last),
    else round robin as policy/pinned.py spreads them."""
    out = place(list(cfg.models), cfg.devices.count)
    managed = [m for m in added if not m.devices and not m.prefill_devices]
    if not (cfg.control.managed and cfg.control.place_at_start and managed):
        return {m.name: out[m.name] for m in added}
    await _describe(cfg, managed, describe)
    pinned: list[SteadyModel] = []
    elastic_devs: list[int] = []
    hot = set(elastic)
    for m in core.models().values():
        devs = tuple(sorted(d for d, i in m.instances.items() if i.state is S.ACTIVE or i.state in COMING_UP))
        if not devs:
            continue
        elastic_devs += [x for d in devs for x in range(d + 1, d + m.cfg.tp)]  # a serving group's other devices
        if m.name in hot or m.cfg.pool == "elastic" or m.cfg.prefill_devices:
            elastic_devs += devs
        else:
            pinned.append(SteadyModel(model=m.name, load=LoadFeatures.from_window(core.window(m.name, now)),
                                      devices=devs))
    for a in added:
        if a.devices and not a.prefill_devices:
            _configured(a, pinned, elastic_devs)
    managed = _groups(cfg, managed, {d for p in pinned for d in p.devices}, elastic_devs, out)
    if managed:
        _pack(cfg, managed, pinned, elastic_devs, pred, out, spread=False)
    return {m.name: out[m.name] for m in added}

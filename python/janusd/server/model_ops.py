"""Changes to the set of served models, done against real workers: load, unload
(drain), remove, SIGHUP reload, and reloading a restarted worker's instances.

The core owns the models and the one state per instance; this file only talks to
workers (LoadModel / UnloadModel, one at a time per worker) and reports the outcome to
the core (`loaded`, `load_failed`, `set_state`). Every refusal is a ValueError naming
what is wrong, which the admin socket turns into an error reply. `unload` keeps the
model (requests for it wait, bounded, and `load` brings it back with its full config);
`remove` forgets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from janusd.config import (
    ConfigError,
    EngineConfig,
    JanusConfig,
    LifecycleConfig,
    ModelConfig,
    check_config,
    load_config,
)
from janusd.core import Failure, Instance, Model, ServingCore
from janusd.lifecycle.states import InstanceState
from janusd.log import log
from janusd.policy.pinned import place
from janusd.server.daemon_clock import clock
from janusd.server.drain import drain
from janusd.server.tp_groups import load_group, unready, waiting_on
from janusd.server.workers import WorkerError, WorkerHandle
from janusd.wire import worker_msgs as wm

S = InstanceState


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


# Fields that only steer requests (SLO targets, the app's name): changing them must not
# reload the model, which would turn its traffic away while the weights load again.
_REQUEST_ONLY_FIELDS = ("ttft_slo_ms", "tpot_slo_ms", "app")


def _same_instance(a: ModelConfig, b: ModelConfig) -> bool:
    return msgspec.structs.replace(a, **{f: getattr(b, f) for f in _REQUEST_ONLY_FIELDS}) == b


class ModelOps:
    def __init__(self, core: ServingCore, workers: list[WorkerHandle], engine: EngineConfig, cache_dir: str,
                 load_timeout_s: float, drain_timeout_s: float, clock: Callable[[], float],
                 lifecycle: LifecycleConfig) -> None:
        self.core = core
        self.workers = workers
        self.engine = engine
        self.cache_dir = cache_dir
        self.load_timeout_s = load_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.clock = clock
        self._locks = [asyncio.Lock() for _ in workers]  # one load/unload at a time per worker
        self.lifecycle = lifecycle  # the daemon's [lifecycle]: what a load tells the worker
        # brings an instance to a start state other than active (server/lifecycle_ops.py)
        self.starter: Callable[[Instance, str], Awaitable[None]] | None = None
        self.poke: Callable[[], None] = lambda: None  # the daemon's: tick now (a drain's bound is a tick's)
        self.tp_timeout_s = 60.0  # a tp group's rendezvous and collectives (server.worker_step_timeout_s)
        # a reply the worker's main thread gives at once (a tp shard's PublishWeights): one not
        # given within the heartbeat's bound is a hung worker's (server.worker_heartbeat_timeout_s)
        self.reply_timeout_s = 5.0

    async def start(self, inst: Instance) -> None:
        """Bring a configured instance to its start state (config warm_devices / cold_devices)."""
        m = self.core.model(inst.model)
        state = m.cfg.start_state(inst.device) if m is not None else "active"
        if state == "active" or self.starter is None:
            await self.load(inst)
        else:
            await self.starter(inst, state)

    # ---- one instance ----
    async def load(self, inst: Instance) -> None:
        """Load the instance's model on its worker; on success it becomes Active."""
        m = self.core.model(inst.model)
        if m is None:
            return
        if inst.state is S.UNLOADED:
            self.core.set_state(inst, S.LOADING, self.clock())
        elif inst.state is not S.LOADING:
            return
        group = range(inst.device, inst.device + m.cfg.tp)  # a tp > 1 instance: its whole group (server/tp_groups.py)
        async with self.locked(group):
            if inst.state is not S.LOADING:
                return  # another restart of the group's workers loaded it meanwhile
            if away := unready(self.workers, group):  # the worker that comes back last loads it
                inst.error = f"waiting for the workers of devices {away} (tp group {group[0]}-{group[-1]})"
                return
            t0 = clock()
            try:
                reply = await self.load_on_workers(inst, group)
            except (WorkerError, asyncio.TimeoutError) as e:
                err = str(e) or "load timed out"
                if inst.state is S.LOADING and not unready(self.workers, group):
                    _log(f"loading {inst.model} on device {inst.device} failed: {err}", logging.WARNING)
                    self.core.load_failed(inst, self.clock(), err)
                return
            if inst.state is not S.LOADING or not self.core.holds(inst):
                # unloaded or removed while it loaded: free what the worker just loaded
                await self._unload_on_worker(inst.model, inst.device, locked=True)
                return
        self.core.loaded(inst, self.clock(), reply.max_model_len, clock() - t0, reply.prefill_probe)
        _log(f"{inst.model} active on device {inst.device} (loaded in {inst.load_s:.2f} s)")

    @contextlib.asynccontextmanager
    async def locked(self, devices: range) -> AsyncIterator[None]:
        """The load/unload locks of `devices` (a tp group's), taken in ascending order: two
        group operations never wait on each other's locks."""
        async with contextlib.AsyncExitStack() as held:
            for d in devices:
                await held.enter_async_context(self._locks[d])
            yield

    async def load_on_workers(self, inst: Instance, group: range) -> wm.ModelLoaded:
        """LoadModel on the instance's worker, or on every worker of its tp group
        (server/tp_groups.py); the caller holds their locks. Raises WorkerError / TimeoutError."""
        m = self.core.models()[inst.model]
        cfg = m.engine_cfg(inst.device)

        def make(seq: int, tp: wm.TPPlace | None = None) -> wm.LoadModel:
            return wm.LoadModel(seq, wm.WorkerModel.of(cfg), wm.WorkerEngine.of(self.engine), self.cache_dir,
                                wm.WorkerLifecycle.of(self.lifecycle), tp)

        if len(group) > 1:
            return (await load_group(self.workers, group, make, self.load_timeout_s, self.tp_timeout_s))[0]
        reply: wm.ModelLoaded = await self.workers[inst.device].call(make, self.load_timeout_s)
        return reply

    async def unload_on_worker(self, name: str, device: int) -> None:
        """UnloadModel on `device`'s worker (a tp group's lead frees its followers' shards too)."""
        await self._unload_on_worker(name, device)

    async def _unload_on_worker(self, name: str, device: int, locked: bool = False) -> None:
        w = self.workers[device]

        async def go() -> None:
            try:
                await w.call(lambda seq: wm.UnloadModel(seq, name), 60.0)
            except (WorkerError, asyncio.TimeoutError) as e:
                _log(f"unloading {name} on device {device}: {e}")

        if locked:
            await go()
        else:
            async with self._locks[device]:
                await go()

    # ---- a model ----
    async def add_and_load(self, cfgs: list[ModelConfig], all_models: list[ModelConfig], devices: int,
                           placement: dict[str, list[int]] | None = None) -> None:
        """`placement`: the devices of each model (the start placement, server/steady_start.py);
        None: policy/pinned.py's (configured devices, else round robin)."""
        placement = placement or place(all_models, devices)
        insts = []
        for cfg in cfgs:
            m = self.core.add_model(cfg)
            insts += [self.core.instance(m.name, d) for d in placement[cfg.name]]
        await asyncio.gather(*(self.start(i) for i in insts))

    async def load_model(self, m: Model, devices: list[int]) -> None:
        insts = [self.core.instance(m.name, d) for d in devices]
        await asyncio.gather(*(self.load(i) for i in insts))

    async def unload(self, name: str) -> dict[str, Any]:
        """Stop routing to `name`, let its running requests finish (bounded), free it on every
        worker. The model stays: requests for it wait for `load`, bounded by
        server.model_wait_timeout_s."""
        m = self.core.model(name)
        if m is None:
            raise ValueError(f"model {name!r} does not exist")
        insts = list(m.instances.values())
        for inst in insts:
            if inst.state is S.ACTIVE:
                self.core.set_state(inst, S.DRAINING, self.clock())  # all at once: none takes the others' work
            elif inst.state in (S.LOADING, S.RESTORING, S.FORKING, S.COLD):
                self.core.set_state(inst, S.UNLOADED, self.clock(), error=f"unloaded while {inst.state.value}")
            elif inst.state is S.WARM:  # drop the worker's host copy
                self.core.set_state(inst, S.UNLOADED, self.clock())
                await self._unload_on_worker(name, inst.device)
        gone = Failure(503, f"model {name!r} was unloaded")
        drains = [drain(self.core, i, self.drain_timeout_s, gone, self.poke) for i in insts if i.state is S.DRAINING]
        failed = sum(ended for _, ended in await asyncio.gather(*drains))
        for inst in insts:
            if inst.state is S.DRAINING:
                self.core.set_state(inst, S.UNLOADED, self.clock())
                await self._unload_on_worker(name, inst.device)
        return {"failed_requests": failed}

    async def remove(self, name: str) -> dict[str, Any]:
        out = await self.unload(name)
        self.core.remove_model(name, self.clock())
        return out

    async def reload_device(self, device: int) -> None:
        """A restarted worker: load again every instance that was on it."""
        insts = [i for i in self.core.instances_on(device) if i.state is S.LOADING]
        insts += waiting_on(self.core, device)  # tp instances led elsewhere whose group this worker is in
        await asyncio.gather(*(self.load(i) for i in insts))


# ---- the operations the admin socket and SIGHUP ask for (they edit the config copy) ----
Placer = Callable[[JanusConfig, list[ModelConfig]], Awaitable[dict[str, list[int]]]]


class ConfigHolder:
    """The daemon's current config; the one owner of the model list a reload compares with."""

    def __init__(self, cfg: JanusConfig, path: str | None, overrides: dict[str, Any]) -> None:
        self.cfg = cfg
        self.path = path
        self.overrides = overrides


async def reload(ops: ModelOps, holder: ConfigHolder, placer: Placer | None = None) -> dict[str, Any]:
    """SIGHUP: apply the file's [[models]]. `placer(new config, added)`: the devices of the
    models it adds (the controller's packing, server/steady_start.py added_placement); None:
    policy/pinned.py's (configured devices, else round robin)."""
    try:
        new = load_config(holder.path)
    except ConfigError as e:
        _log(f"reload refused: {e}")
        return {"error": str(e)}
    cur = holder.cfg
    if holder.overrides:
        new = msgspec.structs.replace(new, server=msgspec.structs.replace(new.server, **holder.overrides))
    if new.server != cur.server or new.devices != cur.devices or new.engine != cur.engine:
        _log("reload: [server], [devices] and [engine] changes need a restart; applying [[models]] only")
    old = {m.name: m for m in cur.models}
    fresh = {m.name: m for m in new.models}
    retuned = [n for n in old if n in fresh and fresh[n] != old[n] and _same_instance(old[n], fresh[n])]
    for name in retuned:
        if ops.core.has_model(name):
            ops.core.retune(fresh[name])  # new requests get the new SLOs at once
    removed = [n for n in old if n not in fresh or (fresh[n] != old[n] and n not in retuned)]
    added = [m for m in new.models if m.name not in old or (old[m.name] != m and m.name not in retuned)]
    for name in removed:
        if ops.core.has_model(name):
            await ops.remove(name)
    holder.cfg = msgspec.structs.replace(cur, models=list(new.models))
    placement = await placer(holder.cfg, added) if placer is not None and added else None
    await ops.add_and_load(added, holder.cfg.models, holder.cfg.devices.count, placement)
    _log(f"reload: removed {removed or 'none'}, added {[m.name for m in added] or 'none'}, "
         f"new SLOs {retuned or 'none'}")
    return {"removed": removed, "added": [m.name for m in added], "retuned": retuned}


async def load_model(ops: ModelOps, holder: ConfigHolder, name: str, checkpoint: str | None,
                     devices: list[int]) -> dict[int, str]:
    """`ctl load NAME [--checkpoint C] [--devices ...]`: a known model (also one unloaded
    by `ctl unload`) comes back with its full config; a new one needs a checkpoint."""
    cfg = holder.cfg
    kept = ops.core.model(name)
    if kept is not None and checkpoint is None:
        if kept.active or any(i.state is S.LOADING for i in kept.instances.values()):
            raise ValueError(f"model {name!r} is already loaded")
        resting = sorted(i.device for i in kept.instances.values() if i.state in (S.WARM, S.COLD))
        if resting:
            raise ValueError(f"model {name!r} is warm or cold on devices {resting}: bring it back with "
                             f"`janus ctl state {name} --device N active` (or `ctl unload` it first)")
        m = kept.cfg
    elif kept is not None:
        raise ValueError(f"model {name!r} is already loaded")
    elif checkpoint is None:
        try:
            m = cfg.model(name)
        except KeyError:
            raise ValueError(f"model {name!r} is not in the config; give --checkpoint to add it") from None
    else:
        try:
            m = msgspec.convert({"name": name, "checkpoint": checkpoint, "devices": devices}, ModelConfig)
        except msgspec.ValidationError as e:
            raise ValueError(f"bad model: {e}") from None
    if devices and checkpoint is None:
        m = msgspec.structs.replace(m, devices=devices)
        pd = set(m.prefill_devices)
        if pd and not (pd <= set(devices) and set(devices) - pd):
            raise ValueError(f"devices: {name!r} is a P/D model with prefill_devices {m.prefill_devices}; "
                             f"{devices} must hold all of them and at least one device to decode")
    if any(dev >= cfg.devices.count for dev in m.devices):
        raise ValueError(f"devices: only {cfg.devices.count} devices exist")
    others = [x for x in cfg.models if x.name != name]
    new = msgspec.structs.replace(cfg, models=[*others, m])
    try:
        check_config(new)  # the config's own rules (tp groups held whole, leads, ...) on the result
    except ValueError as e:
        raise ValueError(f"cannot load {name!r} there: {e}") from None
    holder.cfg = new
    target = place(holder.cfg.models, cfg.devices.count)[name]
    if kept is not None:
        ops.core.retune(m)
        model = kept
    else:
        model = ops.core.add_model(m)
    await ops.load_model(model, target)
    if not model.active:
        errors = "; ".join(f"device {i.device}: {i.error}" for i in model.instances.values())
        if kept is None:
            await remove_model(ops, holder, name)
        raise ValueError(f"model {name!r} failed to load: {errors}")
    return {d: model.instances[d].state.value + (f": {model.instances[d].error}" if model.instances[d].error else "")
            for d in target}


async def unload_model(ops: ModelOps, name: str) -> dict[str, Any]:
    m = ops.core.model(name)
    if m is None:
        raise ValueError(f"model {name!r} does not exist")
    if not any(i.state is not S.UNLOADED for i in m.instances.values()):
        raise ValueError(f"model {name!r} is not loaded")
    return await ops.unload(name)


async def remove_model(ops: ModelOps, holder: ConfigHolder, name: str) -> dict[str, Any]:
    if ops.core.model(name) is None:
        raise ValueError(f"model {name!r} does not exist")
    out = await ops.remove(name)
    holder.cfg = msgspec.structs.replace(holder.cfg, models=[x for x in holder.cfg.models if x.name != name])
    return out

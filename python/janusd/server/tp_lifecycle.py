"""Active / Warm / Cold of a tensor-parallel instance, its whole group at once ([P];
server/tp_groups.py says where a group lives, DESIGN.md "Tensor parallelism").

- Active -> Warm: drain the instance (its lead's requests), then every worker of the group
  copies its own shard out (SetState warm to all of them at once: D2H of each shard's
  segment into a host copy on its worker; the group's process group stays, idle).
- Warm -> Active: the followers restore their shards from their host copies first, then
  the lead restores its own and (with a probe) runs one greedy token through the group.
- Active -> Cold and Warm -> Cold: the lead unloads the instance, telling its followers
  to free their shards and host copies (engine/worker_tp.py): a Cold group holds nothing.
- Cold -> Active: the group is loaded again whole (server/model_ops.py load_on_workers).
A move that fails half way leaves the group Cold (the lead unloads what is left), never
half held. Not built, refused by name: Cold -> Warm (a host copy shard by shard from the
checkpoint). A D2D fork of a group (shard i of the source to shard i of the target) is
server/tp_fork.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from janusd.core import Failure, Instance, ServingCore
from janusd.lifecycle.states import InstanceState
from janusd.log import log
from janusd.server.drain import drain
from janusd.server.model_ops import ModelOps
from janusd.server.workers import WorkerError
from janusd.wire import worker_msgs as wm

S = InstanceState


class LifecycleOps(Protocol):
    """What this uses of server/lifecycle_ops.py's LifecycleOps (which calls it: no import circle)."""

    core: ServingCore
    ops: ModelOps

    def state_msg(self, inst: Instance, target: str, probe: bool) -> Callable[[int], wm.SetState]: ...


async def set_group_state(life: LifecycleOps, inst: Instance, want: InstanceState, probe: bool) -> dict[str, Any]:
    """`ctl state` / a wake of a tp > 1 instance (the caller claimed it); the reply as
    LifecycleOps.set_state's."""
    prev, name = inst.state, inst.model
    tp = life.core.models()[name].cfg.tp
    group = range(inst.device, inst.device + tp)
    t0 = life.ops.clock()
    if want is S.WARM and prev is not S.ACTIVE:
        raise ValueError(f"{name} on device {inst.device} is a tp {tp} instance: it goes warm only from active "
                         f"(a host copy shard by shard from the checkpoint is not built); it is {prev.value}")
    if want is S.ACTIVE and prev is S.UNLOADED:
        await life.ops.load(inst)
        if inst.state is not S.ACTIVE:
            raise ValueError(f"{name} on device {inst.device} failed to load: {inst.error}")
        path = "checkpoint"
    elif want is S.ACTIVE:
        path = await _activate(life, inst, group, probe)
    elif prev is S.ACTIVE:
        failure = Failure(503, f"model {name!r} on device {inst.device} went {want.value} before this request "
                               f"finished (drain bound {life.ops.drain_timeout_s:g} s)", code="model_deactivated")
        await drain(life.core, inst, life.ops.drain_timeout_s, failure, life.ops.poke)
        path = await (_to_warm(life, inst, group) if want is S.WARM else _to_cold(life, inst, group))
    elif prev is S.UNLOADED:  # nothing held: Cold at once
        life.core.set_state(inst, S.COLD, life.ops.clock())
        path = "none"
    else:  # Warm -> Cold
        path = await _to_cold(life, inst, group)
    total = life.ops.clock() - t0
    return {"model": name, "device": inst.device, "state": inst.state.value, "from": prev.value, "path": path,
            "devices": list(group), "total_s": round(total, 4)}


async def _activate(life: LifecycleOps, inst: Instance, group: range, probe: bool) -> str:
    prev = inst.state
    life.core.set_state(inst, S.RESTORING, life.ops.clock())
    t0 = life.ops.clock()
    try:
        async with life.ops.locked(group):
            if prev is S.COLD:
                path = "checkpoint"
                reply: Any = await life.ops.load_on_workers(inst, group)
            else:
                path = "h2d"
                follow = [_set_state(life, inst, d, "active", False) for d in group[1:]]
                await asyncio.gather(*follow)  # every follower back before the lead's first step
                reply = await _set_state(life, inst, group[0], "active", probe)
    except (WorkerError, asyncio.TimeoutError) as e:
        await _fail(life, inst, group, f"{prev.value} -> active", e)
        raise ValueError(f"{inst.model} on device {inst.device} (tp group {group[0]}-{group[-1]}) could not "
                         f"become active ({e or 'timed out'}); the group is {inst.state.value} now") from None
    if inst.state is not S.RESTORING:  # unloaded or removed meanwhile: free it again
        await life.ops.unload_on_worker(inst.model, inst.device)
        raise ValueError(f"{inst.model} on device {inst.device} left restoring while it restored")
    life.core.loaded(inst, life.ops.clock(), reply.max_model_len, life.ops.clock() - t0,
                     getattr(reply, "prefill_probe", []))
    return path


async def _to_warm(life: LifecycleOps, inst: Instance, group: range) -> str:
    try:
        async with life.ops.locked(group):
            await asyncio.gather(*(_set_state(life, inst, d, "warm", False) for d in group))
    except (WorkerError, asyncio.TimeoutError) as e:
        await _fail(life, inst, group, "active -> warm", e)
        raise ValueError(f"{inst.model} on device {inst.device}: leaving active failed: {e}; the group is "
                         f"{inst.state.value} now") from None
    if inst.state is S.DRAINING:
        life.core.set_state(inst, S.WARM, life.ops.clock())
    return "d2h"


async def _to_cold(life: LifecycleOps, inst: Instance, group: range) -> str:
    await life.ops.unload_on_worker(inst.model, inst.device)  # the lead frees its followers' shards first
    if inst.state in (S.DRAINING, S.WARM):
        life.core.set_state(inst, S.COLD, life.ops.clock())
    return "none"


async def _set_state(life: LifecycleOps, inst: Instance, device: int, target: str, probe: bool) -> wm.StateSet:
    """SetState of the instance's model to the worker of `device` (one shard)."""
    make = life.state_msg(inst, target, probe)
    reply: wm.StateSet = await life.ops.workers[device].call(make, life.ops.load_timeout_s)
    return reply


async def _fail(life: LifecycleOps, inst: Instance, group: range, move: str, e: BaseException) -> None:
    """A group move failed on one shard: free what the group holds (the lead's unload frees
    every follower's shard and host copy); the instance is Cold, as the group is."""
    log.log(logging.WARNING, f"{inst.model} on device {inst.device}: {move} of its tp group "
                             f"{group[0]}-{group[-1]} failed ({e or 'timed out'}); freeing the group, it goes cold")
    await life.ops.unload_on_worker(inst.model, inst.device)
    if inst.state in (S.RESTORING, S.DRAINING):
        life.core.set_state(inst, S.COLD, life.ops.clock(), error=str(e) or "timed out")

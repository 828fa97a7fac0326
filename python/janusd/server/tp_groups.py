"""Tensor-parallel instances in the daemon ([P], DESIGN.md "Tensor parallelism"): an
instance of a model with tp = N sits on the aligned device group [lead, lead + N) and is
keyed by its lead everywhere (the core's Instance.device, the Dispatcher's EPDT, the
controller's views), as control/groups.py keys it.

The lead device's worker serves the instance: it is the only worker the core sends the
instance's Tokenize, Generate and Abort to. Every other worker of the group holds one
shard in its own device's pool and steps in lockstep with the lead (engine/worker_tp.py).
A load is one operation on the whole group (`load_group`): the lead hosts the rendezvous
store (OpenGroup), every worker gets its shard's LoadModel at once, and the instance is
Active only when every shard loaded. The group lives and dies whole: when one of its
workers dies, the daemon kills the others (`group_peers`), so every shard restarts, the
core fails the lead's requests at the lead's death (within the single worker's bound),
and the instance loads again once every worker of the group is back (`waiting_on`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from janusd.core import Instance, ServingCore
from janusd.lifecycle.states import InstanceState, holds_device_memory
from janusd.server.workers import WorkerError, WorkerHandle
from janusd.wire import worker_msgs as wm

S = InstanceState


def tp_of(core: ServingCore, inst: Instance) -> int:
    m = core.model(inst.model)
    return m.cfg.tp if m is not None else 1


def group_of(core: ServingCore, inst: Instance) -> range:
    """The devices of `inst`'s group (its lead alone for tp 1)."""
    return range(inst.device, inst.device + tp_of(core, inst))


def group_peers(core: ServingCore, device: int) -> set[int]:
    """The other devices of every tp group on `device` whose instance holds something on its
    workers (not Unloaded or Cold): they are killed when `device`'s worker dies."""
    out: set[int] = set()
    for m in core.models().values():
        if m.cfg.tp <= 1:
            continue
        for inst in m.instances.values():
            g = range(inst.device, inst.device + m.cfg.tp)
            if device in g and inst.state not in (S.UNLOADED, S.COLD):
                out |= set(g)
    out.discard(device)
    return out


def waiting_on(core: ServingCore, device: int) -> list[Instance]:
    """The tp instances led by another device that wait (Loading) for `device`'s worker."""
    out = []
    for m in core.models().values():
        if m.cfg.tp <= 1:
            continue
        out += [i for i in m.instances.values()
                if i.state is S.LOADING and i.device != device and device in range(i.device, i.device + m.cfg.tp)]
    return out


def held_by(core: ServingCore, devices: range, name: str) -> str:
    """The instances (other than `name`'s led by devices[0]) whose device group holds
    device memory on any of `devices`, said for an error; "" when they are free (a group's
    devices are held whole: control/groups.py held_devices, the same rule)."""
    out = []
    for m in core.models().values():
        for inst in m.instances.values():
            if (m.name, inst.device) == (name, devices[0]) or not holds_device_memory(inst.state):
                continue
            g = range(inst.device, inst.device + m.cfg.tp)
            if set(g) & set(devices):
                out.append(f"{m.name!r} on device{'s' if len(g) > 1 else ''} {g[0]}"
                           f"{f'-{g[-1]}' if len(g) > 1 else ''} is {inst.state.value}")
    return "; ".join(out)


def unready(workers: Sequence[WorkerHandle], group: range) -> list[int]:
    return [d for d in group if not workers[d].ready]


async def load_group(workers: Sequence[WorkerHandle], group: range, make: Callable[[int, wm.TPPlace | None], Any],
                     timeout_s: float, step_timeout_s: float) -> list[wm.ModelLoaded]:
    """Load one tp instance on its group: the lead's store, then every shard's LoadModel at
    once (`make(seq, place)` builds one; a fork's names each shard's source). Every shard's
    ModelLoaded by rank (the lead's first), or WorkerError naming the first shard that
    failed; a shard that loaded while another failed frees itself (the shards agree before
    any registers, engine/worker_tp.py)."""
    lead = workers[group[0]]
    name_probe = make(0, None)
    opened: wm.GroupOpened = await lead.call(lambda seq: wm.OpenGroup(seq, name_probe.model.name), timeout_s)
    size = len(group)

    def shard(rank: int) -> Any:
        place = wm.TPPlace(rank, size, "127.0.0.1", opened.port, step_timeout_s)
        return workers[group[rank]].call(lambda seq: make(seq, place), timeout_s)

    results = await asyncio.gather(*(shard(r) for r in range(size)), return_exceptions=True)
    failed = [(rank, r) for rank, r in enumerate(results) if isinstance(r, BaseException)]
    for _, r in failed:
        if not isinstance(r, WorkerError | asyncio.TimeoutError):
            raise r
    if failed:  # the shards agree before any registers, so each says why the group failed: said once
        said = {str(r) or "load timed out": r for _, r in failed}
        rank, first = failed[0]
        where = f"tp group {group[0]}-{group[-1]}" if len(said) == 1 else f"tp shard {rank} (device {group[rank]})"
        raise WorkerError(f"{where}: {next(iter(said))}", getattr(first, "kind", "unavailable"))
    return list(results)  # type: ignore[arg-type]

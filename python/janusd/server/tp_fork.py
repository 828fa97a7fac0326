"""A D2D fork of a tensor-parallel instance to another device group, shard by shard ([P];
DESIGN.md "Tensor parallelism"; the single-device fork is server/lifecycle_ops.py's).

Shard i of the source group goes to shard i of the target group, every shard at once: each
source shard's worker publishes its own weight segment (PublishWeights, as a single
device's source does), then the target group is loaded as a group is (server/tp_groups.py
load_group: a rendezvous store on the target lead, every target worker's LoadModel at
once) with each shard's LoadModel naming its source shard (`fork`): the target shard reads
those bytes over Mooncake instead of its slices of the checkpoint (engine/worker_tp.py,
engine/worker_fork.py pull_shard). The group is Active only when every shard is: the
shards agree before any registers, as on a load.

A shard whose fork fails falls back for that shard only, as a single-device fork does: a
source shard that cannot publish gets no source, a target shard whose pull fails or does
not verify reads its slices from the checkpoint (a Cold read; the target of a group fork
holds nothing to restore from: it is Unloaded or Cold). The reply names every shard's path
and fallback. A Warm target group comes back from its own host copies instead (H2D, the
reply's `fallback` says why): its shards hold a process group a fork's load would not join.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from janusd.config import LifecycleConfig
from janusd.core import Instance, ServingCore
from janusd.lifecycle.states import InstanceState, check_transition
from janusd.log import log
from janusd.server.model_ops import ModelOps
from janusd.server.tp_groups import held_by, load_group
from janusd.server.workers import WorkerError
from janusd.wire import worker_msgs as wm

S = InstanceState


class ForkHost(Protocol):
    """What this uses of server/lifecycle_ops.py's LifecycleOps (which calls it: no import circle)."""

    core: ServingCore
    ops: ModelOps
    cfg: LifecycleConfig
    fork_fallbacks: int

    def observe(self, model: str, op: str, phases: dict[str, float], outcome: str) -> None: ...

    def fork_pace(self, source_device: int) -> LifecycleConfig: ...

    async def publish(self, name: str, device: int, timeout_s: float) -> wm.ForkSource: ...


# why a fork to a Warm group restores it from its host copies instead (module doc)
WARM_GROUP = "a Warm tp group comes back from its own host copies (H2D), not by a fork"


def check_group_fork(core: ServingCore, workers: int, name: str, tp: int, src: int, dst: int) -> None:
    """ValueError naming what is wrong with forking `name`'s group led by `src` to the group
    led by `dst` (leads of aligned groups, disjoint, on free devices)."""
    if dst % tp:
        raise ValueError(f"fork: {name} is a tp {tp} model; --to {dst} is not the lead of an aligned group "
                         f"(leads are multiples of {tp}: lead {dst - dst % tp} serves devices "
                         f"{dst - dst % tp}-{dst - dst % tp + tp - 1})")
    if dst + tp > workers:
        raise ValueError(f"fork: the group led by {dst} needs devices {dst}-{dst + tp - 1}; there are {workers}")
    if src == dst:
        raise ValueError("fork: --from and --to are the same device group")
    if held := held_by(core, range(dst, dst + tp), name):
        raise ValueError(f"fork: devices {dst}-{dst + tp - 1} are not free for a tp {tp} group: {held}")


async def fork_group(life: ForkHost, source: Instance, target: Instance) -> dict[str, Any]:
    """`ctl fork NAME --from S --to T` (or the controller's Activate with a source) of a tp
    model: the target group becomes Active from the source group's shards (module doc).
    The caller checked the groups (check_group_fork), claimed the target and sent a Warm
    target to its own restore (WARM_GROUP)."""
    name, clock = source.model, life.ops.clock
    tp = life.core.models()[name].cfg.tp
    src, dst = range(source.device, source.device + tp), range(target.device, target.device + tp)
    if source.state is not S.ACTIVE:
        raise ValueError(f"fork: {name} on device {source.device} is {source.state.value}, not active: "
                         "nothing to fork from")
    check_transition(target.state, S.FORKING, f"{name} on device {target.device}")
    prev = target.state
    sources = await _publish(life, name, src)
    life.core.set_state(target, S.FORKING, clock())
    t0 = clock()
    paced = wm.WorkerLifecycle.of(life.fork_pace(source.device))
    cfg = life.core.models()[name].engine_cfg(target.device)

    def make(seq: int, place: wm.TPPlace | None = None) -> wm.LoadModel:
        fork = sources[place.rank] if place is not None else None
        return wm.LoadModel(seq, wm.WorkerModel.of(cfg), wm.WorkerEngine.of(life.ops.engine), life.ops.cache_dir,
                            paced, place, fork)

    try:
        async with life.ops.locked(dst):
            replies = await load_group(life.ops.workers, dst, make, life.ops.load_timeout_s + life.cfg.fork_timeout_s,
                                       life.ops.tp_timeout_s)
    except (WorkerError, asyncio.TimeoutError) as e:
        err = str(e) or "timed out"
        if target.state is S.FORKING:
            life.core.set_state(target, prev, clock(), error=err)
        life.observe(name, "fork", {}, "failed")
        raise ValueError(f"fork of {name} to devices {dst[0]}-{dst[-1]} failed ({err}); it is "
                         f"{target.state.value} again") from None
    total = clock() - t0
    if target.state is not S.FORKING:  # unloaded or removed meanwhile: free it again
        await life.ops.unload_on_worker(name, target.device)
        raise ValueError(f"{name} on device {target.device} left forking while it forked (now {target.state.value})")
    return _ended(life, target, source, prev, replies, sources, total)


async def _publish(life: ForkHost, name: str, src: range) -> list[wm.ForkSource | None]:
    """Every source shard's publication at once; None for a shard that could not publish
    (its target shard then reads its slices: that shard alone falls back)."""
    async def one(device: int) -> wm.ForkSource | None:
        try:
            return await life.publish(name, device, life.ops.reply_timeout_s)
        except (WorkerError, asyncio.TimeoutError) as e:
            log.log(logging.WARNING, f"fork of {name}: the source shard on device {device} cannot publish its "
                                     f"weights ({e or 'timed out'}); its target shard reads the checkpoint")
            return None

    return list(await asyncio.gather(*(one(d) for d in src)))


def _ended(life: ForkHost, target: Instance, source: Instance, prev: InstanceState, replies: list[wm.ModelLoaded],
           sources: list[wm.ForkSource | None], total: float) -> dict[str, Any]:
    """The target group is Active: record it, count the shards that fell back, the reply."""
    name = target.model
    shards: list[dict[str, Any]] = []
    for rank, (r, s) in enumerate(zip(replies, sources, strict=True)):
        path, fallback, nbytes, seconds = r.arrival
        fallback = fallback or ("" if s is not None else "its source shard could not publish its weights")
        shards.append({"device": target.device + rank, "path": path, "bytes": nbytes,
                       "transfer_s": round(seconds, 4), **({"fallback": fallback} if fallback else {})})
        if fallback:
            life.fork_fallbacks += 1
            log.log(logging.WARNING, f"fork of {name}: shard {rank} (device {target.device + rank}) fell back to "
                                     f"{path}: {fallback}")
    lead = replies[0]
    life.core.loaded(target, life.ops.clock(), lead.max_model_len, total, lead.prefill_probe)
    fell = any("fallback" in s for s in shards)
    transfer = float(max((s["transfer_s"] for s in shards), default=0.0))
    life.observe(name, "fork", {"transfer": transfer}, "fallback" if fell else "ok")
    paths = {s["path"] for s in shards}
    out: dict[str, Any] = {
        "model": name, "device": target.device, "state": target.state.value, "from": prev.value,
        "path": paths.pop() if len(paths) == 1 else "mixed", "source_device": source.device,
        "devices": [s["device"] for s in shards], "shards": shards, "bytes": sum(s["bytes"] for s in shards),
        "phases": {"transfer": transfer}, "total_s": round(total, 4)}
    if fell:
        out["fallback"] = "; ".join(f"shard {i}: {s['fallback']}" for i, s in enumerate(shards) if "fallback" in s)
    return out

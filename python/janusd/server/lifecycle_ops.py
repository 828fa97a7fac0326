"""Active / Warm / Cold against real workers: `ctl state`, `ctl fork`, start states from
config, and waking a Warm or Cold model when a request for it arrives (PAPER.md §8).

The core owns each instance's state and the table of moves (lifecycle/states.py); this
file drives the moves that need a worker: it sets the transitional state (Draining,
Restoring, Forking), sends SetState / PublishWeights, and on the answer sets the resting
state, or rolls back to where the instance was (an out-of-memory wake-up leaves it Warm
or Cold, never half-loaded). Every answer carries the phases (drain, prepare, transfer,
restore, first_token) the metrics and `ctl` show. Which way an instance comes back is
chosen by estimated time (lifecycle/restore_path.py) from bandwidths measured here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

from janusd.config import LifecycleConfig
from janusd.control.wake import wake_op
from janusd.core import Failure, Instance
from janusd.lifecycle.restore_path import Bandwidths, choose, options_for
from janusd.lifecycle.states import TARGETS, InstanceState, check_transition
from janusd.log import log
from janusd.server.daemon_clock import clock
from janusd.server.decisions import DecisionLog
from janusd.server.drain import drain
from janusd.server.model_ops import ModelOps
from janusd.server.tp_fork import WARM_GROUP, check_group_fork, fork_group
from janusd.server.tp_lifecycle import set_group_state
from janusd.server.workers import WorkerError
from janusd.wire import worker_msgs as wm

S = InstanceState


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


class LifecycleOps:
    def __init__(self, ops: ModelOps, cfg: LifecycleConfig,
                 observe: Callable[[str, str, dict[str, float], str], None] = lambda *a: None) -> None:
        """`observe(model, op, phases, outcome)`: the metrics' hook (op: activate, deactivate,
        fork; outcome: ok, failed, fallback)."""
        self.ops = ops
        self.core = ops.core
        self.cfg = cfg
        self.observe = observe
        self.bw = Bandwidths()
        self._busy: set[tuple[str, int]] = set()
        # (model, device) -> the state a move was asked for when its worker went away mid-way:
        # asked again when the worker is back (`resume`), so an activation a worker's death
        # interrupted ends Active, and the requests held for it follow
        self.wanted: dict[tuple[str, int], str] = {}
        self.weight_bytes: dict[str, int] = {}  # model -> bytes of its weight segment (learnt)
        self.fork_fallbacks = 0
        self.decisions: DecisionLog | None = None  # where a wake is recorded (the daemon's ring)

    # ---- the admin operations ----
    async def set_state(self, name: str, device: int, target: str, probe: bool = True,
                        role: str | None = None) -> dict[str, Any]:
        """`ctl state NAME --device N active|warm|cold`: the reply holds the new state, the
        path the weights took and the seconds of each phase (with `probe`, an activation
        runs one greedy token first: the first_token phase). `role` (an activation of a P/D
        model's instance, the controller's choice): the engine role it comes up in; an
        Active instance keeps its role (drain it to Warm first). A pinned model (config
        `devices`) is moved only where it has an instance: elsewhere `ctl fork` places one
        (a Warm copy on another device would hold host memory the config never gave it)."""
        m = self.core.model(name)
        if m is not None and m.cfg.devices and device not in m.cfg.devices and \
                (device not in m.instances or m.instances[device].state is S.UNLOADED):
            raise ValueError(f"{name} is configured on devices {sorted(m.cfg.devices)}, not {device}: `ctl state` "
                             f"moves an instance it has there; `ctl fork {name} --from D --to {device}` places one")
        inst = self._instance(name, device)
        if target not in TARGETS:
            raise ValueError(f"state must be active, warm or cold, got {target!r}")
        want = TARGETS[target]
        if role is not None and want is not S.ACTIVE:
            raise ValueError(f"a role is chosen at activation, not when going {target}")
        if inst.state is want and (role is None or role == inst.role):
            return {"model": name, "device": device, "state": want.value, "role": inst.role, "unchanged": True}
        if inst.state is want:
            raise ValueError(f"{name} on device {device} is active as {inst.role}: it takes the role {role} only "
                             "when it comes back from warm or cold")
        with self._claim(inst):
            if self.core.models()[name].cfg.tp > 1:  # a tp group moves whole (server/tp_lifecycle.py)
                return await set_group_state(self, inst, want, probe)
            if want is S.ACTIVE:
                before = inst.role
                if role is not None and role != before:
                    self.core.set_role(inst, role, self.ops.clock())  # raises unless it rests
                try:
                    return await self._activate(inst, probe=probe)
                except BaseException:
                    with contextlib.suppress(ValueError):  # rolled back to rest: its old role too
                        self.core.set_role(inst, before, self.ops.clock())
                    raise
            if inst.state is S.ACTIVE:
                return await self._deactivate(inst, want)
            return await self._rest(inst, want)

    async def fork(self, name: str, src: int, dst: int) -> dict[str, Any]:
        """`ctl fork NAME --from N --to M`: M pulls N's weights over the transfer engine."""
        source = self._instance(name, src)
        if (m := self.core.model(name)) is not None and m.cfg.tp > 1:  # shard by shard (server/tp_fork.py)
            check_group_fork(self.core, len(self.ops.workers), name, m.cfg.tp, src, dst)
            if (target := self.core.instance(name, dst)).state is S.WARM:
                return {**await self.set_state(name, dst, "active", probe=False), "fallback": WARM_GROUP}
            with self._claim(target):
                return await fork_group(self, source, target)
        if src == dst:
            raise ValueError("fork: --from and --to are the same device")
        if source.state is not S.ACTIVE:
            raise ValueError(f"fork: {name} on device {src} is {source.state.value}, not active: nothing to fork from")
        if dst >= len(self.ops.workers):
            raise ValueError(f"fork: device {dst} does not exist")
        target = self.core.instance(name, dst)
        check_transition(target.state, S.FORKING, f"{name} on device {dst}")
        with self._claim(target):
            return await self._activate(target, fork_from=source)

    async def replace(self, name: str, device: int) -> dict[str, Any]:
        """Load `name` on `device` because the device it served on is lost for good (its node
        left the cluster): a pinned model's `devices` name where the operator wanted it,
        not a device that no longer exists, so the pin does not hold it back here."""
        inst = self._instance(name, device)
        with self._claim(inst):
            return await self._activate(inst)

    async def start(self, inst: Instance, state: str) -> None:
        """Bring a configured instance to its start state (config warm_devices / cold_devices)."""
        if state == "cold":
            self.core.set_state(inst, S.COLD, self.ops.clock())
            return
        if state == "warm":
            try:
                with self._claim(inst):
                    await self._rest(inst, S.WARM)
            except (ValueError, WorkerError) as e:
                _log(f"{inst.model} on device {inst.device}: cannot start warm: {e}", logging.WARNING)
            return
        await self.ops.load(inst)

    def resume(self, device: int) -> list[Coroutine[Any, Any, None]]:
        """The worker of `device` is back: the moves its death interrupted (`wanted`),
        asked again, as coroutines for the caller to run."""
        out = []
        for (name, d), target in sorted(self.wanted.items()):
            if d != device:
                continue
            del self.wanted[(name, d)]
            if self.core.model(name) is None:
                continue

            async def go(name: str = name, target: str = target) -> None:
                try:
                    await self.set_state(name, device, target, probe=False)
                    _log(f"{name} on device {device}: {target} again after its worker came back")
                except (ValueError, WorkerError) as e:
                    _log(f"{name} on device {device}: going {target} after its worker came back failed: {e}",
                         logging.WARNING)

            out.append(go())
        return out

    def wake(self, name: str) -> asyncio.Task[Any] | None:
        """A request for `name` found no Active instance: start activating one of its Warm
        (else Cold) instances, unless one is already coming up. Returns the task, if any."""
        if not self.cfg.wake_on_request:
            return None
        m = self.core.model(name)
        if m is None:
            return None
        nbytes = self.weight_bytes.get(name, 1 << 30)
        busy = {d for (model, d) in self._busy if model == name}
        op = wake_op(name, m.instances, m.pd, lambda st: self.bw.restore_s(st.value, nbytes), busy)
        if op is None:
            return None
        inst, role = m.instances[op.device], op.role
        rec = self.decisions.carried(op, clock()) if self.decisions is not None else None

        async def go() -> None:
            outcome = "ok"
            try:
                await self.set_state(name, inst.device, "active", probe=False, role=role)  # the request is its probe
            except (ValueError, WorkerError) as e:
                outcome = f"{type(e).__name__}: {e}"
                _log(f"waking {name} on device {inst.device} failed: {e}", logging.WARNING)
            if rec is not None and self.decisions is not None:
                self.decisions.ended(rec, outcome, clock())

        _log(f"a request for {name} woke its {inst.state.value} instance on device {inst.device}"
             + (f" as {role}" if role else ""))
        return asyncio.get_running_loop().create_task(go(), name=f"wake-{name}")

    # ---- moves ----
    def _instance(self, name: str, device: int) -> Instance:
        m = self.core.model(name)
        if m is None:
            raise ValueError(f"model {name!r} does not exist")
        if not isinstance(device, int) or not 0 <= device < len(self.ops.workers):
            raise ValueError(f"device {device} does not exist ({len(self.ops.workers)} devices)")
        return self.core.instance(name, device)

    class _Claim:
        def __init__(self, busy: set[tuple[str, int]], key: tuple[str, int]) -> None:
            self.busy, self.key = busy, key

        def __enter__(self) -> None:
            if self.key in self.busy:
                raise ValueError(f"{self.key[0]} on device {self.key[1]} is already changing state")
            self.busy.add(self.key)

        def __exit__(self, *exc: object) -> None:
            self.busy.discard(self.key)

    def _claim(self, inst: Instance) -> LifecycleOps._Claim:
        return LifecycleOps._Claim(self._busy, (inst.model, inst.device))

    def _msg(self, inst: Instance, target: str, fork: wm.ForkSource | None = None,
             probe: bool = True, life: LifecycleConfig | None = None) -> Callable[[int], wm.SetState]:
        m = self.core.models()[inst.model]
        cfg = m.engine_cfg(inst.device)
        life = life or self.cfg
        model, engine, carried = wm.WorkerModel.of(cfg), wm.WorkerEngine.of(self.ops.engine), wm.WorkerLifecycle.of(life)
        return lambda seq: wm.SetState(seq, model, engine, self.ops.cache_dir, target,  # type: ignore[arg-type]
                                       carried, fork, probe)

    def state_msg(self, inst: Instance, target: str, probe: bool) -> Callable[[int], wm.SetState]:
        """SetState of `inst`'s model to `target` (server/tp_lifecycle.py sends it to each shard's worker)."""
        return self._msg(inst, target, None, probe)

    def fork_pace(self, source_device: int) -> LifecycleConfig:
        """The lifecycle settings a fork's target gets: its pull paced only while the source
        device has requests in flight (an idle source has no decode to protect)."""
        if self.cfg.fork_bandwidth_mib_s and not self.core.requests_on(source_device):
            return msgspec.structs.replace(self.cfg, fork_bandwidth_mib_s=0)
        return self.cfg

    async def _call(self, inst: Instance, make: Callable[[int], Any], timeout_s: float) -> Any:
        w = self.ops.workers[inst.device]
        async with self.ops._locks[inst.device]:
            return await w.call(make, timeout_s)

    async def publish(self, name: str, device: int, timeout_s: float) -> wm.ForkSource:
        """Have `device`'s worker publish `name`'s weights for a fork (its pieces and sampled
        checksums); WorkerError or TimeoutError when it cannot."""
        async with self.ops._locks[device]:
            pub = await self.ops.workers[device].call(lambda seq: wm.PublishWeights(
                seq, name, self.cfg.fork_verify_blocks, self.cfg.fork_verify_block_kib << 10), timeout_s)
        return pub.source  # type: ignore[no-any-return]

    async def _activate(self, inst: Instance, fork_from: Instance | None = None, probe: bool = True) -> dict[str, Any]:
        name, clock = inst.model, self.ops.clock
        prev = inst.state
        if prev is S.UNLOADED and fork_from is None:
            t0 = clock()
            await self.ops.load(inst)  # a full load (Unloaded keeps nothing to restore from)
            if inst.state is not S.ACTIVE:
                raise ValueError(f"{name} on device {inst.device} failed to load: {inst.error}")
            return {"model": name, "device": inst.device, "state": "active", "path": "checkpoint",
                    "phases": {"total": round(clock() - t0, 4)}}
        peer = fork_from
        if peer is None:  # a fork when a serving peer is estimated to be faster than our own path
            peers = [i for i in self.core.models()[name].instances.values()
                     if i.state is S.ACTIVE and i.device != inst.device]
            nbytes = self.weight_bytes.get(name, 1 << 30)
            if peers and choose(options_for(prev.value, True), nbytes, self.bw) == "d2d":
                peer = peers[0]
        source = None
        if peer is not None:
            try:
                source = await self.publish(name, peer.device, 30.0)
            except (WorkerError, asyncio.TimeoutError) as e:
                if fork_from is not None:
                    raise ValueError(f"fork: the source on device {peer.device} cannot publish its weights: {e}") \
                        from None
        self.core.set_state(inst, S.FORKING if source is not None else S.RESTORING, clock())
        t0 = clock()
        try:
            life = self.fork_pace(peer.device) if source is not None and peer is not None else self.cfg
            reply: wm.StateSet = await self._call(inst, self._msg(inst, "active", source, probe, life),
                                                  self.ops.load_timeout_s + (self.cfg.fork_timeout_s if source else 0))
        except (WorkerError, asyncio.TimeoutError) as e:
            err = str(e) or "timed out"
            if inst.state in (S.RESTORING, S.FORKING):
                self.core.set_state(inst, prev, clock(), error=err)  # back where it was: Warm, Cold, Unloaded
            self.observe(name, "fork" if source else "activate", {}, "failed")
            if self.ops.workers[inst.device].state != "ready":  # its worker went away: asked again on its return
                self.wanted[(name, inst.device)] = S.ACTIVE.value
                raise ValueError(f"{name} on device {inst.device}: its worker went away while it became active "
                                 f"({err}); it is {inst.state.value} now and becomes active when the worker is "
                                 "back") from None
            raise ValueError(f"{name} on device {inst.device} could not become active ({err}); it is "
                             f"{inst.state.value} again") from None
        total = clock() - t0
        if inst.state not in (S.RESTORING, S.FORKING):  # unloaded or removed meanwhile: free it again
            await self._call(inst, lambda seq: wm.UnloadModel(seq, name), 60.0)
            raise ValueError(f"{name} on device {inst.device} left {S.RESTORING.value} while it restored "
                             f"(now {inst.state.value}); what was restored is freed")
        self.weight_bytes[name] = reply.nbytes or self.weight_bytes.get(name, 0)
        if reply.path in ("d2d", "h2d"):
            self.bw.observe(reply.path, reply.nbytes, reply.phases.get("transfer", 0.0))
        elif reply.path in ("image", "checkpoint"):  # a Cold start: opening counts, it is the cost
            self.bw.observe("checkpoint", reply.nbytes,
                            reply.phases.get("prepare", 0.0) + reply.phases.get("transfer", 0.0))
        if reply.fallback:
            self.fork_fallbacks += 1
            _log(f"fork of {name} to device {inst.device} fell back to {reply.path}: {reply.fallback}",
                 logging.WARNING)
        self.core.loaded(inst, clock(), reply.max_model_len, total, self._borrowed_fit(inst))
        op = "fork" if source is not None else "activate"
        self.observe(name, op, reply.phases, "fallback" if reply.fallback else "ok")
        out = {"model": name, "device": inst.device, "state": inst.state.value, "from": prev.value,
               "path": reply.path, "bytes": reply.nbytes, "phases": _rounded(reply.phases),
               "total_s": round(total, 4)}
        if reply.fallback:
            out["fallback"] = reply.fallback
        if source is not None and peer is not None:
            out["source_device"] = peer.device
        return out

    def _borrowed_fit(self, inst: Instance) -> list[tuple[int, float]]:
        """Prefill (tokens, seconds) points for an instance restored on a device where the
        model never ran: from the fit of another device that has samples (a restore runs
        no prefill probe; without this the first long prompt would meet the bare prior).
        Empty when the device has its own fit already (a restore keeps it)."""
        fits = self.core.prefill_fits(inst.model)
        own = fits.get(inst.device)
        if own is not None and own.n:
            return []
        peers = [e for d, e in fits.items() if d != inst.device and e.n]
        if not peers:
            return []
        best = max(peers, key=lambda e: e.n)
        return [(n, best.estimate(n)) for n in (16, 256)]

    async def _deactivate(self, inst: Instance, want: InstanceState) -> dict[str, Any]:
        """Active -> Warm/Cold: stop routing, drain (bounded, then abort), free."""
        name, clock = inst.model, self.ops.clock
        t0 = clock()
        drain_s, aborted = await drain(self.core, inst, self.ops.drain_timeout_s, Failure(
            503, f"model {name!r} on device {inst.device} went {want.value} before this request finished (drain "
            f"bound {self.ops.drain_timeout_s:g} s)", code="model_deactivated"), self.ops.poke)
        try:
            reply: wm.StateSet = await self._call(inst, self._msg(inst, want.value), self.ops.load_timeout_s)
        except (WorkerError, asyncio.TimeoutError) as e:
            # the worker detached the model before failing: nothing of it serves any more
            if inst.state is S.DRAINING:
                self.core.set_state(inst, S.UNLOADED, clock(), error=str(e))
            self.observe(name, "deactivate", {}, "failed")
            raise ValueError(f"{name} on device {inst.device}: leaving active failed: {e}") from None
        if inst.state is S.DRAINING:
            self.core.set_state(inst, want, clock())
        phases = {"drain": drain_s, **reply.phases}
        self.observe(name, "deactivate", phases, "ok")
        return {"model": name, "device": inst.device, "state": inst.state.value, "from": "active",
                "aborted_requests": aborted, "bytes": reply.nbytes, "phases": _rounded(phases),
                "total_s": round(clock() - t0, 4)}

    async def _rest(self, inst: Instance, want: InstanceState) -> dict[str, Any]:
        """Between resting states: Cold/Unloaded -> Warm (read the host copy), Warm -> Cold,
        Unloaded -> Cold."""
        name, clock = inst.model, self.ops.clock
        prev = inst.state
        if prev is S.UNLOADED and want is S.WARM:
            self.core.set_state(inst, S.LOADING, clock())
        else:
            check_transition(prev, want, f"{name} on device {inst.device}")
        t0 = clock()
        if prev is S.UNLOADED and want is S.COLD:
            self.core.set_state(inst, S.COLD, clock())
            return {"model": name, "device": inst.device, "state": "cold", "from": prev.value, "phases": {}}
        try:
            reply: wm.StateSet = await self._call(inst, self._msg(inst, want.value), self.ops.load_timeout_s)
        except (WorkerError, asyncio.TimeoutError) as e:
            if inst.state is S.LOADING:
                self.core.load_failed(inst, clock(), str(e))
            raise ValueError(f"{name} on device {inst.device} could not become {want.value} ({e}); it is "
                             f"{inst.state.value}") from None
        if inst.state is prev or inst.state is S.LOADING:
            self.core.set_state(inst, want, clock())
        if reply.nbytes:
            self.weight_bytes[name] = reply.nbytes
        self.observe(name, "deactivate" if want is S.COLD else "stage", reply.phases, "ok")
        return {"model": name, "device": inst.device, "state": inst.state.value, "from": prev.value,
                "bytes": reply.nbytes, "phases": _rounded(reply.phases), "total_s": round(clock() - t0, 4)}


def _rounded(phases: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in phases.items()}

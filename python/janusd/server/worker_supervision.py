"""The daemon's side of its worker processes' events (server/workers.py's callbacks):
tokens, request failures and KV messages go to the core with the daemon's clock; a
dead or hung worker fails its requests and is restarted after its back-off, or its
device is given up once the restart budget is spent (server/restart_policy.py); a tp
group's workers die and come back together (server/tp_groups.py). A part
of server/daemon.py's Daemon (a mixin), apart from its life cycle: what happens
between a worker's start and the daemon's stop."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from janusd.config import JanusConfig
from janusd.core import ServingCore
from janusd.log import log
from janusd.server.daemon_clock import clock
from janusd.server.lifecycle_ops import LifecycleOps
from janusd.server.model_ops import ModelOps
from janusd.server.process_states import DaemonState
from janusd.server.restart_policy import RestartBudget
from janusd.server.tp_groups import group_peers, waiting_on
from janusd.server.workers import WorkerError, WorkerHandle
from janusd.wire import worker_msgs as wm


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


class WorkerSupervision:
    """What it uses of the Daemon (made in Daemon.__init__)."""

    state: DaemonState
    core: ServingCore
    ops: ModelOps
    restarts: dict[int, RestartBudget]
    life: LifecycleOps
    workers: list[WorkerHandle]
    homeless: set[str]  # models a node loss left with no ready device (server/node_joins.py)

    if TYPE_CHECKING:
        @property
        def cfg(self) -> JanusConfig: ...

        def poke(self) -> None: ...

        def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]: ...

        def _wake_model(self, model: str) -> None: ...

    def _on_batch(self, w: WorkerHandle, batch: wm.StepBatch) -> None:
        self.core.on_batch(w.device_index, batch, clock())
        if self.core.tick_wanted():  # a prefill ended early or the decode guard moved: re-plan now
            self.poke()

    def _on_failed(self, w: WorkerHandle, f: wm.RequestFailed) -> None:
        self.core.on_failed(w.device_index, f, clock())

    def _on_kv(self, w: WorkerHandle, msg: wm.KVReady | wm.KVImported) -> None:
        self.core.on_kv(w.device_index, msg, clock())

    def _on_death(self, w: WorkerHandle) -> None:
        dev = w.device_index
        how = "hung" if w.hung else "died"
        _log(f"worker for device {dev} (pid {w.pid}) {how}; failing its requests and restarting it", logging.WARNING)
        peers = group_peers(self.core, dev)  # read before the core moves the instances on
        self.core.on_worker_death(dev, clock(), code="worker_hung" if w.hung else "worker_died",
                                  why=f"hung ({w.hung})" if w.hung else "died")
        for d in sorted(peers):  # a tp group lives and dies whole (server/tp_groups.py)
            self.workers[d].kill(f"its tp group's worker on device {dev} {how}")
        self.poke()
        if self.state in (DaemonState.RUNNING, DaemonState.STARTING):
            self._spawn(self._restart(w), f"restart{dev}")

    def _give_up(self, w: WorkerHandle, why: str, absent: bool = False) -> None:
        """The device serves nothing: failed (its restart budget is spent), or absent (its
        node left; a node that joins may take the slot, server/node_joins.py)."""
        if absent:
            w.absent()
        else:
            w.fail()
        _log(f"device {w.device_index} {'absent' if absent else 'failed'}: {why}")
        self.core.on_device_failed(w.device_index, clock())
        for inst in waiting_on(self.core, w.device_index):  # tp groups it was in cannot load either
            self.core.load_failed(inst, clock(), f"device {w.device_index} of its tp group is {w.state}")

    def _device_gone(self, w: WorkerHandle, why: str) -> None:
        """The device's node left the cluster (the ray launcher): the slot is absent at once,
        and each model it served (Active when it died) that has no instance serving or
        resting elsewhere is loaded on the ready device holding the fewest instances (the
        other nodes' instances are not moved); with no ready device it waits for a node
        that joins (`homeless`)."""
        # those it served: its death sent them Loading (a Warm one went Cold: left to rest)
        lost = sorted({i.model for i in self._placed_on(w.device_index) if i.state.value == "loading"})
        self._give_up(w, why, absent=True)
        for model in lost:
            m = self.core.model(model)
            if m is None or any(i.state.value not in ("unloaded", "cold") for i in m.instances.values()):
                continue
            ready = [x.device_index for x in self.workers if x.ready]
            if not ready:
                _log(f"{model}: no ready device left to serve it on; it waits for a node to join", logging.WARNING)
                self.homeless.add(model)
                continue
            dst = min(ready, key=lambda d: (len(self._placed_on(d)), d))
            _log(f"{model} served on lost device {w.device_index}: loading it on device {dst}")
            self._spawn(self._replace(model, dst), f"replace-{model}")

    def _placed_on(self, device: int) -> list[Any]:
        """The instances on `device` that hold or are getting weights (not Unloaded)."""
        return [i for m in self.core.models().values() for i in m.instances.values()
                if i.device == device and i.state.value != "unloaded"]

    async def _replace(self, model: str, device: int) -> None:
        try:
            await self.life.replace(model, device)
        except (ValueError, WorkerError) as e:
            _log(f"{model}: re-placing it on device {device} failed: {e}", logging.WARNING)
        self.poke()

    async def _restart(self, w: WorkerHandle) -> None:
        """Restart a dead worker after its back-off; give the device up (failed) once its
        restart budget is spent (server/restart_policy.py)."""
        budget = self.restarts[w.device_index]
        while self.state in (DaemonState.RUNNING, DaemonState.STARTING):
            delay = budget.on_death(clock())
            if delay is None:
                self._give_up(w, f"its worker died {budget.budget + 1} times within {budget.window_s:g} s; "
                                 "not restarting it (see the worker log above)")
                return
            await asyncio.sleep(delay)
            try:
                await w.start(self.cfg.server.worker_ready_timeout_s)
            except (WorkerError, OSError) as e:
                if isinstance(e, WorkerError) and e.kind == "gone":  # its node left: no restart can help
                    self._device_gone(w, str(e))
                    return
                _log(f"restarting worker {w.device_index} failed: {e}", logging.WARNING)
                continue
            w.restarts += 1
            _log(f"worker for device {w.device_index} restarted (pid {w.pid}); reloading its models")
            await self.ops.reload_device(w.device_index)
            for move in self.life.resume(w.device_index):  # moves its death interrupted, asked again
                self._spawn(move, f"resume{w.device_index}")
            for model in self.core.waiting_models():  # requests held while it was away: wake again
                self._wake_model(model)
            self.poke()
            return

"""Nodes that join the cluster (the ray launcher, [R]): their devices fill the daemon's
absent device slots, and the models waiting for a device are placed on them. A part of
server/daemon.py's Daemon (a mixin), beside worker_supervision.py (which makes a slot
absent when its node leaves).

`devices.count` stays the number of device slots: the core, the controller's snapshot
and the pools number devices 0..count-1 and never change size, so a device that comes or
goes is a slot whose worker starts or ends, as a worker restart is. A slot is absent when
no node offers it (fewer devices than count at start, or its node left); every
`ray.join_check_s` (only while some slot is absent: a Ray call, bounded, on the
launcher's thread pool) the launcher gives absent slots the free devices of alive nodes,
and each such slot's worker starts; once Ready, what waited for it is done:
- its Loading instances load (models configured on it while it was absent, as after a
  restart: ModelOps.reload_device), and moves its loss interrupted are asked again;
- each model left with nothing placed when its node left, with no ready device then
  (`homeless`), is loaded on it (LifecycleOps.replace, as after a node loss);
- models with requests held for an instance are woken.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from janusd.log import log
from janusd.server.daemon_clock import clock
from janusd.server.process_states import DaemonState, WorkerState
from janusd.server.restart_policy import RestartBudget
from janusd.server.workers import WorkerError, WorkerHandle

if TYPE_CHECKING:
    from janusd.config import JanusConfig
    from janusd.core import ServingCore
    from janusd.server.launcher import Launcher
    from janusd.server.lifecycle_ops import LifecycleOps
    from janusd.server.model_ops import ModelOps


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


class NodeJoins:
    """What it uses of the Daemon (made in Daemon.__init__)."""

    state: DaemonState
    core: ServingCore
    ops: ModelOps
    life: LifecycleOps
    launcher: Launcher
    workers: list[WorkerHandle]
    restarts: dict[int, RestartBudget]
    homeless: set[str]  # models a node loss left with nothing placed and no ready device

    if TYPE_CHECKING:
        @property
        def cfg(self) -> JanusConfig: ...

        def poke(self) -> None: ...

        def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]: ...

        def _wake_model(self, model: str) -> None: ...

        async def _replace(self, model: str, device: int) -> None: ...

        def _give_up(self, w: WorkerHandle, why: str, absent: bool = False) -> None: ...

    async def _watch_joins(self) -> None:
        """Every ray.join_check_s while the daemon serves: adopt joined nodes' devices."""
        while self.state in (DaemonState.RUNNING, DaemonState.STARTING):
            await asyncio.sleep(self.cfg.ray.join_check_s)
            absent = [w.device_index for w in self.workers if w.state is WorkerState.ABSENT]
            if not absent:
                continue
            for dev in await self.launcher.adopt(absent):
                self._spawn(self._start_joined(self.workers[dev]), f"join{dev}")

    async def _start_joined(self, w: WorkerHandle) -> None:
        """Start the worker of a slot a joined node now offers, then place what waited for it.
        A start that fails leaves the slot absent, tried again at a later check, until the
        device's restart budget is spent (then failed, as a worker that keeps dying)."""
        node = w.placement.node
        try:
            await w.start(self.cfg.server.worker_ready_timeout_s)
        except (WorkerError, OSError) as e:
            _log(f"device {w.device_index} on joined node {node}: its worker did not start: {e}", logging.WARNING)
            if w.state is not WorkerState.DEAD:  # shutdown meanwhile
                return
            budget = self.restarts[w.device_index]
            if budget.on_death(clock()) is None:
                self._give_up(w, f"its worker on joined node {node} did not start {budget.budget + 1} times "
                                 f"within {budget.window_s:g} s")
            else:
                w.absent()
            return
        _log(f"device {w.device_index} on joined node {node} is ready (pid {w.pid})")
        await self.ops.reload_device(w.device_index)  # instances configured on it while it was absent
        for move in self.life.resume(w.device_index):
            self._spawn(move, f"resume{w.device_index}")
        for model in sorted(self.homeless):
            m = self.core.model(model)
            self.homeless.discard(model)
            if m is None or any(i.state.value not in ("unloaded", "cold") for i in m.instances.values()):
                continue  # removed, or placed meanwhile
            _log(f"{model} had no device since its node left: loading it on device {w.device_index}")
            self._spawn(self._replace(model, w.device_index), f"replace-{model}")
        for model in self.core.waiting_models():
            self._wake_model(model)
        self.poke()

"""Served models and their instances (model, device): placement, load, unload.

An instance is routable only when Active: its worker is up and answered ModelLoaded.
Until then the dispatcher knows it but holds it not-ready, so requests wait in the
model's global queue (PAPER.md §2: never route to an instance that is planned but not
ready). Placement follows ModelConfig.devices; models without devices are spread
round-robin over the devices in config order (config.py refuses tp > 1: tensor
parallelism across workers is not implemented).
Roles: a model with `prefill_devices` is P/D: those instances load with the engine role
"prefill" and are the Dispatcher's machines, its other devices load as "decode"
instances that only continue requests whose KV the daemon moves to them (daemon.py
_on_kv). Every other instance serves whole requests.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field

import msgspec

from janusd.config import EngineConfig, ModelConfig
from janusd.server.requests import Failure, RequestTable
from janusd.server.scheduling import Instance, Scheduler
from janusd.server.workers import WorkerError, WorkerHandle
from janusd.wire import worker_msgs as wm


def _log(msg: str) -> None:
    print(f"janusd: {msg}", file=sys.stderr, flush=True)


@dataclass
class Placement:
    model: str
    device: int
    state: str = "loading"  # loading | active | failed | unloading
    error: str = ""
    inst: Instance | None = None
    max_model_len: int = 0
    load_s: float = 0.0


@dataclass
class ModelEntry:
    cfg: ModelConfig
    placements: dict[int, Placement] = field(default_factory=dict)
    rr: int = 0

    @property
    def active(self) -> list[Placement]:
        return [p for p in self.placements.values() if p.state == "active"]

    def role_on(self, device: int) -> str:
        """The instance role on `device`: mixed, or prefill/decode for a P/D model."""
        if not self.cfg.prefill_devices:
            return "mixed"
        return "prefill" if device in self.cfg.prefill_devices else "decode"

    def engine_cfg(self, device: int) -> ModelConfig:
        """The ModelConfig sent to the worker: its role is this instance's engine role."""
        role = self.role_on(device)
        return self.cfg if role == "mixed" else msgspec.structs.replace(self.cfg, role=role)

    @property
    def max_model_len(self) -> int:
        lens = [p.max_model_len for p in self.active]
        return min(lens) if lens else self.cfg.max_model_len


def place(models: list[ModelConfig], device_count: int) -> dict[str, list[int]]:
    """Devices for each model: its own list, or round-robin for those without one."""
    out: dict[str, list[int]] = {}
    k = 0
    for m in models:
        if m.devices:
            out[m.name] = sorted(set(m.devices))
        else:
            out[m.name] = [k % device_count]
            k += 1
    return out


class ModelManager:
    def __init__(
        self, workers: list[WorkerHandle], sched: Scheduler, requests: RequestTable, engine: EngineConfig,
        cache_dir: str, load_timeout_s: float,
    ) -> None:
        self.workers = workers
        self.sched = sched
        self.requests = requests
        self.engine = engine
        self.cache_dir = cache_dir
        self.load_timeout_s = load_timeout_s
        self.models: dict[str, ModelEntry] = {}
        self._locks = [asyncio.Lock() for _ in workers]  # one load/unload at a time per worker

    def add(self, cfg: ModelConfig, devices: list[int]) -> ModelEntry:
        entry = ModelEntry(cfg)
        for d in devices:
            entry.placements[d] = Placement(cfg.name, d)
        self.models[cfg.name] = entry
        return entry

    async def load(self, entry: ModelEntry, device: int) -> None:
        """Load entry's model on one device; on success the instance becomes Active."""
        p = entry.placements[device]
        w = self.workers[device]
        p.state, p.error = "loading", ""
        if p.inst is None:
            p.inst = self.sched.add_instance(entry.cfg.name, device, entry.role_on(device))
        cfg = entry.engine_cfg(device)
        async with self._locks[device]:
            t0 = time.monotonic()
            try:
                reply: wm.ModelLoaded = await w.call(
                    lambda seq: wm.LoadModel(seq, cfg, self.engine, self.cache_dir), self.load_timeout_s
                )
            except (WorkerError, asyncio.TimeoutError) as e:
                if self.models.get(entry.cfg.name) is entry and device in entry.placements:
                    p.state, p.error = "failed", str(e) or "load timed out"
                    _log(f"loading {entry.cfg.name} on device {device} failed: {p.error}")
                return
        if self.models.get(entry.cfg.name) is not entry or p.inst is None:
            return  # unloaded meanwhile
        p.max_model_len = reply.max_model_len
        p.load_s = time.monotonic() - t0
        p.state = "active"
        self.sched.set_ready(p.inst, True)
        _log(f"{entry.cfg.name} active on device {device} (loaded in {p.load_s:.2f} s)")

    async def load_all(self, entry: ModelEntry) -> None:
        await asyncio.gather(*(self.load(entry, d) for d in list(entry.placements)))

    def fail_instance(self, p: Placement, message: str, code: str | None = None) -> None:
        """Take an instance out of routing and fail every request it holds."""
        if p.inst is None:
            return
        returned = self.sched.remove_instance(p.inst)
        for rid in returned:
            self.requests.fail(rid, Failure(503, message, code=code))
        p.inst = None

    async def unload(self, name: str, drain_timeout_s: float) -> dict[str, int]:
        """Stop routing to `name`, let its requests finish (bounded), then free it everywhere."""
        entry = self.models.pop(name, None)
        if entry is None:
            raise KeyError(name)
        never_loaded = {d for d, p in entry.placements.items() if p.state == "failed"}
        for p in entry.placements.values():
            p.state = "unloading"
            # no new prefill work; a P/D decode instance stays ready during the drain, so a
            # request still prefilling can be handed to it and finish (fail_instance ends it)
            if p.inst is not None and p.inst.dispatched:
                self.sched.set_ready(p.inst, False)
        # queued requests have not started: tell them now instead of after the drain
        for rid in [r.rid for r in list(self.requests.by_id.values()) if r.model == name and r.worker is None]:
            self.requests.fail(rid, Failure(503, f"model {name!r} is being unloaded"))
        deadline = time.monotonic() + drain_timeout_s
        while self.requests.count(name) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        failed = 0
        for rid in [r.rid for r in list(self.requests.by_id.values()) if r.model == name]:
            w = self.requests.by_id[rid].worker
            if w is not None:
                w.send(wm.Abort(rid))
            self.requests.fail(rid, Failure(503, f"model {name!r} was unloaded"))
            failed += 1
        for p in entry.placements.values():
            self.fail_instance(p, f"model {name!r} was unloaded")
            if p.device in never_loaded:
                continue  # its load failed: the worker holds nothing to free
            w = self.workers[p.device]
            async with self._locks[p.device]:
                try:
                    await w.call(lambda seq: wm.UnloadModel(seq, name), 60.0)
                except (WorkerError, asyncio.TimeoutError) as e:
                    _log(f"unloading {name} on device {p.device}: {e}")
        return {"failed_requests": failed}

    def on_worker_death(self, device: int) -> None:
        for entry in self.models.values():
            p = entry.placements.get(device)
            if p is not None:
                self.fail_instance(p, f"the worker for device {device} died", code="worker_died")
                p.state, p.error = "loading", "worker died; restarting"

    async def reload_device(self, device: int) -> None:
        await asyncio.gather(
            *(self.load(e, device) for e in list(self.models.values()) if device in e.placements)
        )

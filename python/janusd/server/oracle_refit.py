"""The oracle in the daemon: priors, stored fits, online points and background refits.

What runs where (a fit must never delay a request):
- the event loop only samples telemetry into bounded point buffers (oracle/online.py,
  microseconds per model) and hands work out;
- a spawned helper process (one, started on first use and ended when it has no job
  left, spawn not fork: DESIGN.md, at a lower CPU priority than the daemon:
  refit_job.lower_priority) reads
  each model's checkpoint for its ModelSpec and fits GPs (oracle/refit_job.py), writing
  the fit to the store (state_dir/oracle, oracle/store.py). First use = the first model
  with something to fit: a window with traffic (a point) or a stored fit to load, or at
  once when the controller runs (`eager`: it must size a burst from its first window).
  Otherwise a daemon whose models are idle and have no stored fit never starts it (every
  test daemon would pay a Python process, imports and a checkpoint read for nothing), so
  such a model has no prior yet: `ctl oracle` says it waits for traffic;
- a thread loads a written fit back (numpy only: one LAPACK inverse per GP, outside the
  GIL, with BLAS held to one thread so a core stays free for the loop) and the
  loop installs it in the Oracle: one assignment.
A model starts on its roofline prior (logged), moves to a stored fit when one loads, and
to online fits every refit_period_s while it has new points. `janus ctl oracle` shows
status(). Every failure of the helper (a checkpoint it cannot read, a fit that raises)
is logged and leaves the model on what it had; none reaches a request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from janusd.config import DevicesConfig, OracleConfig
from janusd.hw.devices import DEFAULT_FOR_KIND, DeviceSpec
from janusd.hw.model_spec import ModelSpec
from janusd.oracle import refit_job, store
from janusd.oracle.dataset import encode
from janusd.oracle.online import OnlinePoints, has_point
from janusd.oracle.oracle import Oracle
from janusd.oracle.prior import RooflinePrior

log = logging.getLogger("janusd.oracle")


def _one_blas_thread(fn: Any, *args: Any) -> Any:
    """Run fn with BLAS/LAPACK on one thread: a load's matrix inverse must leave a core to
    the event loop (with every core in BLAS, the loop thread waits for the OS scheduler)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return fn(*args)


def _load_one_thread(directory: Path, name: str, identity: dict[str, Any], prior: Any) -> Any:
    return _one_blas_thread(store.load, directory, name, identity, prior)


class OracleHost(Protocol):
    """What the refit needs of the daemon."""

    core: Any  # ServingCore: registry (models, Active instances), telemetry
    workers: Any  # WorkerHandles: last_stats.kv_usage
    clock: Any


@dataclass
class _Model:
    checkpoint: str
    spec: ModelSpec | None = None
    identity: dict[str, Any] | None = None
    buffer: OnlinePoints | None = None
    busy: bool = False  # a describe or fit job in flight
    failed: str | None = None
    last_fit: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


class OracleRefit:
    def __init__(self, cfg: OracleConfig, devices: DevicesConfig, cache_dir: str, eager: bool = False) -> None:
        """eager: describe every model at once (its prior ready before its first request:
        the controller, control.managed, must size a burst from its first window)."""
        self.cfg = cfg
        self.eager = eager
        self.devices = devices
        self.cache_dir = cache_dir
        self.oracle = Oracle()
        self.device: DeviceSpec | None = None
        self.state_dir = Path(os.path.expanduser(cfg.state_dir)) / "oracle"
        self._models: dict[str, _Model] = {}
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._jobs = 0  # in the helper now (it exits at 0)
        self._tasks: set[asyncio.Task[Any]] = set()

    # ---- helper process
    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=refit_job.lower_priority)
        return self._pool

    async def _in_helper(self, fn: Any, *args: Any) -> Any:
        """Run fn in the helper; the helper exits once no job is left. Its imports (the
        checkpoint reader, scipy, sklearn, and torch where a machine's step probe was not
        cached yet) held 80-680 MB for the daemon's life between refits minutes apart;
        starting it again costs a niced second of CPU per refit round."""
        self._jobs += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor(), fn, *args)
        finally:
            self._jobs -= 1
            if self._jobs == 0 and self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # ---- per model
    async def _describe(self, name: str, m: _Model, dtype: str, slo: tuple[float, float], tp: int = 1) -> None:
        """The model's spec from its checkpoint (in the helper) and its roofline prior: one
        shard's on this device kind for a tp > 1 model (oracle/prior.py `tp`)."""
        kind = self.cfg.device_spec or DEFAULT_FOR_KIND[self.devices.kind]
        hbm = self.devices.memory_mib * 2**20 if kind == "cpu" else None
        try:
            out = await self._in_helper(refit_job.describe, m.checkpoint, dtype, self.cache_dir, kind, hbm)
            m.spec = ModelSpec(**out["model_spec"])
            m.identity = out["identity"]
            self.device = DeviceSpec(**out["device"])
        except Exception as e:  # noqa: BLE001 - the helper's failure is logged, never raised into the daemon
            m.failed = f"describe: {type(e).__name__}: {e}"
            log.warning("oracle: %s: cannot read the model's config (%s); no predictions for it", name, m.failed)
            return
        finally:
            m.busy = False
        self.oracle.set_prior(name, RooflinePrior(m.spec, self.device, slo[0], slo[1], tp=tp))
        header = {"model": name, "model_spec": m.identity, "device": out["device"], "source": "online"}
        m.buffer = OnlinePoints(header, self.cfg.max_points)
        _, points = await asyncio.to_thread(_one_blas_thread, store.load_into, self.oracle, self.state_dir, name,
                                            m.identity, log)
        if points is not None:
            m.buffer.seed(points)
            m.info = dict(self.oracle.entry(name).info)
        elif self.oracle.source(name) == "prior":
            log.info("oracle: %s answers from the roofline prior (%s)", name, self.device.name)

    async def _fit(self, name: str, m: _Model, now: float) -> None:
        assert m.buffer is not None and m.identity is not None
        data = encode(m.buffer.points)
        m.buffer.new_since_fit = 0
        prior = self.oracle.entry(name).prior
        prior_args = None if prior is None else {
            "model_spec": msgspec.to_builtins(prior.model), "device": msgspec.to_builtins(prior.device),
            "ttft_slo_s": prior.ttft_slo_s, "tpot_slo_s": prior.tpot_slo_s, "tp": prior.tp}
        try:
            info = await self._in_helper(refit_job.fit_and_store, data, name, str(self.state_dir), m.identity,
                                         self.device.name if self.device else "", now, prior_args)
            points, cap, ela, header = await asyncio.to_thread(_load_one_thread, self.state_dir, name, m.identity,
                                                               prior)
        except Exception as e:  # noqa: BLE001 - logged; the model keeps what it had
            log.warning("oracle: %s: refit failed: %s: %s", name, type(e).__name__, e)
            return
        finally:
            m.busy = False
        if name in self._models:  # not removed meanwhile
            self.oracle.set_fitted(name, cap, ela, info)
            m.last_fit, m.info = now, info
            log.info("oracle: %s refitted on %d points in %.1f s", name, len(points), info.get("fit_s", 0.0))

    def describe_now(self, models: Any) -> list[asyncio.Task[Any]]:
        """Start reading these models' checkpoints for their priors now rather than at the
        first sample period: the start placement sizes them (server/steady_start.py). Returns
        the tasks; step() finds the models described (or still busy) and goes on."""
        out: list[asyncio.Task[Any]] = []
        for cfg in models:
            m = self._models.get(cfg.name)
            if m is not None and m.checkpoint == cfg.checkpoint:
                continue
            m = self._models[cfg.name] = _Model(cfg.checkpoint, busy=True)
            self.oracle.forget(cfg.name)
            t = asyncio.create_task(self._describe(cfg.name, m, cfg.dtype, (cfg.ttft_slo_ms / 1e3,
                                                                            cfg.tpot_slo_ms / 1e3), cfg.tp))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)
            out.append(t)
        return out

    def step(self, host: OracleHost, now: float) -> None:
        """One sample period: follow the registry, sample every described model, start
        describes and due fits. Cheap; called on the event loop."""
        core = host.core
        models = core.models()
        for name in [n for n in self._models if n not in models]:
            del self._models[name]
            self.oracle.forget(name)
        kv_used: dict[str, float] = {}
        for w in host.workers:
            st = getattr(w, "last_stats", None)
            if st is not None and getattr(w, "ready", False):
                for model, frac in st.kv_usage.items():
                    kv_used[model] = max(kv_used.get(model, 0.0), float(frac))
        for name, reg in models.items():
            m = self._models.get(name)
            if m is None or m.checkpoint != reg.cfg.checkpoint:
                m = self._models[name] = _Model(reg.cfg.checkpoint)
                self.oracle.forget(name)
            if m.failed:
                continue
            if m.spec is None:
                if not m.busy and self._worth_describing(name, core, now, len(reg.active)):
                    m.busy = True
                    slo = (reg.cfg.ttft_slo_ms / 1e3, reg.cfg.tpot_slo_ms / 1e3)
                    self._spawn(self._describe(name, m, reg.cfg.dtype, slo, reg.cfg.tp))
                continue
            assert m.buffer is not None and self.device is not None
            if self.cfg.online:
                win = core.window(name, now)
                kv = kv_used.get(name, 0.0) * reg.cfg.kv_cache_mib * 2**20
                m.buffer.add(win, len(reg.active), m.spec, self.device, kv)
                due_time = m.last_fit is None or now - m.last_fit >= self.cfg.refit_period_s
                if not m.busy and due_time and m.buffer.due(self.cfg.min_points, 1):
                    m.busy = True
                    self._spawn(self._fit(name, m, now))

    def _worth_describing(self, name: str, core: Any, now: float, active: int) -> bool:
        """Eager, or something to fit (a point from the window, online on) or a stored fit to load."""
        if self.eager or (self.cfg.online and has_point(core.window(name, now), active)):
            return True
        return store.file_stem(self.state_dir, name).with_suffix(".json").exists()

    async def run(self, host: OracleHost) -> None:
        """The daemon's oracle task: step every sample_s until cancelled. The first step
        waits one period: a daemon that lives seconds (tests, a failed start) never
        starts the helper process."""
        try:
            while True:
                await asyncio.sleep(self.cfg.sample_s)
                try:
                    self.step(host, host.clock())
                except Exception:  # noqa: BLE001 - a bug here must not end serving
                    log.exception("oracle: sampling failed")
        finally:
            await self.close()

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pool is not None:
            # a fit in progress is abandoned, not waited for: the daemon must exit promptly
            # (the executor has no public way to stop a running job, hence _processes)
            procs = list(getattr(self._pool, "_processes", {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:
                p.terminate()
            self._pool = None

    def status(self, now: float) -> list[dict[str, Any]]:
        """Per model: source, points, last fit, held-out error (what `janus ctl oracle` shows)."""
        rows = []
        for name, m in sorted(self._models.items()):
            heldout = m.info.get("heldout") or {}
            rows.append({
                "model": name, "source": self.oracle.source(name),
                "points": len(m.buffer.points) if m.buffer else 0,
                "new_points": m.buffer.new_since_fit if m.buffer else 0,
                "last_fit_age_s": None if m.last_fit is None else round(now - m.last_fit, 1),
                "fit_s": m.info.get("fit_s"), "busy": m.busy, "error": m.failed,
                "note": None if m.spec or m.busy or m.failed else "no prior or fit until it has traffic",
                "heldout_att_p90_pts": heldout.get("attainment_abs_err_p90_pts"),
                "heldout_compute_p90_pct": heldout.get("compute_rel_err_p90_pct"),
                "device_spec": self.device.name if self.device else None,
                "prior_tp": prior.tp if (prior := self.oracle.entry(name).prior) is not None else None,
            })
        return rows

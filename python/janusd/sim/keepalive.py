"""Keep-alive in the simulator: which served models rest Warm or Cold, and what waking one
costs.

The decision is policy/keepalive.py's `residency`, asked at the controller's slow period
with the figures the daemon's controller gives it (server/controller.py plan_slow): per
model its residency (Active while some instance holds device memory, else the Warm or
Cold it was sent to), since when, its last arrival (telemetry) and its requests in
flight. The simulator has no operator pins (every app is the controller's), so nothing
is pinned. A model sent Warm or Cold gives up its devices (the controller drains its
instances); the first request for it wakes it at once (the daemon's lifecycle_ops.wake:
held, never refused), restored by the path lifecycle/restore_path.py chooses, taking its
estimated time on the modelled links: H2D from the host copy (Warm), the checkpoint read
(Cold: the restore path's prior, a tenth of the H2D bandwidth plus 0.2 s), never a fork
(no peer is Active while a model rests).
"""

from __future__ import annotations

from janusd.lifecycle.states import holds_device_memory
from janusd.lifecycle.restore_path import Bandwidths, choose, options_for
from janusd.policy.keepalive import residency
from janusd.policy.policy_config import KeepAliveConfig
from janusd.policy.snapshot import ModelActivity, Residency
from janusd.sim.cluster import Cluster


class KeepAlive:
    """The residency record of the served models and the restore estimate."""

    def __init__(self, cluster: Cluster, cfg: KeepAliveConfig) -> None:
        self.c = cluster
        self.cfg = cfg
        dev = cluster.perf.device
        self.bw = Bandwidths(memcpy=dev.h2d_bw, measured={"d2d": dev.d2d_bw, "h2d": dev.h2d_bw})
        self._res: dict[str, tuple[Residency, float]] = {}  # model -> (residency, since)
        self.rested = 0  # Active -> Warm or Cold decisions taken (the summary)
        self.woken = 0

    def resting(self, model: str) -> Residency | None:
        """"warm" or "cold" while the model rests, else None."""
        r = self._res.get(model)
        return r[0] if r is not None and r[0] != "active" else None

    def _holds(self, model: str) -> bool:
        m = self.c.core.registry.models.get(model)
        return m is not None and any(holds_device_memory(i.state) for i in m.instances.values())

    def tick(self, now: float, models: list[str]) -> list[tuple[str, Residency]]:
        """Ask the policy; returns the models to send Warm or Cold now (from Active, or
        Warm -> Cold), with their new residency. Models neither resting nor holding a
        device (an elastic app the budget gave nothing) are not the keep-alive's."""
        acts = []
        for name in models:
            res: Residency | None = "active" if self._holds(name) else self.resting(name)
            if res is None:
                continue
            prev = self._res.get(name)
            since = prev[1] if prev is not None and prev[0] == res else now
            self._res[name] = (res, since)
            w = self.c.core.telemetry.model(name, now)
            acts.append(ModelActivity(model=name, residency=res, since=since, last_request_at=w.last_arrival_s,
                                      in_flight=self.c.core.requests.count(name)))
        out: list[tuple[str, Residency]] = []
        for d in residency(acts, now, self.cfg):
            if d.changed and d.residency != "active":  # coming back is the waking request's
                self.rested += self._res[d.model][0] == "active"
                self._res[d.model] = (d.residency, now)
                out.append((d.model, d.residency))
        return out

    def wake(self, model: str, now: float) -> float:
        """A request for a resting model: it is Active (coming up) from now; returns the
        restore's transfer seconds (the caller adds its control overhead)."""
        res = self.resting(model)
        if res is None:
            raise ValueError(f"model {model!r} is not resting")
        self._res[model] = ("active", now)
        self.woken += 1
        nbytes = int(self.c.served[model].arch.weight_bytes / self.c.served[model].arch.tp)
        return self.bw.estimate_s(choose(options_for(res, False), nbytes, self.bw), nbytes)

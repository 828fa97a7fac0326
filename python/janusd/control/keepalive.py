"""Keep-alive planned (PAPER.md §8): each model's residency (its most-alive instance) for
policy/keepalive.py, and its decisions turned into Warm / Cold operations. The slow tick
asks it between reading the models and planning the steady placement; coming back
Active is the waking request's (control/wake.py), never this module's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from janusd.control.ops import KEEPALIVE, Op, Rest
from janusd.control.snapshot import ModelView
from janusd.lifecycle.states import InstanceState
from janusd.policy.snapshot import ModelActivity, Residency, ResidencyDecision

S = InstanceState


def residency_of(m: ModelView) -> Residency | None:
    """Active while some instance serves, else Warm or Cold as its instances rest; None
    for a model with nothing placed (unloaded or failed: not the keep-alive's)."""
    states = {i.state for i in m.instances.values()}
    if any(i.serving for i in m.instances.values()):
        return "active"
    return "warm" if S.WARM in states else "cold" if S.COLD in states else None


def activity(models: Iterable[ModelView], elastic: set[str], since_by_model: dict[str, tuple[str, float]],
             now: float) -> tuple[list[ModelActivity], dict[str, ModelView]]:
    """Each model's residency, since when, and its last request, for policy/keepalive.py.
    A P/D model only while it is in the elastic pool (`elastic`): its waking request
    brings back one mixed instance and only the fast loop splits it again, so a steady
    P/D model keeps its configured roles. `since_by_model` (model -> (residency, since))
    is the room's, updated here."""
    acts: list[ModelActivity] = []
    seen: dict[str, ModelView] = {}
    for m in models:
        if not m.instances or (m.pd and m.name not in elastic):
            continue
        res = residency_of(m)
        if res is None:
            continue
        prev = since_by_model.get(m.name)
        since = prev[1] if prev is not None and prev[0] == res else now
        since_by_model[m.name] = (res, since)
        acts.append(ModelActivity(model=m.name, residency=res, since=since,
                                  last_request_at=m.window.last_arrival_s, in_flight=m.requests,
                                  pinned=m.pool == "steady"))
        seen[m.name] = m
    return acts, seen


def keepalive_ops(decisions: Iterable[ResidencyDecision], models: Mapping[str, ModelView],
                  in_flight: Mapping[tuple[str, int], object]) -> list[Op]:
    """Warm and Cold apply to every instance of the model (none with an operation in flight)."""
    ops: list[Op] = []
    for d in decisions:
        if not d.changed or d.residency == "active":  # coming back is the waking request's
            continue
        m = models[d.model]
        src = S.ACTIVE if d.residency == "warm" else S.WARM
        for i in sorted(m.instances.values(), key=lambda i: i.device):
            if (i.state is src or (d.residency == "cold" and i.state is S.ACTIVE)) \
                    and (m.name, i.device) not in in_flight:
                ops.append(Rest(model=m.name, device=i.device, reason=f"{KEEPALIVE}: {d.residency} after {d.reason}",
                                target=d.residency))
    return ops


def cool_scaled_in(models: Iterable[ModelView], warm_since: dict[tuple[str, int], float], now: float,
                   warm_for_s: float, in_flight: Mapping[tuple[str, int], object]) -> list[Op]:
    """A scaled-in replica rests Warm (its next scale-out is an H2D restore, not a load)
    and goes Cold after `warm_for_s` Warm, as an idle model would: keep-alive only moves
    models with nothing serving, so a busy model's Warm replicas are cooled here.
    `warm_since` ((model, device) -> when its scale-in ended) is the room's: an instance
    Warm for another reason (`warm_devices`, `ctl state`) is not in it and stays."""
    seen: set[tuple[str, int]] = set()
    ops: list[Op] = []
    for m in models:
        if not any(i.serving for i in m.instances.values()):
            continue  # resting as a whole: keep-alive's
        for i in m.instances.values():
            key = (m.name, i.device)
            if i.state is not S.WARM or key in in_flight:
                continue
            since = warm_since.get(key)
            if since is None:  # Warm by the operator's config or `ctl state`: not the room's to cool
                continue
            seen.add(key)
            if now - since >= warm_for_s:
                ops.append(Rest(model=m.name, device=i.device, target="cold",
                                reason=f"keep-alive: scaled-in replica Warm for {now - since:.0f} s"))
    for key in [k for k in warm_since if k not in seen]:
        del warm_since[key]
    return ops

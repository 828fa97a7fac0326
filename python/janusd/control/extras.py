"""Replicas of their own for the models the steady placement places, while the classifier
has them in the elastic pool (PAPER.md §2: bursty apps are isolated): m* replicas on the
pool devices nobody else holds (the room hands their steady instance over once one
serves: control/room.py). The room owns the set of them (`ControlRoom.extras`: model ->
devices); these functions keep it, find the free devices, and plan the replicas' scale
out and in. The steady and elastic pools meet only here. A tp > 1 model's replicas are
aligned groups of its own, named by their lead devices (control/groups.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from janusd.control.groups import free_groups, take
from janusd.control.ops import SCALE_IN, SCALE_OUT, Activate, InFlight, Op, Rest, fork_source, group
from janusd.control.snapshot import ControlSnapshot, ModelView
from janusd.lifecycle.states import RESTORABLE, InstanceState

S = InstanceState


def prune_extras(extras: dict[str, set[int]], models: Mapping[str, ModelView], in_flight: InFlight) -> None:
    """An extra replica that no longer serves (drained, failed, keep-alive) is no more;
    one whose scale-out is in flight is one already (ControlRoom.started records it)."""
    for name in list(extras):
        m = models.get(name)
        keep = {d for d in extras[name] if m is not None and ((name, d) in in_flight  # coming up
                                                              or (d in m.instances and m.instances[d].serving))}
        if keep:
            extras[name] = keep
        else:
            del extras[name]


def free_elastic_devices(pool: Iterable[int], steady_devices: Iterable[int], extras: Mapping[str, set[int]],
                         models: Iterable[ModelView]) -> list[int]:
    """Pool devices with no steady item and no extra replica: where extra replicas may
    go (a pinned model's devices are the operator's and stay out; a group takes all of its
    devices; where a tp > 1 model exists, a device something drains on is not free either:
    a group cannot share it with an instance of another shape)."""
    taken = set(steady_devices)
    tps: dict[str, int] = {}
    models = list(models)
    if any(m.tp > 1 for m in models):  # a group shares no device: one still draining is not free
        taken.update(x for m in models for d, i in m.instances.items() if i.state is S.DRAINING
                     for x in group(d, m.tp))
    for m in models:
        tps[m.name] = m.tp
        taken.update(m.devices)
        taken.update(x for d, i in m.instances.items() if i.serving for x in group(d, m.tp))  # whoever serves there
    taken.update(x for name, ds in extras.items() for d in ds for x in group(d, tps.get(name, 1)))
    return [d for d in pool if d not in taken]


def meet_extras(m: ModelView, count: int, free: list[int], reason: str, extras: Mapping[str, set[int]],
                in_flight: InFlight, load_on: Callable[[int], int]) -> list[Op]:
    """Bring a placed model to `count` extra replicas: new ones on free devices (one
    where it rests Warm or Cold first, then the lowest id; taken from `free`; an
    Unloaded one forks from a live replica), surplus ones drained to Warm (the least
    busy first; Cold once Warm as long as keep-alive keeps an idle model Warm:
    control/keepalive.py cool_scaled_in). A tp > 1 model's new replicas take aligned
    groups of `free` (every device of one leaves `free`)."""
    mine = extras.get(m.name, set())
    pending = {d: op.target for (name, d), (op, _) in in_flight.items() if name == m.name}
    have = sum(1 for d in mine if pending.get(d, "active") == "active")
    ops: list[Op] = []
    if have < count:
        def rank(d: int) -> tuple[int, int]:
            i = m.instances.get(d)
            return (0 if i is not None and i.state in RESTORABLE else 1, d)

        for d in sorted((d for d in free_groups(free, m.tp) if (m.name, d) not in in_flight), key=rank):
            if have >= count:
                break
            take(free, d, m.tp)
            i = m.instances.get(d)
            src = fork_source(m.instances, d) if i is None or i.state is S.UNLOADED else None
            ops.append(Activate(model=m.name, device=d, reason=f"{SCALE_OUT}: {reason}", source=src))
            have += 1
    elif have > count:
        for d in sorted((d for d in mine if d not in pending), key=lambda d: (load_on(d), -d)):
            if have <= count:
                break
            ops.append(Rest(model=m.name, device=d, reason=f"{SCALE_IN}: {reason}", target="warm"))
            have -= 1
    return ops


def hand_over(snap: ControlSnapshot, m: ModelView, base: list[int], extras: Mapping[str, set[int]],
              in_flight: InFlight) -> list[Op]:
    """An elastic model's steady instance(s) (`base`) go Cold once one of its own replicas
    is Active (make before break: until then they serve, beside their co-located models).
    With none (no device left for it), it keeps one: the one sharing its device with the
    fewest other models (the steady pool has priority: PAPER.md §2)."""
    mine = extras.get(m.name, set())
    up = sorted(d for d in mine if d in m.instances and m.instances[d].state is S.ACTIVE)
    if up:
        keep, why = None, f"handed over to the elastic pool: its replica on device {up[0]} serves"
    elif len(base) > 1:
        keep = min(base, key=lambda d: (snap.others_on(d, m.name), d))
        why = f"elastic, off the steady pool's devices: it keeps its instance on device {keep}"
    else:
        return []
    return [Rest(model=m.name, device=d, reason=why, target="cold") for d in base
            if d != keep and (m.name, d) not in in_flight]

"""Extra (elastic) replicas of models the steady placement places (PAPER.md §2): a model
without `devices` that the classifier puts in the elastic pool keeps its steady
instance(s), and m* beyond them become replicas on the pool devices nobody else holds.
The controller owns the set of them (`Controller.extras`: model -> devices); these
functions keep it, find the free devices, and plan the replicas' scale out and in.
Apart from the loops: the steady and elastic pools meet only here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from janusd.config import JanusConfig
from janusd.core.registry import Model
from janusd.core.requests import Request
from janusd.lifecycle.states import RESTORABLE
from janusd.server.controller_ops import Op, serving
from janusd.server.steady import SteadyExecutor
from janusd.server.steady_snapshot import pool_devices

InFlight = Mapping[tuple[str, int], tuple[Op, float]]


def prune_extras(extras: dict[str, set[int]], models: Mapping[str, Model], in_flight: InFlight) -> None:
    """An extra replica that no longer serves (drained, failed, keep-alive) is no more;
    one whose scale-out is in flight is one already (Controller.start records it)."""
    for name in list(extras):
        m = models.get(name)
        keep = {d for d in extras[name] if m is not None and ((name, d) in in_flight  # coming up
                                                              or (d in m.instances and serving(m.instances[d])))}
        if keep:
            extras[name] = keep
        else:
            del extras[name]


def free_elastic_devices(cfg: JanusConfig, steady: SteadyExecutor, extras: Mapping[str, set[int]],
                         models: Iterable[Model]) -> list[int]:
    """Pool devices with no steady item and no extra replica: where extra replicas may
    go (a pinned model's devices are the operator's and stay out)."""
    taken = set(steady.plan_devices()) | {d for ds in extras.values() for d in ds}
    for m in models:
        taken.update(m.cfg.devices)
        taken.update(d for d, i in m.instances.items() if serving(i))  # whoever serves there
    return [d for d in pool_devices(cfg) if d not in taken]


def meet_extras(m: Model, count: int, free: list[int], reason: str, extras: Mapping[str, set[int]],
                in_flight: InFlight, on_device: Callable[[int], list[Request]]) -> list[Op]:
    """Bring a placed model to `count` extra replicas: new ones on free devices (one
    where it rests Warm or Cold first, then the lowest id; taken from `free`), surplus
    ones drained to Cold (the least busy first)."""
    mine = extras.get(m.name, set())
    pending = {d: op.target for (name, d), (op, _) in in_flight.items() if name == m.name}
    have = sum(1 for d in mine if pending.get(d, "active") == "active")
    ops: list[Op] = []
    if have < count:
        def rank(d: int) -> tuple[int, int]:
            i = m.instances.get(d)
            return (0 if i is not None and i.state in RESTORABLE else 1, d)

        for d in sorted((d for d in free if (m.name, d) not in in_flight), key=rank):
            if have >= count:
                break
            free.remove(d)
            ops.append(Op(m.name, d, "active", f"scale out: {reason}"))
            have += 1
    elif have > count:
        for d in sorted((d for d in mine if d not in pending), key=lambda d: (len(on_device(d)), -d)):
            if have <= count:
                break
            ops.append(Op(m.name, d, "cold", f"scale in: {reason}"))
            have -= 1
    return ops

"""Tensor-parallel instances in the control room ([P]): an instance of a model with tp = N
is a group of N devices, held whole.

The choice: aligned fixed groups. A tp-N instance sits on N consecutive devices whose
first (its lead, the device every Op and InstanceView names) is a multiple of N: devices
[kN, kN + N). Why not N free-floating shard items packed on any N distinct devices with
equal room: a supernode's collectives run fastest inside its link domains, which come in
aligned power-of-two blocks (an HGX board's 8 GPUs, a CloudMatrix node), and a D2D fork
copies shard i to shard i, so both ends are best the same shape; and aligned groups
never straddle two blocks, so N devices freed by one group are a group again for any
divisor of N (a buddy allocator's reason). It is also the smaller change: an instance
stays one (model, lead) pair, so every rule keyed on (model, device) and the Ops' form
stay as they are for tp 1, and the group is read back as `group(lead, tp)` with tp from
the model's config (one owner of the fact: ModelView.tp), not carried twice.

A group's devices are held whole: no instance of another shape (another lead or tp) is
placed on one of them while the group holds device memory. Co-location inside a group
(two tp-N models on the same N devices) would be sound, but the steady packing
(policy/placement.py) knows single devices, so it is not planned: a tp > 1 model is left
out of the co-location packing, its serving groups' devices leave the packing's pool
(control/steady_snapshot.py), and its count in the steady pool is sized here
(steady_group_ops: the fewest replicas whose per-shard capacity vector fits one device,
as demand.replicas_to_fit does for a tp-1 model) and met on free aligned groups. Groups
never migrate (a move costs N shard transfers and would free nothing for the packing).
In the elastic pool its replicas are groups of its own (control/extras.py) and the budget
counts their devices (policy/scaling.py: N per instance). Both shells carry these Ops out
(the daemon's: a group's lifecycle moves, server/tp_lifecycle.py, and its D2D fork shard
by shard, server/tp_fork.py). Not built: repacking tp-1 instances to defragment groups.
Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from janusd.control.ops import Activate, InFlight, Op, Rest, fork_source, group
from janusd.control.snapshot import ControlSnapshot, ModelView
from janusd.lifecycle.states import RESTORABLE, InstanceState
from janusd.policy.demand import replicas_to_fit
from janusd.policy.policy_config import DemandConfig

S = InstanceState
STEADY_GROUP = "steady placement (tp group)"


def free_groups(free: Iterable[int], tp: int) -> list[int]:
    """Leads of the aligned groups of `tp` devices that lie wholly in `free`, ascending
    (every free device for tp 1, in the order given)."""
    if tp <= 1:
        return list(free)
    s = set(free)
    return sorted(d for d in s if d % tp == 0 and all(x in s for x in group(d, tp)))


def take(free: list[int], lead: int, tp: int) -> None:
    """Remove the devices of the group `lead` leads from `free`."""
    for d in group(lead, tp):
        if d in free:
            free.remove(d)


def held_devices(models: Iterable[ModelView], extras: Mapping[str, Collection[int]] | None = None) -> set[int]:
    """Every device of the groups of tp > 1 models that serve (Active or coming up), drain
    or are an extra replica: devices the steady packing of tp-1 models must leave alone."""
    out: set[int] = set()
    for m in models:
        if m.tp > 1:
            leads = {d for d, i in m.instances.items() if i.serving or i.state is S.DRAINING}
            leads |= set((extras or {}).get(m.name, ()))
            out.update(d for lead in leads for d in group(lead, m.tp))
    return out


def steady_group_ops(snap: ControlSnapshot, skip: Collection[str], free: list[int], cfg: DemandConfig,
                     in_flight: InFlight, load_on: Callable[[int], int]) -> list[Op]:
    """The slow tick's Ops for the steady tp > 1 models the controller places (module doc):
    each serving model (not in `skip`: elastic or resting now) is brought to the fewest
    replicas whose per-shard capacity vector fits one device (at most
    `max_steady_replicas`): new groups on free aligned groups (a resting instance there
    first, then the lowest lead; an Unloaded one forks from a live group), surplus ones
    drained to Cold (the least busy first, never the last). A model with an operation in
    flight is left to it."""
    ops: list[Op] = []
    for m in sorted(snap.models.values(), key=lambda m: m.name):
        if m.tp <= 1 or not snap.placed_by_controller(m) or m.name in skip:
            continue
        serving = m.serving_devices()
        if not serving or any(k[0] == m.name for k in in_flight):
            continue
        try:
            r, v = replicas_to_fit(m.name, m.load, snap.predictor, cfg.capacity_margin, cfg.max_steady_replicas)
        except KeyError:  # no prior yet: it stays as it is
            continue
        want = cfg.max_steady_replicas if r is None else r
        why = (f"{STEADY_GROUP}: {want} group(s) of {m.tp} devices, per-shard vector "
               f"{tuple(round(x, 3) for x in v)}; {len(serving)} serve")
        if want > len(serving):
            def rank(d: int) -> tuple[int, int]:
                i = m.instances.get(d)
                return (0 if i is not None and i.state in RESTORABLE else 1, d)

            for lead in sorted(free_groups(free, m.tp), key=rank)[:want - len(serving)]:
                take(free, lead, m.tp)
                i = m.instances.get(lead)
                src = fork_source(m.instances, lead) if i is None or i.state is S.UNLOADED else None
                ops.append(Activate(model=m.name, device=lead, reason=f"{why}: place on devices "
                                    f"{lead}-{lead + m.tp - 1}", source=src))
        elif want < len(serving):
            for lead in sorted(serving, key=lambda d: (load_on(d), -d))[:len(serving) - want]:
                ops.append(Rest(model=m.name, device=lead, reason=f"{why}: remove from devices "
                                f"{lead}-{lead + m.tp - 1}", target="cold"))
    return ops

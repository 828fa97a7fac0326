"""A model's elastic count met with its own instances (a model with `devices`, not P/D,
not placed by the steady placement): the fast tick's last step for it. Its own module so
that the rule (Warm before Cold; on scale-in the instance whose device it leaves empty,
then the steady pool's device, then the least busy drained first, except that a budget
the steady pool compressed takes the steady pool's device back first; never below one
Active instance) reads on its own."""

from __future__ import annotations

from collections.abc import Callable, Set

from janusd.control.ops import SCALE_IN, SCALE_OUT, Activate, InFlight, Op, Rest
from janusd.control.snapshot import InstanceView, ModelView
from janusd.lifecycle.states import RESTORABLE, InstanceState

S = InstanceState


def meet_count(m: ModelView, count: int, reason: str, in_flight: InFlight, load_on: Callable[[int], int],
               steady_devices: Set[int], others_on: Callable[[int], int], compressed: bool) -> list[Op]:
    """Operations that bring model `m` to `count` serving instances, none of them on an
    instance with an operation in flight. `load_on(device)`: requests in flight there;
    `steady_devices`: the devices the steady placement took; `others_on(device)`: how
    many other models serve there; `compressed`: the budget gave fewer than m* (the
    steady pool needs its devices back: its device's instance goes first)."""
    insts = sorted(m.instances.values(), key=lambda i: i.device)
    pending = {d: op.target for (name, d), (op, _) in in_flight.items() if name == m.name}
    free = [i for i in insts if i.device not in pending]
    # an operation in flight counts as done: its instance is (about to be) where it goes
    serving = sum(1 for i in insts if pending.get(i.device, "active" if i.serving else "") == "active")
    ops: list[Op] = []
    if serving < count:
        # Warm before Cold (less to move), then the lowest device
        for i in sorted((i for i in free if i.state in RESTORABLE), key=lambda i: (i.state is S.COLD, i.device)):
            if serving >= count:
                break
            ops.append(Activate(model=m.name, device=i.device, reason=f"{SCALE_OUT}: {reason}"))
            serving += 1
    elif serving > count:
        active = [i for i in free if i.state is S.ACTIVE]
        # demand fell: one whose device it leaves empty goes first (the device stops
        # costing: on a real daemon, resting the replica beside the steady models kept the
        # other device Active for nothing), then one on a device the steady pool took;
        # the budget compressed it: the steady pool's device first (the elastic budget is
        # what the steady pool leaves); then the least work in flight (shortest drain)
        def order(i: InstanceView) -> tuple[bool, bool, int, int]:
            lone, steady = others_on(i.device) == 0, i.device in steady_devices
            first, second = (not steady, not lone) if compressed else (not lone, not steady)
            return first, second, load_on(i.device), -i.device

        for i in sorted(active, key=order):
            if serving <= max(count, 1):  # never below one Active instance
                break
            ops.append(Rest(model=m.name, device=i.device, reason=f"{SCALE_IN}: {reason}", target="warm"))
            serving -= 1
    return ops

"""A model's elastic count met with its own instances (a model with `devices`, not P/D,
not placed by the steady placement): the fast tick's last step for it. Apart from the
loops so that the rule (Warm before Cold, the steady pool's device and the least busy
drained first, never below one Active instance) reads on its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from janusd.core.registry import Model
from janusd.core.requests import Request
from janusd.lifecycle.states import RESTORABLE, InstanceState
from janusd.server.controller_ops import Op
from janusd.server.controller_ops import serving as _serving
from janusd.server.steady import SteadyExecutor

S = InstanceState


def meet_count(m: Model, count: int, reason: str, in_flight: Mapping[tuple[str, int], tuple[Op, float]],
               on_device: Callable[[int], list[Request]], steady: SteadyExecutor) -> list[Op]:
    """Operations that bring model `m` to `count` serving instances, none of them on an
    instance with an operation in flight."""
    insts = sorted(m.instances.values(), key=lambda i: i.device)
    pending = {d: op.target for (name, d), (op, _) in in_flight.items() if name == m.name}
    free = [i for i in insts if i.device not in pending]
    # an operation in flight counts as done: its instance is (about to be) where it goes
    serving = sum(1 for i in insts if pending.get(i.device, "active" if _serving(i) else "") == "active")
    ops: list[Op] = []
    if serving < count:
        # Warm before Cold (less to move), then the lowest device
        for i in sorted((i for i in free if i.state in RESTORABLE), key=lambda i: (i.state is S.COLD, i.device)):
            if serving >= count:
                break
            ops.append(Op(m.name, i.device, "active", f"scale out: {reason}"))
            serving += 1
    elif serving > count:
        active = [i for i in free if i.state is S.ACTIVE]
        steady_devs = steady.managed_devices()
        # one on a device the steady pool took goes first, then the one with the least
        # work in flight (its drain is shortest)
        for i in sorted(active, key=lambda i: (i.device not in steady_devs, len(on_device(i.device)), -i.device)):
            if serving <= max(count, 1):  # never below one Active instance
                break
            ops.append(Op(m.name, i.device, "warm", f"scale in: {reason}"))
            serving -= 1
    return ops

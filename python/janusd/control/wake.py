"""Which instance a request wakes (PAPER.md §8, keep-alive's other half): a request for a
model with no Active instance brings one of its resting instances back, the one whose
restore is estimated fastest (a Warm one before a Cold one, by lifecycle/restore_path.py's
estimate), unless one is already coming up. Both shells ask it: the daemon
(server/lifecycle_ops.py wake) and the simulator (sim/control_shell.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from janusd.control.ops import WOKEN, Activate, group
from janusd.lifecycle.states import COMING_UP, RESTORABLE, InstanceState

S = InstanceState


class Resting(Protocol):
    """An instance as the wake rule reads it (the core's Instance and the room's
    InstanceView both have these fields)."""

    device: int
    state: InstanceState
    role: str


def wake_op(model: str, instances: Mapping[int, Resting], pd: bool, estimate_s: Callable[[InstanceState], float],
            busy: Collection[int] = ()) -> Activate | None:
    """The activation a request for `model` starts, or None: when an instance serves or is
    coming up already, or none rests (Warm or Cold) outside `busy` (devices with an
    operation in flight). `estimate_s(state)`: the restore's estimated seconds from that
    state. A P/D model comes back as one instance that serves alone (mixed), or as the
    decode partner of an Active prefill instance; the controller splits it again."""
    insts = list(instances.values())
    if any(i.state in COMING_UP for i in insts):
        return None
    active = [i for i in insts if i.state is S.ACTIVE]
    roles = {i.role for i in active}
    if (active and not pd) or "mixed" in roles or {"prefill", "decode"} <= roles:  # it serves
        return None
    free = [i for i in insts if i.state in RESTORABLE and i.device not in busy]
    if not free:
        return None
    inst = min(free, key=lambda i: (estimate_s(i.state), i.device))
    role = None if not pd else "decode" if any(i.role == "prefill" for i in active) else "mixed"
    est = estimate_s(inst.state)
    figures = f"{inst.state.value}, restore est. {est:.2f} s" if math.isfinite(est) else inst.state.value
    return Activate(model=model, device=inst.device, reason=f"{WOKEN} ({figures})", role=role)


def regroup(op: Activate, tp: int, n_devices: int, holding: Callable[[int], int],
            busy: Collection[int] = ()) -> Activate | None:
    """Where a waking tp > 1 instance goes when its group's devices were taken while it
    rested (Warm and Cold hold no device memory, so the room may give them away): the
    lowest aligned group whose devices no instance holds (`holding(device)`: instances
    holding memory there), not in `busy`, loaded from its host copy; None when none is
    free (its requests wait, held, for the controller's next plans)."""
    for lead in range(0, n_devices - tp + 1, tp):
        if lead not in busy and all(holding(d) == 0 for d in group(lead, tp)):
            return Activate(model=op.model, device=lead, role=op.role,
                            reason=f"{op.reason}; its group's devices are taken: on devices {lead}-{lead + tp - 1}")
    return None

"""An elastic P/D app's prefill / decode split (PAPER.md §5): policy/roles.py's plan
turned into the room's operations. Its own module because it is the one P/D-only step of
the fast tick; the room calls it per elastic P/D model (prefill's part of the model's
device time, which sets the split, is measured by control/observe.py)."""

from __future__ import annotations

import msgspec

from janusd.control.ops import SCALE_IN, SCALE_OUT, Activate, InFlight, Op, Reassign, Rest, role_state
from janusd.control.snapshot import ModelView
from janusd.policy.roles import plan_roles
from janusd.policy.snapshot import AppCount, RoleInstance, RolePlan


def meet_roles(m: ModelView, count: AppCount, reason: str, in_flight: InFlight) -> tuple[RolePlan, list[Op]]:
    """Operations that bring a P/D model's instances to `count`'s prefill / decode
    split (policy/roles.py; at least one instance, run mixed). An instance with an
    operation in flight counts where it is going (coming up in the op's role, or
    draining) and is not touched. Returns the role plan (for `ctl plan`) and the ops."""
    if count.count < 1:
        count = msgspec.structs.replace(count, count=1, prefill=0, decode=1)
    insts = []
    for d, i in sorted(m.instances.items()):
        flight = in_flight.get((m.name, d))
        role, state = i.role, role_state(i)
        if flight is not None:
            op = flight[0]
            role, state = (op.role or i.role, "coming_up") if op.target == "active" else (i.role, "draining")
        load = m.own_load.get(d, 0)  # its own requests there: the drain's length
        insts.append(RoleInstance(device=d, role=role, state=state, load=load,  # type: ignore[arg-type]
                                  busy=flight is not None))
    plan = plan_roles(count, insts)
    ops: list[Op] = []
    for o in plan.ops:
        why = f"{o.reason}: {reason}"
        if o.kind == "activate":
            ops.append(Activate(model=m.name, device=o.device, reason=f"{SCALE_OUT}: {why}", role=o.role))
        elif o.kind == "reassign":
            ops.append(Reassign(model=m.name, device=o.device, reason=f"reassign: {why}", role=o.role))
        elif o.kind == "deactivate":
            ops.append(Rest(model=m.name, device=o.device, reason=f"{SCALE_IN}: {why}", target="warm"))
    return plan, ops

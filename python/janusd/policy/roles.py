"""An elastic P/D app's roles: from the fast loop's counts to which instance serves as
what (PAPER.md §2, elastic instances with P/D; §5 the split).

scaling.py gives each elastic app `count` instances, `prefill` of them prefill-only and
`decode` decode-only (or, with `prefill` 0, `decode` mixed instances serving whole
requests). `plan_roles(count, instances)` turns that into lifecycle operations on the
app's instances, pure and deterministic:

1. Keep. For each role, the instances holding it now (Active, or coming up with an
   operation in flight) are kept up to the count wanted: busy ones first (nothing may
   touch them), then those coming up, then the busiest (the longest drain), then the
   lowest device. The rest of them are surplus; an Active instance of a role not wanted
   at all (mixed when the app splits, prefill/decode when it does not) is surplus too.
   A surplus instance with an operation in flight is left alone ("wait", in `held`).
2. Fill. A role short of its count takes resting instances first, Warm before Cold
   (H2D before a checkpoint read), then the lowest device; each comes up in its own
   role when that role is short, else in the first short role (prefill, decode, mixed):
   the engine's role is chosen at activation, the weights are the same. Only when no
   instance rests does a surplus Active instance change role ("reassign": drain to Warm,
   come back in the new role; the least busy first, then the lowest device). Surplus
   left over drains to Warm. So the plan uses the fewest restores (one per missing
   instance), then the fewest reassignments, then the fewest Cold starts
   (tests/test_policy_roles.py checks this against a brute force over all assignments).
3. Safety. An app can serve while it has an Active mixed instance, or an Active prefill
   instance and an Active decode one (a prefill instance hands its KV to a decode one,
   core/kv_handoff.py). A removal (reassign, deactivate) that would end that is held
   while an activation is on its way (make before break: it is planned again at the next
   tick, from what is then Active); with nothing on its way it goes ahead (a change
   between one mixed instance and a P/D pair on two devices has no other way: the app's
   requests are held, not refused, meanwhile).
4. Feasibility. When the split cannot put one instance in each of prefill and decode
   (fewer than two usable instances: Active, coming up, Warm or Cold), the app runs
   mixed on what it has.

Pure: the caller (the controller) builds RoleInstance from the registry, and runs the
ops through the lifecycle. Shapes in snapshot.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from janusd.lifecycle.states import COMING_UP_WORD, InstanceState
from janusd.policy.snapshot import AppCount, Role, RoleInstance, RoleOp, RolePlan

S = InstanceState

ROLES: tuple[Role, ...] = ("prefill", "decode", "mixed")
_HOLDING = (S.ACTIVE.value, COMING_UP_WORD)  # states that count toward a role
_RESTING = (S.WARM.value, S.COLD.value)


class RoleError(ValueError):
    """Bad input to plan_roles (a device twice, counts that do not add up); names what."""


def wanted(count: AppCount) -> dict[Role, int]:
    """Instances wanted per role: prefill + decode when the app splits, else mixed."""
    if count.prefill > 0:
        return {"prefill": count.prefill, "decode": count.decode}
    return {"mixed": count.decode}


def can_serve(roles: Iterable[Role]) -> bool:
    """Whether Active instances of these roles serve a whole request (module doc, 3)."""
    rs = set(roles)
    return "mixed" in rs or {"prefill", "decode"} <= rs


def _check(count: AppCount, instances: Sequence[RoleInstance]) -> None:
    if count.prefill < 0 or count.decode < 0 or count.prefill + count.decode != count.count:
        raise RoleError(f"app {count.app!r}: prefill {count.prefill} + decode {count.decode} must be the count "
                        f"{count.count}, each >= 0")
    seen: set[int] = set()
    for i in instances:
        if i.device in seen:
            raise RoleError(f"app {count.app!r}: device {i.device} appears twice")
        seen.add(i.device)
        if i.load < 0:
            raise RoleError(f"app {count.app!r}: device {i.device}: load must be >= 0")


def _plan(want: dict[Role, int], insts: list[RoleInstance]) -> tuple[list[RoleOp], list[tuple[int, Role]],
                                                                     dict[Role, int]]:
    """Steps 1 and 2 of the module doc: (ops unordered by safety, target, shortfall)."""
    kept: list[RoleInstance] = []
    surplus: list[RoleInstance] = []
    short: dict[Role, int] = {}
    for r in ROLES:
        holding = sorted((i for i in insts if i.state in _HOLDING and i.role == r),
                         key=lambda i: (not i.busy, i.state != "coming_up", -i.load, i.device))
        k = want.get(r, 0)
        kept += holding[:k]
        surplus += holding[k:]
        if k > len(holding):
            short[r] = k - len(holding)
    ops: list[RoleOp] = []
    target = [(i.device, i.role) for i in kept]

    def first_short(own: Role) -> Role | None:
        if short.get(own, 0) > 0:
            return own
        return next((r for r in ROLES if short.get(r, 0) > 0), None)

    resting = sorted((i for i in insts if i.state in _RESTING and not i.busy),
                     key=lambda i: (i.state == "cold", i.device))
    for i in resting:
        r = first_short(i.role)
        if r is None:
            break
        short[r] -= 1
        ops.append(RoleOp(device=i.device, kind="activate", role=r, previous_role=i.role,
                          reason=f"{r} short: comes up from {i.state}" + ("" if r == i.role else f" (was {i.role})")))
        target.append((i.device, r))
    movable = sorted((i for i in surplus if not i.busy and i.state == "active"), key=lambda i: (i.load, i.device))
    for i in movable:
        r = first_short(i.role)
        if r is not None and r != i.role:
            short[r] -= 1
            ops.append(RoleOp(device=i.device, kind="reassign", role=r, previous_role=i.role,
                              reason=f"{r} short, no instance resting: {i.role} -> {r}"))
            target.append((i.device, r))
        else:
            ops.append(RoleOp(device=i.device, kind="deactivate", role=i.role, previous_role=i.role,
                              reason=f"{i.role} beyond the {want.get(i.role, 0)} wanted"))
    # surplus with an operation in flight: nothing may touch it now
    ops += [RoleOp(device=i.device, kind="wait", role=i.role, previous_role=i.role,
                   reason=f"{i.role} beyond the {want.get(i.role, 0)} wanted, but an operation is in flight on it")
            for i in surplus if i.busy or i.state != "active"]
    return ops, sorted(target), {r: n for r, n in short.items() if n > 0}


def plan_roles(count: AppCount, instances: Sequence[RoleInstance]) -> RolePlan:
    """The operations that bring the app's instances to `count`'s roles (module doc)."""
    _check(count, instances)
    insts = sorted(instances, key=lambda i: i.device)
    want = wanted(count)
    usable = sum(1 for i in insts if i.state in _HOLDING + _RESTING)
    if "prefill" in want and usable < 2:
        want = {"mixed": count.count}  # no room for one of each: mixed on what it has (step 4)
    ops, target, short = _plan(want, insts)
    # step 3: removals never end the app's service while an activation is on its way
    active = {i.device: i.role for i in insts if i.state == "active"}
    coming = any(i.state == "coming_up" for i in insts) or any(o.kind == "activate" for o in ops)
    served = can_serve(active.values())
    out: list[RoleOp] = [o for o in ops if o.kind == "activate"]
    held: list[RoleOp] = [o for o in ops if o.kind == "wait"]
    for o in [o for o in ops if o.kind == "reassign"] + [o for o in ops if o.kind == "deactivate"]:
        after = {d: r for d, r in active.items() if d != o.device}
        if served and coming and not can_serve(after.values()):
            held.append(o)
            continue
        active = after
        out.append(o)
    return RolePlan(ops=tuple(out), held=tuple(held), target=tuple(target),
                    short=tuple((r, short[r]) for r in ROLES if r in short))

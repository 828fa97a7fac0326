"""An elastic P/D app's roles (policy/roles.py): the plan reaches the counts asked, keeps
what already serves, uses the fewest restores, reassignments and Cold starts (checked
against a brute force over every assignment of roles to instances), and never ends the
app's service while an activation is on its way."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.policy.roles import ROLES, RoleError, can_serve, plan_roles, wanted
from janusd.policy.snapshot import AppCount, RoleInstance


def count(prefill: int, decode: int) -> AppCount:
    return AppCount(app="a", demand=prefill + decode, debounced=prefill + decode, count=prefill + decode,
                    prefill=prefill, decode=decode, reason="test")


def inst(device: int, role: str, state: str, load: int = 0, busy: bool | None = None) -> RoleInstance:
    return RoleInstance(device=device, role=role, state=state, load=load,  # type: ignore[arg-type]
                        busy=state in ("coming_up", "draining") if busy is None else busy)


def ops(plan) -> list[tuple[str, int, str]]:
    return [(o.kind, o.device, o.role) for o in plan.ops]


def test_nothing_to_do_when_the_roles_are_as_asked():
    p = plan_roles(count(1, 2), [inst(0, "prefill", "active"), inst(1, "decode", "active"),
                                 inst(2, "decode", "active"), inst(3, "decode", "warm")])
    assert p.ops == () and p.held == () and p.short == ()
    assert p.target == ((0, "prefill"), (1, "decode"), (2, "decode"))


def test_scale_out_takes_a_warm_instance_before_a_cold_one_in_its_own_role():
    p = plan_roles(count(1, 2), [inst(0, "prefill", "active"), inst(1, "decode", "active"),
                                 inst(2, "decode", "cold"), inst(3, "decode", "warm")])
    assert ops(p) == [("activate", 3, "decode")]


def test_a_role_change_happens_at_activation_when_an_instance_rests():
    # two prefill wanted, one decode: the Warm decode copy comes back as prefill
    p = plan_roles(count(2, 1), [inst(0, "prefill", "active"), inst(1, "decode", "active"),
                                 inst(2, "decode", "warm")])
    assert ops(p) == [("activate", 2, "prefill")]
    assert p.ops[0].previous_role == "decode" and "was decode" in p.ops[0].reason


def test_with_nothing_resting_the_least_busy_surplus_instance_is_reassigned():
    p = plan_roles(count(2, 1), [inst(0, "prefill", "active", 3), inst(1, "decode", "active", 5),
                                 inst(2, "decode", "active", 1)])
    assert ops(p) == [("reassign", 2, "prefill")]
    assert p.target == ((0, "prefill"), (1, "decode"), (2, "prefill"))


def test_scale_in_drains_the_least_busy():
    p = plan_roles(count(1, 1), [inst(0, "prefill", "active", 2), inst(1, "decode", "active", 4),
                                 inst(2, "decode", "active", 1), inst(3, "prefill", "active", 0)])
    assert ops(p) == [("deactivate", 3, "prefill"), ("deactivate", 2, "decode")]


def test_mixed_to_pd_is_make_before_break_then_goes_ahead():
    # tick 1: the Warm copy comes up as decode; the only serving (mixed) instance is held
    first = plan_roles(count(1, 1), [inst(0, "mixed", "active"), inst(1, "decode", "warm")])
    assert ops(first) == [("activate", 1, "decode")]
    assert [(o.kind, o.device, o.role) for o in first.held] == [("reassign", 0, "prefill")]
    # while it comes up, still held
    during = plan_roles(count(1, 1), [inst(0, "mixed", "active"), inst(1, "decode", "coming_up")])
    assert ops(during) == [] and [o.kind for o in during.held] == ["reassign"]
    # tick 2: nothing is on its way any more and no other instance exists: it goes ahead
    second = plan_roles(count(1, 1), [inst(0, "mixed", "active"), inst(1, "decode", "active")])
    assert ops(second) == [("reassign", 0, "prefill")] and second.held == ()


def test_pd_back_to_one_mixed_instance():
    p = plan_roles(count(0, 1), [inst(0, "prefill", "active", 1), inst(1, "decode", "active", 2),
                                 inst(2, "mixed", "warm")])
    # the mixed copy comes up first; the P/D pair drains only once it serves
    assert ops(p) == [("activate", 2, "mixed")]
    assert sorted((o.kind, o.device) for o in p.held) == [("deactivate", 0), ("deactivate", 1)]
    p2 = plan_roles(count(0, 1), [inst(0, "prefill", "active", 1), inst(1, "decode", "active", 2),
                                  inst(2, "mixed", "active")])
    assert sorted(ops(p2)) == [("deactivate", 0, "prefill"), ("deactivate", 1, "decode")]


def test_one_usable_instance_runs_mixed():
    p = plan_roles(count(1, 1), [inst(0, "decode", "warm"), inst(1, "decode", "unloaded"),
                                 inst(2, "prefill", "failed")])
    assert ops(p) == [("activate", 0, "mixed")] and p.target == ((0, "mixed"),)
    assert p.short == (("mixed", 1),)


def test_an_instance_coming_up_is_kept_and_a_busy_surplus_one_waits():
    # the decode instance coming up is kept; the Active one drains only once it serves
    p = plan_roles(count(1, 1), [inst(0, "prefill", "active"), inst(1, "decode", "active"),
                                 inst(2, "decode", "coming_up")])
    assert ops(p) == [] and [(o.kind, o.device) for o in p.held] == [("deactivate", 1)]
    # two coming up, one wanted: the second waits for its operation to end
    p = plan_roles(count(1, 1), [inst(0, "prefill", "active"), inst(1, "decode", "coming_up"),
                                 inst(2, "decode", "coming_up")])
    assert ops(p) == [] and [(o.kind, o.device) for o in p.held] == [("wait", 2)]


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(RoleError, match="device 1 appears twice"):
        plan_roles(count(1, 1), [inst(1, "prefill", "active"), inst(1, "decode", "warm")])
    bad = AppCount(app="a", demand=3, debounced=3, count=3, prefill=1, decode=1, reason="")
    with pytest.raises(RoleError, match="must be the count"):
        plan_roles(bad, [])


# ---- properties and the brute force -------------------------------------------------

STATES = ("active", "coming_up", "draining", "warm", "cold", "unloaded", "failed")


@st.composite
def cases(draw):
    n = draw(st.integers(0, 6))
    insts = []
    for d in range(n):
        state = draw(st.sampled_from(STATES))
        busy = state in ("coming_up", "draining") or (state == "active" and draw(st.integers(0, 5)) == 0)
        insts.append(inst(d, draw(st.sampled_from(ROLES)), state, draw(st.integers(0, 4)), busy))
    p = draw(st.integers(0, 3))
    dec = draw(st.integers(1, 4))
    return count(p, dec), insts


def effective_want(c: AppCount, insts: list[RoleInstance]) -> dict[str, int]:
    w = wanted(c)
    usable = sum(1 for i in insts if i.state in ("active", "coming_up", "warm", "cold"))
    return {"mixed": c.count} if "prefill" in w and usable < 2 else w


def cost_of(plan, insts: list[RoleInstance]) -> tuple[int, int, int]:
    state = {i.device: i.state for i in insts}
    every = plan.ops + plan.held
    acts = [o for o in every if o.kind == "activate"]
    reas = [o for o in every if o.kind == "reassign"]
    return len(acts) + len(reas), len(reas), sum(1 for o in acts if state[o.device] == "cold")


def brute_force(want: dict[str, int], insts: list[RoleInstance]) -> tuple[int, int, int] | None:
    """The least (restores, reassignments, Cold starts) over every assignment of wanted
    roles (or none) to the instances nothing is in flight on that reaches `want`
    exactly; None when none does."""
    fixed = {r: sum(1 for i in insts if i.busy and i.state in ("active", "coming_up") and i.role == r) for r in ROLES}
    free = [i for i in insts if not i.busy and i.state in ("active", "coming_up", "warm", "cold")]
    best = None
    for roles in itertools.product((None, *want), repeat=len(free)):
        got = {r: min(fixed[r], want.get(r, 0)) for r in ROLES}
        restores = reassigns = colds = 0
        ok = True
        for i, r in zip(free, roles):
            if r is None:
                continue
            got[r] += 1
            if i.state in ("active", "coming_up") and i.role == r:
                continue
            if i.state == "coming_up":  # cannot be turned into another role mid-flight
                ok = False
                break
            restores += 1
            reassigns += i.state == "active"
            colds += i.state == "cold"
        if ok and all(got[r] == want.get(r, 0) for r in ROLES):
            c = (restores, reassigns, colds)
            best = c if best is None or c < best else best
    return best


@settings(max_examples=300, deadline=None)
@given(cases())
def test_plans_reach_the_target_safely_with_the_fewest_changes(case):
    c, insts = case
    plan = plan_roles(c, insts)
    want = effective_want(c, insts)
    by_dev = {i.device: i for i in insts}
    touched = [o.device for o in plan.ops + plan.held]
    assert len(touched) == len(set(touched))  # one operation per instance at most
    for o in plan.ops:  # nothing in flight is touched; kinds fit the instance's state
        i = by_dev[o.device]
        assert not i.busy and o.kind != "wait"
        assert (o.kind == "activate") == (i.state in ("warm", "cold"))
        assert o.kind != "reassign" or o.role != i.role
    # applying every operation gives the target, which has the counts asked (less the short)
    roles = {i.device: i.role for i in insts if i.state in ("active", "coming_up")}
    for o in plan.ops + plan.held:
        if o.kind in ("activate", "reassign"):
            roles[o.device] = o.role
        else:
            roles.pop(o.device)
    assert sorted(roles.items()) == list(plan.target)
    short = dict(plan.short)
    for r in ROLES:
        assert sum(1 for _, x in plan.target if x == r) == want.get(r, 0) - short.get(r, 0), (r, plan)
    # safety: the removals started now never end service while an activation is coming
    active = {i.device: i.role for i in insts if i.state == "active"}
    coming = any(i.state == "coming_up" for i in insts) or any(o.kind == "activate" for o in plan.ops)
    if can_serve(active.values()) and coming:
        for o in plan.ops:
            if o.kind in ("reassign", "deactivate"):
                active.pop(o.device)
                assert can_serve(active.values()), plan
    # the fewest changes: the brute force's optimum, or none when the plan falls short
    best = brute_force(want, insts)
    if plan.short:
        assert best is None
    else:
        assert best is not None and cost_of(plan, insts) == best, (plan, best)

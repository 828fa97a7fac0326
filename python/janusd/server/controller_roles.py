"""An elastic P/D app's prefill / decode split executed (PAPER.md §5): prefill's part of
the model's device time from the per-token costs the core measures, and policy/roles.py's
plan turned into the controller's operations. Apart from the controller's loops because
it is the one P/D-only step of the fast tick; the loop calls it per elastic P/D model."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from janusd.core.registry import Model
from janusd.core.requests import Request
from janusd.core.serving import ServingCore
from janusd.oracle.decode_estimate import DecodeStepEstimator
from janusd.oracle.prefill_estimate import PrefillEstimator
from janusd.oracle.types import LoadFeatures
from janusd.policy.demand import prefill_share
from janusd.policy.roles import plan_roles
from janusd.policy.snapshot import AppCount, RoleInstance, RolePlan
from janusd.server.controller_ops import Op, role_state


def measured_prefill_share(core: ServingCore, m: Model, load: LoadFeatures) -> float:
    """Prefill's part of the model's device time (demand.prefill_share) from the
    per-token costs the core measures: seconds per prompt token of the model's
    prefill fits at its mean prompt length (mean over its devices with samples; the
    estimator's prior without any), and seconds of device time per output token of
    its devices' decode fits at the sequences decoding there now (step time / n)."""
    n_in = max(1.0, load.input_len_mean)
    fits = [e for (name, _), e in core.dispatch.estimators.items() if name == m.name and e.n]
    p = sum(e.estimate(int(n_in)) for e in fits) / len(fits) if fits else PrefillEstimator().estimate(int(n_in))
    costs = []
    for d in m.instances:
        fit = core.guard.fit.get(d)
        if fit is not None and fit.n:
            n = max(1, core.guard.decoding.get(d, 0))
            costs.append(fit.step_s(n) / n)
    dec = sum(costs) / len(costs) if costs else DecodeStepEstimator().step_s(1)
    return prefill_share(load, p / n_in, dec)


def meet_roles(m: Model, count: AppCount, reason: str, in_flight: dict[tuple[str, int], tuple[Op, float]],
               on_device: Callable[[int], Iterable[Request]]) -> tuple[RolePlan, list[Op]]:
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
        load = sum(1 for r in on_device(d) if r.model == m.name)  # its own requests there: the drain's length
        insts.append(RoleInstance(device=d, role=role, state=state, load=load,  # type: ignore[arg-type]
                                  busy=flight is not None))
    plan = plan_roles(count, insts)
    ops: list[Op] = []
    for o in plan.ops:
        why = f"{o.reason}: {reason}"
        if o.kind == "activate":
            ops.append(Op(m.name, o.device, "active", f"scale out: {why}", role=o.role))
        elif o.kind == "reassign":
            ops.append(Op(m.name, o.device, "active", f"reassign: {why}", role=o.role, reassign=True))
        elif o.kind == "deactivate":
            ops.append(Op(m.name, o.device, "warm", f"scale in: {why}"))
    return plan, ops

"""`janus ctl plan`: what the controller's loops decided and why, as one JSON-able dict.
Apart from the loops because it only reads their results (the last scaling plan, role
plans, pools, keep-alive decisions, operations in flight and recent ones)."""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from janusd.policy.snapshot import AppCount, RolePlan, ScalingPlan
from janusd.server.controller_ops import ControllerHost, Done, Op
from janusd.server.steady import SteadyExecutor


class PlanSource(Protocol):
    """What the view reads of server/controller.py's Controller (named here, not imported:
    no import circle in server/)."""

    host: ControllerHost
    last_scaling: ScalingPlan | None
    roles: dict[str, RolePlan]
    steady: SteadyExecutor
    last_pools: list[dict[str, Any]]
    last_keepalive: list[dict[str, Any]]
    in_flight: dict[tuple[str, int], tuple[Op, float]]
    recent: deque[Done]
    overruns: dict[str, int]


def _roles_view(ctl: PlanSource, a: AppCount) -> dict[str, Any]:
    """A P/D app's split and each instance's role and state now (`ctl plan`)."""
    m = ctl.host.core.registry.models.get(a.app)
    if m is None or not m.pd:
        return {}
    plan = ctl.roles.get(a.app)
    return {"prefill": a.prefill, "decode": a.decode,
            "instances": [{"device": i.device, "role": i.role, "state": i.state.value}
                          for i in sorted(m.instances.values(), key=lambda i: i.device)],
            "held": [{"device": o.device, "kind": o.kind, "role": o.role, "reason": o.reason}
                     for o in (plan.held if plan else ())]}


def plan_view(ctl: PlanSource, now: float) -> dict[str, Any]:
    """`janus ctl plan`: elastic counts with m* and the budget, keep-alive decisions,
    operations in flight and recent ones with their timings and reasons."""
    sp = ctl.last_scaling
    return {
        "managed": ctl.host.cfg.control.managed,
        "elastic": {
            "budget": sp.budget if sp else None,
            "asked": sp.asked if sp else None,
            "given": sp.given if sp else None,
            "compressed": sp.compressed if sp else None,
            "apps": [{"model": a.app, "demand": a.demand, "debounced": a.debounced, "count": a.count,
                      "reason": a.reason} | _roles_view(ctl, a) for a in (sp.apps if sp else ())],
        },
        "steady": ctl.steady.view(now),
        "pools": ctl.last_pools,
        "keepalive": ctl.last_keepalive,
        "in_flight": [{"model": op.model, "device": op.device, "target": op.target, "role": op.role,
                       "reason": op.reason, "for_s": round(now - t, 3)} for op, t in ctl.in_flight.values()],
        "recent": [{"model": d.op.model, "device": d.op.device, "target": d.op.target, "role": d.op.role,
                    "reason": d.op.reason, "seconds": round(d.seconds, 3), "outcome": d.outcome,
                    "phases": {k: round(v, 4) for k, v in d.phases.items()}} for d in ctl.recent],
        "overruns": dict(ctl.overruns),
    }

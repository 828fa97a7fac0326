"""`janus ctl plan`: what the room decided and why, as one JSON-able dict. Its own module
because it only reads the room's results (the last scaling plan, role plans, pools,
keep-alive decisions, the steady plan, operations in flight and recent ones)."""

from __future__ import annotations

from typing import Any

from janusd.control.room import ControlRoom
from janusd.control.snapshot import ControlSnapshot
from janusd.policy.snapshot import AppCount


def _roles_view(room: ControlRoom, snap: ControlSnapshot, a: AppCount) -> dict[str, Any]:
    """A P/D app's split and each instance's role and state now."""
    m = snap.models.get(a.app)
    if m is None or not m.pd:
        return {}
    plan = room.roles.get(a.app)
    return {"prefill": a.prefill, "decode": a.decode,
            "instances": [{"device": i.device, "role": i.role, "state": i.state.value}
                          for i in sorted(m.instances.values(), key=lambda i: i.device)],
            "held": [{"device": o.device, "kind": o.kind, "role": o.role, "reason": o.reason}
                     for o in (plan.held if plan else ())]}


def plan_view(room: ControlRoom, snap: ControlSnapshot, now: float, overruns: dict[str, int]) -> dict[str, Any]:
    """Elastic counts with m* and the budget, the steady plan, keep-alive decisions,
    operations in flight and recent ones with their timings and reasons."""
    sp = room.last_scaling
    return {
        "managed": snap.managed,
        "elastic": {
            "budget": sp.budget if sp else None,
            "asked": sp.asked if sp else None,
            "given": sp.given if sp else None,
            "compressed": sp.compressed if sp else None,
            "apps": [{"model": a.app, "demand": a.demand, "debounced": a.debounced, "count": a.count,
                      "reason": a.reason} | _roles_view(room, snap, a) for a in (sp.apps if sp else ())],
        },
        "steady": room.steady.view(now),
        "pools": room.last_pools,
        "keepalive": room.last_keepalive,
        "in_flight": [{"model": op.model, "device": d, "target": op.target if d == op.device else "cold",
                       "role": op.role, "kind": type(op).__name__.lower(), "reason": op.reason,
                       "for_s": round(now - t, 3)}
                      for (_, d), (op, t) in room.in_flight.items()],
        "recent": [{"model": d.op.model, "device": d.op.device, "target": d.op.target, "role": d.op.role,
                    "reason": d.op.reason, "seconds": round(d.seconds, 3), "outcome": d.outcome,
                    "phases": {k: round(v, 4) for k, v in d.phases.items()}} for d in room.recent],
        "overruns": dict(overruns),
    }

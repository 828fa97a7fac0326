"""Keep-alive: when an idle model leaves HBM, and when a request brings it back
(PAPER.md §8: Active, Warm in pinned host memory, Cold on storage).

`residency(models, now, config)`, pure and deterministic, per model:
- a model with requests in flight, or one that got a request since it went Warm or
  Cold, should be Active: its request is held while it is restored ([L]), not refused;
- otherwise a model idle for cold_after_s is Cold, idle for warm_after_s is Warm
  (only downwards: the policy never restores a model without a request);
- idle time counts from the last request, and for an Active model from no earlier than
  when it became Active, so a model just restored gets a full warm_after_s;
- an operator-pinned model stays Active unless demote_pinned is set.
The shell turns a change into lifecycle operations (drain first, then Warm; Warm -> Cold
frees the host copy) and never repeats one in flight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from janusd.policy.policy_config import KeepAliveConfig
from janusd.policy.snapshot import ModelActivity, Residency, ResidencyDecision

_RANK: dict[str, int] = {"active": 0, "warm": 1, "cold": 2}


class KeepAliveError(ValueError):
    """Bad activity figures (a model twice, a time not finite, in_flight < 0)."""


def _check(models: Sequence[ModelActivity], now: float) -> None:
    if not math.isfinite(now):
        raise KeepAliveError(f"now must be finite, got {now}")
    seen: set[str] = set()
    for m in models:
        if m.model in seen:
            raise KeepAliveError(f"model {m.model!r} appears twice")
        seen.add(m.model)
        if not math.isfinite(m.since) or (m.last_request_at is not None and not math.isfinite(m.last_request_at)):
            raise KeepAliveError(f"model {m.model!r}: times must be finite")
        if m.in_flight < 0:
            raise KeepAliveError(f"model {m.model!r}: in_flight must be >= 0")


def _target(m: ModelActivity, now: float, cfg: KeepAliveConfig) -> tuple[Residency, str]:
    if m.in_flight > 0:
        return "active", f"{m.in_flight} requests in flight"
    if m.residency != "active" and m.last_request_at is not None and m.last_request_at >= m.since:
        return "active", f"a request arrived while {m.residency}"
    if m.pinned and not cfg.demote_pinned:
        return m.residency, "pinned by the operator: never demoted"
    start = m.since if m.last_request_at is None else m.last_request_at
    if m.residency == "active":
        start = max(start, m.since)
    idle = now - start
    if idle >= cfg.cold_after_s:
        want: Residency = "cold"
    elif idle >= cfg.warm_after_s:
        want = "warm"
    else:
        want = "active"
    if _RANK[want] <= _RANK[m.residency]:
        return m.residency, f"idle {idle:.0f} s"
    limit = cfg.cold_after_s if want == "cold" else cfg.warm_after_s
    return want, f"idle {idle:.0f} s >= {limit:.0f} s"


def residency(models: Sequence[ModelActivity], now: float, cfg: KeepAliveConfig) -> tuple[ResidencyDecision, ...]:
    """The residency each model should have now, with its reason (sorted by model)."""
    _check(models, now)
    out = []
    for m in sorted(models, key=lambda m: m.model):
        want, why = _target(m, now, cfg)
        out.append(ResidencyDecision(model=m.model, residency=want, changed=want != m.residency, reason=why))
    return tuple(out)

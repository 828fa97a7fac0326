"""Predictions into demands: the one place policies ask the oracle (oracle/types.py).

- steady_items: a steady model's capacity vector is the Capacity GP's mean plus
  `capacity_margin` std per dimension (PAPER.md §3: compute and bandwidth errors are
  large, the margin is the safety). A model whose vector exceeds one device gets r
  replicas, each predicted at 1/r of the load (rates divided, lengths unchanged): the
  fewest r whose vector fits, up to max_steady_replicas. Keys: the model name for the
  first replica, "model#k" for replica k >= 1, so that a change of r adds or removes the
  extra replicas and never renames the first (a renamed key is a "remove" of the old plus a
  "place" of the new to the placement: the model's serving instance would drain while its
  successor loads; on ServeGen a model whose load hovered at the split point lost service
  for minutes this way in the simulator). A pinned model (config `devices`) gets one item per
  device at its share of the load, never split further: its placement is the operator's.
- prefill_share: the part of an elastic app's instances that should prefill, as the
  part of its device time that prefill takes: input tokens/s x seconds per prefill token
  over that plus output tokens/s x seconds per decode token (the per-token costs from
  oracle/prefill_estimate.py and decode_estimate.py at the app's batch sizes).
- elastic_demand: m* from ElasticityPredictor.min_instances with the configured target,
  margin and limit; when no count up to the limit reaches the target, the app asks for
  the limit (the most it may have) and the reason says so.

Pure as long as the predictors are (they are functions of their fitted state).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from janusd.oracle.types import CapacityPredictor, ElasticityPredictor, LoadFeatures
from janusd.policy.bins import FIT_EPS
from janusd.policy.policy_config import DemandConfig
from janusd.policy.snapshot import SteadyItem, Vec3


class SteadyModel(msgspec.Struct, frozen=True, kw_only=True):
    """A steady model and its offered load. `devices` non-empty: pinned there."""

    model: str
    load: LoadFeatures
    devices: tuple[int, ...] = ()


class SteadyDemand(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    items: tuple[SteadyItem, ...]  # empty when it fits no device at any replica count
    reason: str


def scaled(load: LoadFeatures, share: float) -> LoadFeatures:
    """The load one of 1/share replicas sees: rates times share, lengths as they are."""
    return msgspec.structs.replace(load, request_rate=load.request_rate * share,
                                   input_token_rate=load.input_token_rate * share,
                                   output_token_rate=load.output_token_rate * share)


def _vector(pred: CapacityPredictor, model: str, load: LoadFeatures, k: float) -> Vec3:
    v = pred.capacity(model, load).with_margin(k)
    return (max(v[0], 0.0), max(v[1], 0.0), max(v[2], 0.0))


def steady_items(models: Sequence[SteadyModel], pred: CapacityPredictor, cfg: DemandConfig) -> tuple[SteadyDemand, ...]:
    out = []
    for m in sorted(models, key=lambda m: m.model):
        if m.devices:
            devs = sorted(set(m.devices))
            v = _vector(pred, m.model, scaled(m.load, 1.0 / len(devs)), cfg.capacity_margin)
            items = tuple(SteadyItem(key=m.model if len(devs) == 1 else f"{m.model}#{d}", model=m.model, vector=v,
                                     pinned_device=d) for d in devs)
            out.append(SteadyDemand(model=m.model, items=items, reason=f"pinned to devices {devs}"))
            continue
        r, v = replicas_to_fit(m.model, m.load, pred, cfg.capacity_margin, cfg.max_steady_replicas)
        if r is not None:
            keys = [m.model] + [f"{m.model}#{k}" for k in range(1, r)]
            items = tuple(SteadyItem(key=key, model=m.model, vector=v) for key in keys)
            out.append(SteadyDemand(model=m.model, items=items,
                                    reason="fits one device" if r == 1 else f"{r} replicas at 1/{r} of the load"))
        else:
            out.append(SteadyDemand(model=m.model, items=(), reason=f"exceeds one device even at "
                                    f"{cfg.max_steady_replicas} replicas: {tuple(round(x, 3) for x in v)}"))
    return tuple(out)


def replicas_to_fit(model: str, load: LoadFeatures, pred: CapacityPredictor, margin: float,
                    limit: int) -> tuple[int | None, Vec3]:
    """The fewest replicas r <= `limit` whose capacity vector at 1/r of the load fits one
    device, and that vector (None and the vector at `limit` when none does). The steady
    pool sizes its replicas by it; the fast loop floors m* with it (control/room.py), so
    a load the capacity says no device carries is never given one instance."""
    v: Vec3 = (0.0, 0.0, 0.0)
    for r in range(1, max(1, limit) + 1):
        v = _vector(pred, model, scaled(load, 1.0 / r), margin)
        if max(v) <= 1.0 + FIT_EPS:
            return r, v
    return None, v


def elastic_demand(app_model: str, load: LoadFeatures, pred: ElasticityPredictor, cfg: DemandConfig) -> tuple[int, str]:
    """m* for one elastic app (served by model `app_model`) and its reason."""
    ans = pred.min_instances(app_model, load, cfg.attainment_target, cfg.attainment_margin, cfg.max_elastic_instances)
    if ans.m is None:
        return cfg.max_elastic_instances, f"no count up to {cfg.max_elastic_instances} reaches " \
                                          f"{cfg.attainment_target:.0%}: {ans.reason}"
    return ans.m, ans.reason


def prefill_share(load: LoadFeatures, prefill_s_per_token: float, decode_s_per_token: float) -> float:
    """Prefill's part of the app's device time (0.5 with no traffic or no costs known)."""
    if not (prefill_s_per_token >= 0.0 and decode_s_per_token >= 0.0):
        raise ValueError("per-token costs must be >= 0")
    p = load.input_token_rate * prefill_s_per_token
    d = load.output_token_rate * decode_s_per_token
    return 0.5 if p + d <= 0.0 else p / (p + d)

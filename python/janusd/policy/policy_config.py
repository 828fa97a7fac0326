"""Configuration of the controller's policies: one frozen Struct per policy.

Each policy gets only its own Struct (placement never sees the keep-alive windows). The
loop periods themselves (30 s slow, 0.5 s fast) are config.ControlConfig's and the
policies never need them: every window below is in seconds and measured against the
`now` the caller passes. Defaults are the documented operating point; `ControllerConfig`
groups them for the daemon's `[control]` section (wired by config/sections.py, not here).

Out-of-range values fail at construction (msgspec.convert from TOML raises a
ValidationError naming the field); a cross-field rule (a hysteresis band upside down)
raises ValueError from __post_init__ with both names.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from janusd.settings import Fraction, NonNegFloat, NonNegInt, PositiveFloat, PositiveInt, Section


class DemandConfig(Section):
    """How predictions become demands (demand.py)."""

    # capacity vector = mean + margin * std per dimension (PAPER.md §3: compute and
    # bandwidth errors reach ~24% at P90, so a margin of one std is the default)
    capacity_margin: NonNegFloat = 1.0
    # a steady model whose vector exceeds one device is split into up to this many replicas
    max_steady_replicas: PositiveInt = 16
    # elastic m*: the fewest instances whose predicted attainment (mean - margin * std)
    # reaches the target
    attainment_target: Fraction = 0.95
    attainment_margin: NonNegFloat = 1.0
    max_elastic_instances: PositiveInt = 64


class PlacementConfig(Section):
    """Steady pool (placement.py)."""

    # optional migrations (repack + consolidation) per slow period; forced moves (new
    # models, devices over capacity or gone) are never limited by it
    migration_budget: NonNegInt = 8
    # a model leaving repacks its device when that frees the device, or when the
    # device's imbalance potential Phi rose by at least this much
    repack_phi_threshold: NonNegFloat = 0.05
    repack_max_moves: NonNegInt = 2
    # a balancing move (no device freed) must lower the summed Phi by at least this
    # much: below it, a move is churn (hysteresis against ping-pong between two devices)
    min_phi_gain: NonNegFloat = 0.02


class ScalingConfig(Section):
    """Elastic pool (scaling.py)."""

    # debounce: a count moves only when the last `debounce_plans` demands all lie on the
    # same side of it (1 = no debounce: the scale-in hold below keeps counts from flapping,
    # and each plan past 1 delays a scale-out by one fast tick)
    debounce_plans: PositiveInt = 1
    # hysteresis on m* (control/burst.py): the count asked is the largest m* of this many
    # seconds, so a scale-in comes only after demand stayed low this long
    scale_in_hold_s: NonNegFloat = 10.0
    # under compression each app keeps at least this many instances when the budget
    # allows it for every app
    min_instances_per_app: NonNegInt = 1
    # P/D from this many instances of an app up (one instance runs prefill and decode mixed)
    pd_min_instances: Annotated[int, Meta(ge=2)] = 2


class ClassifyConfig(Section):
    """Bursty isolation (classify.py): an app goes elastic when it is hot or bursty and
    comes back only after staying below the lower thresholds for `quiet_s`."""

    elastic_rate: PositiveFloat = 5.0  # requests/s: at or above, elastic
    steady_rate: NonNegFloat = 2.0  # requests/s: below it (and calm), quiet
    elastic_volatility: Annotated[float, Meta(gt=1.0)] = 3.0  # peak/mean at or above: bursty
    steady_volatility: Annotated[float, Meta(ge=1.0)] = 2.0  # peak/mean below it: calm
    # below this mean rate, volatility is noise (a few requests make any peak/mean)
    min_burst_rate: NonNegFloat = 0.5
    quiet_s: NonNegFloat = 120.0

    def __post_init__(self) -> None:
        if self.steady_rate >= self.elastic_rate:
            raise ValueError(f"classify: steady_rate ({self.steady_rate}) must be below elastic_rate "
                             f"({self.elastic_rate}), or apps flap between pools")
        if self.steady_volatility >= self.elastic_volatility:
            raise ValueError(f"classify: steady_volatility ({self.steady_volatility}) must be below "
                             f"elastic_volatility ({self.elastic_volatility}), or apps flap between pools")


class KeepAliveConfig(Section):
    """Residency of idle models (keepalive.py)."""

    warm_after_s: PositiveFloat = 300.0  # no request for this long: Active -> Warm
    cold_after_s: PositiveFloat = 3600.0  # no request for this long: -> Cold
    demote_pinned: bool = False  # operator-pinned models stay Active unless true

    def __post_init__(self) -> None:
        if self.cold_after_s <= self.warm_after_s:
            raise ValueError(f"keepalive: cold_after_s ({self.cold_after_s}) must exceed warm_after_s "
                             f"({self.warm_after_s})")


class ControllerConfig(Section):
    demand: DemandConfig = DemandConfig()
    placement: PlacementConfig = PlacementConfig()
    scaling: ScalingConfig = ScalingConfig()
    classify: ClassifyConfig = ClassifyConfig()
    keepalive: KeepAliveConfig = KeepAliveConfig()

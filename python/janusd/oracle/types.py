"""The oracle's vocabulary: what goes into a prediction and what comes out.

One owner for the shapes the oracle ([O]), the controller's policies ([C]) and the
simulator ([S]) exchange, so that a policy written against these Protocols runs the same
with the fitted Gaussian processes, a roofline prior or a test's closed-form fake.
Resource vectors are fractions of one device in a fixed order (RESOURCE_DIMS), so a bin
of capacity 1.0 per dimension is one device.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from janusd.telemetry.telemetry import ModelWindow

RESOURCE_DIMS: tuple[str, ...] = ("hbm", "compute", "bandwidth")


class LoadFeatures(msgspec.Struct, frozen=True):
    """A model's offered load, the input of every prediction (PAPER.md §3).

    Output lengths follow telemetry's rule: finished requests, plus each in-flight
    request's max_tokens as a prior until it ends.
    """

    request_rate: float  # requests per second
    input_token_rate: float  # prompt tokens per second
    output_token_rate: float  # output tokens per second
    input_len_mean: float
    input_len_var: float
    output_len_mean: float
    output_len_var: float

    @classmethod
    def from_window(cls, w: ModelWindow) -> LoadFeatures:
        """Offered output token rate = arrivals x mean output length (not the delivered
        rate, which saturates exactly when the prediction matters)."""
        return cls(
            request_rate=w.request_rate,
            input_token_rate=w.input_token_rate,
            output_token_rate=w.request_rate * w.output_len_mean,
            input_len_mean=w.input_len_mean,
            input_len_var=w.input_len_var,
            output_len_mean=w.output_len_mean,
            output_len_var=w.output_len_var,
        )

    def vector(self) -> list[float]:
        return [getattr(self, f) for f in self.__struct_fields__]


class ResourceEstimate(msgspec.Struct, frozen=True):
    """Predicted demand of one instance under a load: per RESOURCE_DIMS, fractions of a
    device. `std` is the model's uncertainty (0 for a deterministic prior)."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    source: str  # "gp" | "prior" | a test's name: shown by ctl and logs

    def with_margin(self, k: float) -> tuple[float, float, float]:
        """mean + k * std per dimension: the capacity vector placement packs."""
        m, s = self.mean, self.std
        return (m[0] + k * s[0], m[1] + k * s[1], m[2] + k * s[2])


class AttainmentEstimate(msgspec.Struct, frozen=True):
    """Predicted per-token SLO attainment (0..1) of a model served by m instances."""

    mean: float
    std: float
    source: str


class MinInstances(msgspec.Struct, frozen=True):
    """Answer of ElasticityPredictor.min_instances: m is None when no m up to the limit
    reaches the target, and `reason` says why (shown to operators)."""

    m: int | None
    predicted: AttainmentEstimate | None
    reason: str


class CapacityPredictor(Protocol):
    def capacity(self, model: str, load: LoadFeatures) -> ResourceEstimate: ...


class ElasticityPredictor(Protocol):
    def attainment(self, model: str, load: LoadFeatures, instances: int) -> AttainmentEstimate: ...

    def min_instances(
        self, model: str, load: LoadFeatures, target: float, margin: float, limit: int
    ) -> MinInstances: ...

"""Closed-form, deterministic predictors that satisfy oracle/types.py's Protocols, for the
policy tests (the fitted GPs are [O]'s and are not used here): capacity linear in the
request rate, attainment a logistic curve in instances per unit of load."""

from __future__ import annotations

import math

from janusd.oracle.types import AttainmentEstimate, LoadFeatures, MinInstances, ResourceEstimate


def load(rate: float) -> LoadFeatures:
    return LoadFeatures(request_rate=rate, input_token_rate=rate * 100, output_token_rate=rate * 50,
                        input_len_mean=100.0, input_len_var=10.0, output_len_mean=50.0, output_len_var=5.0)


class LinearCapacity:
    """hbm fixed (weights), compute and bandwidth 0.1 per request/s, std 10% of the mean."""

    def capacity(self, model: str, features: LoadFeatures) -> ResourceEstimate:
        r = features.request_rate
        mean = (0.3, 0.1 * r, 0.08 * r)
        return ResourceEstimate(mean=mean, std=tuple(0.1 * x for x in mean), source="linear")  # type: ignore[arg-type]


class LogisticAttainment:
    """Attainment rises with instances per unit of load; m* by linear scan (monotone)."""

    def attainment(self, model: str, features: LoadFeatures, instances: int) -> AttainmentEstimate:
        x = instances / max(features.request_rate, 1e-9)
        return AttainmentEstimate(mean=1.0 / (1.0 + math.exp(-8.0 * (x - 0.5))), std=0.01, source="logistic")

    def min_instances(self, model: str, features: LoadFeatures, target: float, margin: float,
                      limit: int) -> MinInstances:
        for m in range(1, limit + 1):
            a = self.attainment(model, features, m)
            if a.mean - margin * a.std >= target:
                return MinInstances(m=m, predicted=a, reason=f"m={m}: {a.mean:.3f}")
        return MinInstances(m=None, predicted=None, reason="not reachable")

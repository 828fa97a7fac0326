"""The simulator's oracle with a measured error (`janus sim --oracle-error F`): the control
room in simulation otherwise asks a prior built from the simulator's own performance
model, an oracle that is exactly right about the world it plans for, which the daemon's
never is. Here each served model's load is misjudged by a fixed factor drawn once, per
model, uniformly from [1 - F, 1 + F] (seeded): the oracle sees the request and token
rates times that factor, so its capacity vectors and m* are that far off for the whole
run, as a fitted GP that is biased for one model is. F is meant to be a measured error:
the held-out P90 relative error `janus oracle eval` reports (bench/RESULTS.md)."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import numpy as np

from janusd.oracle.types import AttainmentEstimate, LoadFeatures, MinInstances, ResourceEstimate


class OracleErrorError(ValueError):
    """A bad --oracle-error (says which bound)."""


class MisjudgingOracle:
    """Any predictor (capacity, attainment, min_instances) asked about a misjudged load."""

    def __init__(self, base, models: Iterable[str], error: float, seed: int = 0) -> None:  # type: ignore[no-untyped-def]
        if not 0.0 <= error < 1.0:
            raise OracleErrorError(f"--oracle-error must be in [0, 1), got {error}")
        self.base = base
        rng = np.random.default_rng(seed)
        self.factor = {m: float(rng.uniform(1.0 - error, 1.0 + error)) for m in sorted(models)}

    def _seen(self, model: str, load: LoadFeatures) -> LoadFeatures:
        k = self.factor.get(model, 1.0)
        return msgspec.structs.replace(load, request_rate=load.request_rate * k,
                                       input_token_rate=load.input_token_rate * k,
                                       output_token_rate=load.output_token_rate * k)

    def capacity(self, model: str, load: LoadFeatures) -> ResourceEstimate:
        return self.base.capacity(model, self._seen(model, load))

    def attainment(self, model: str, load: LoadFeatures, instances: int) -> AttainmentEstimate:
        return self.base.attainment(model, self._seen(model, load), instances)

    def min_instances(self, model: str, load: LoadFeatures, target: float, margin: float,
                      limit: int) -> MinInstances:
        return self.base.min_instances(model, self._seen(model, load), target, margin, limit)

"""The Oracle: per model, the fitted GPs when there are any, the roofline prior when not.

Implements CapacityPredictor and ElasticityPredictor (oracle/types.py) for every model it
knows. Which source answered is in every estimate's `source` ("gp" or "prior") and in
status(); a model is never silently answered by another model's fit. Pure: models are
installed by the caller (a profile fit, a loaded store, an online refit), no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from janusd.oracle import elasticity
from janusd.oracle.capacity import CapacityModel
from janusd.oracle.elasticity import ElasticityModel
from janusd.oracle.prior import RooflinePrior
from janusd.oracle.types import AttainmentEstimate, LoadFeatures, MinInstances, ResourceEstimate


@dataclass
class ModelEntry:
    prior: RooflinePrior | None = None
    capacity: CapacityModel | None = None
    elasticity: ElasticityModel | None = None
    info: dict[str, object] = field(default_factory=dict)  # points, fitted_at, heldout error: for ctl


class Oracle:
    def __init__(self) -> None:
        self._models: dict[str, ModelEntry] = {}

    def entry(self, model: str) -> ModelEntry:
        return self._models.setdefault(model, ModelEntry())

    def set_prior(self, model: str, prior: RooflinePrior) -> None:
        self.entry(model).prior = prior

    def set_fitted(self, model: str, capacity: CapacityModel | None, elasticity_model: ElasticityModel | None,
                   info: dict[str, object] | None = None) -> None:
        e = self.entry(model)
        e.capacity, e.elasticity = capacity, elasticity_model
        e.info = dict(info or {})

    def forget(self, model: str) -> None:
        self._models.pop(model, None)

    def models(self) -> list[str]:
        return sorted(self._models)

    def source(self, model: str) -> str:
        """'gp', 'prior', 'gp+prior' (one of the two GPs fitted) or 'none'."""
        e = self._models.get(model)
        if e is None:
            return "none"
        fitted = (e.capacity is not None) + (e.elasticity is not None)
        return "gp" if fitted == 2 else ("gp+prior" if fitted else ("prior" if e.prior else "none"))

    def _need(self, model: str) -> ModelEntry:
        e = self._models.get(model)
        if e is None or (e.prior is None and e.capacity is None and e.elasticity is None):
            raise KeyError(f"the oracle knows nothing of model {model!r} (no profile and no prior)")
        return e

    def capacity(self, model: str, load: LoadFeatures) -> ResourceEstimate:
        e = self._need(model)
        if e.capacity is not None:
            return e.capacity.capacity(load)
        if e.prior is None:
            raise KeyError(f"model {model!r}: no Capacity GP and no prior")
        return e.prior.capacity(model, load)

    def _raw(self, model: str) -> tuple[elasticity.RawAttainment, str]:
        e = self._need(model)
        if e.elasticity is not None:
            return e.elasticity, "gp"
        if e.prior is None:
            raise KeyError(f"model {model!r}: no Elasticity GP and no prior")
        return e.prior, "prior"

    def attainment(self, model: str, load: LoadFeatures, instances: int) -> AttainmentEstimate:
        src, name = self._raw(model)
        return elasticity.attainment_at(src, load, instances, name)

    def min_instances(self, model: str, load: LoadFeatures, target: float, margin: float, limit: int) -> MinInstances:
        src, name = self._raw(model)
        return elasticity.min_instances(src, load, target, margin, limit, name)

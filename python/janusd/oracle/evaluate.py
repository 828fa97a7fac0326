"""`janus oracle eval`: the GPs' and the prior's errors on held-out load points, and a
parity plot.

Held out by load point: the points are split into K folds of whole load points
(fit.split_by_point's rule, K disjoint test sets covering every point once); each fold is
predicted by GPs fitted on the other folds only, so every point gets one out-of-sample
prediction and the percentiles use all of them (a single 30% split of a few dozen points
would make a P90 of three values). The prior needs no fit and predicts every point.
Figures as fit.errors defines them, plus the measurement's noise floor (noise.py) where
the file repeats load points: an error near the floor is what a perfect model would make.
The prior runs on the device spec in the file's header; `overheads` replaces its host
time per step (hw/devices.py OVERHEAD_FIELDS), e.g. to evaluate a file written before
those figures existed with the ones measured since on the same machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from janusd.hw.devices import OVERHEAD_FIELDS, DeviceSpec
from janusd.hw.model_spec import ModelSpec
from janusd.oracle.dataset import Points
from janusd.oracle.fit import SERVED, errors_of, fit_points, monotone_predictions, per_instance, predict_capacity
from janusd.oracle.noise import noise_floor
from janusd.oracle.prior import RooflinePrior
from janusd.oracle.types import RESOURCE_DIMS

HEADLINE = ("attainment_abs_err_median_pts", "attainment_abs_err_p90_pts", "compute_rel_err_p90_pct",
            "bw_rel_err_p90_pct", "hbm_rel_err_p90_pct", "prior_attainment_abs_err_p90_pts")


def prior_of(points: Points, overheads: dict[str, float] | None = None) -> RooflinePrior:
    """The roofline prior for the model and device a points file was measured on."""
    h = points.header
    fields = set(ModelSpec.__struct_fields__)
    spec = ModelSpec(**{k: v for k, v in h["model_spec"].items() if k in fields})
    dev = DeviceSpec(**{**h["device"], **(overheads or {})})
    dev.check()
    return RooflinePrior(spec, dev, h["slo"]["ttft_ms"] / 1e3, h["slo"]["tpot_ms"] / 1e3)


def folds(point_id: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    ids = np.unique(point_id)
    rng = np.random.default_rng(seed)
    rng.shuffle(ids)
    return [np.isin(point_id, part) for part in np.array_split(ids, min(k, len(ids))) if len(part)]


def evaluate(points: Points, k: int = 5, seed: int = 0, overheads: dict[str, float] | None = None
             ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(figures, per-point arrays for the plot)."""
    if len(np.unique(points.point_id)) < 4:
        raise ValueError(f"need at least 4 load points to hold some out, got {len(np.unique(points.point_id))}")
    n = len(points)
    att_pred = np.empty(n)
    cap_pred = np.empty((n, len(RESOURCE_DIMS)))
    prior = prior_of(points, overheads)
    chosen: list[str] = []
    bw_forms: list[str] = []
    for test in folds(points.point_id, k, seed):
        cap, ela = fit_points(points.take(~test), seed=seed, prior=prior)
        chosen.append(ela.input_set)
        bw_forms.append(cap.bw_form)
        held = points.take(test)
        att_pred[test] = monotone_predictions(ela, held)
        cap_pred[test] = predict_capacity(cap, per_instance(held.features, held.instances), held.instances)
    prior_att = monotone_predictions(prior, points)
    prior_cap = predict_capacity(prior, per_instance(points.features, points.instances))
    figures = errors_of(points, att_pred, cap_pred, (prior_att, prior_cap))
    figures |= noise_floor(points)
    figures["prior_device_overheads"] = {f: getattr(prior.device, f) for f in OVERHEAD_FIELDS}
    figures["elasticity_inputs"] = {name: chosen.count(name) for name in sorted(set(chosen))}  # folds per input set
    figures["capacity_bw_mean"] = {name: bw_forms.count(name) for name in sorted(set(bw_forms))}  # folds per form
    figures["points"] = n
    figures["folds"] = min(k, len(np.unique(points.point_id)))
    arrays = {"attainment": points.attainment, "attainment_pred": att_pred, "attainment_prior": prior_att,
              "resources": points.resources, "resources_pred": cap_pred, "resources_prior": prior_cap}
    return figures, arrays


def parity_plot(arrays: dict[str, np.ndarray], path: str | Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    ax = axes[0]
    ax.scatter(arrays["attainment"] * 100, arrays["attainment_pred"] * 100, s=14, label="GP (held out)")
    ax.scatter(arrays["attainment"] * 100, arrays["attainment_prior"] * 100, s=14, marker="x", label="prior")
    ax.plot([0, 100], [0, 100], "k:", lw=1)
    ax.set(xlabel="measured attainment (%)", ylabel="predicted (%)", title="SLO attainment")
    ax.legend(fontsize=8)
    served = arrays["attainment"] >= SERVED  # capacity is demand: judged where the load was served
    for j, dim in enumerate(RESOURCE_DIMS):
        ax = axes[j + 1]
        meas = arrays["resources"][served, j]
        pred = arrays["resources_pred"][served, j]
        ax.scatter(meas, pred, s=14, label="GP (held out)")
        ax.scatter(meas, arrays["resources_prior"][served, j], s=14, marker="x", label="prior")
        hi = float(max(meas.max(initial=0.0), pred.max(initial=0.0), 1e-9)) * 1.05
        ax.plot([0, hi], [0, hi], "k:", lw=1)
        ax.set(xlabel=f"measured {dim} (fraction of a device)", ylabel="predicted",
               title=f"{dim} (points with attainment >= {SERVED})")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

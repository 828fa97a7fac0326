"""Fitted oracle models on disk, under the daemon's state directory: one pair per model.

  NAME.json  {"format": "janusd-oracle-model", "version": 4, "model": name,
              "model_spec": hw ModelSpec identity, "device": device name,
              "info": {"points", "fitted_at", "heldout": eval figures, ...},
              "kernels": {"capacity": [3 kernel strings], "elasticity": kernel string},
              "elasticity_inputs": one of elasticity.py INPUT_SETS ("full" when absent),
              "elasticity_link": pressure_link.py's {"knee", "slope", "interference"} under "calibrated" or
                                 "interference" (elasticity.py LINKED), else null,
              "capacity_bw": {"form": one of capacity.py BW_FORMS, "step_factor": float,
                              "step_time": step_rate.StepTime as [per_step, per_seq, per_seq_ctx] or null}}
  NAME.npz   the training points (dataset.py's arrays: features, instances, resources,
             attainment, point_id, engine) and per GP its hyperparameters and input scaler:
             cap0_theta, cap0_x_mean, cap0_x_std, ... cap2_*, ela_theta, ela_x_mean, ela_x_std
NAME is the model name with every character outside [A-Za-z0-9._-] percent-encoded.
Loading refits each GP with its stored hyperparameters on the stored points (no
optimisation), which reproduces the saved model's predictions exactly. Anything wrong
(unreadable, another format or version, another model or model shape, inconsistent
arrays) raises StoreError naming the file; the caller then falls back to the prior.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from janusd.oracle.capacity import CapacityModel, check_bw_form, gp_trends
from janusd.oracle.dataset import Points
from janusd.oracle.elasticity import ElasticityModel
from janusd.oracle.fit import per_instance, served_mask
from janusd.oracle.gp import GPRegressor
from janusd.oracle.inputs import capacity_inputs
from janusd.oracle.pressure_link import PressureLink
from janusd.oracle.step_rate import StepTime

FORMAT = "janusd-oracle-model"
VERSION = 4  # 2: the Capacity GPs have a linear mean; 3: the bandwidth mean form (capacity.py BW_FORMS); 4: the
# measured step time and the points' engine counters. Older: refused, then refitted
_POINT_ARRAYS = ("features", "instances", "resources", "attainment", "point_id", "engine")


class StoreError(ValueError):
    """A stored oracle model cannot be used; the message names the file."""


def file_stem(directory: Path, model: str) -> Path:
    return Path(directory) / quote(model, safe="._-")


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def save(directory: str | os.PathLike[str], model: str, points: Points, cap: CapacityModel, ela: ElasticityModel,
         model_spec: dict[str, Any], device: str, info: dict[str, Any]) -> Path:
    """Write NAME.npz then NAME.json (the JSON last: a crash in between leaves a pair the
    loader refuses as inconsistent, never a stale JSON over new arrays)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    stem = file_stem(d, model)
    arrays: dict[str, np.ndarray] = {k: getattr(points, k) for k in _POINT_ARRAYS}
    for k, gp in enumerate(cap.gps):
        arrays |= {f"cap{k}_theta": gp.theta, f"cap{k}_x_mean": gp.x_mean, f"cap{k}_x_std": gp.x_std}
    arrays |= {"ela_theta": ela.gp.theta, "ela_x_mean": ela.gp.x_mean, "ela_x_std": ela.gp.x_std}
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    _atomic(stem.with_suffix(".npz"), buf.getvalue())
    header = {"format": FORMAT, "version": VERSION, "model": model, "model_spec": model_spec, "device": device,
              "info": info, "points": len(points), "capacity_base": "prior" if cap.prior is not None else "none",  # both GPs use the prior or neither
              "kernels": {"capacity": [gp.to_state()[0]["kernel"] for gp in cap.gps],
                          "elasticity": ela.gp.to_state()[0]["kernel"]},
              "elasticity_inputs": ela.input_set,
              "elasticity_link": None if ela.link is None else ela.link.to_state(),
              "capacity_bw": {"form": cap.bw_form, "step_factor": cap.step_factor,
                              "step_time": None if cap.step_time is None else cap.step_time.to_list()}}
    _atomic(stem.with_suffix(".json"), (json.dumps(header, indent=1, sort_keys=True) + "\n").encode())
    return stem.with_suffix(".json")


def load(directory: str | os.PathLike[str], model: str, model_spec: dict[str, Any] | None = None,
         prior: Any | None = None) -> tuple[Points, CapacityModel, ElasticityModel, dict[str, Any]]:
    """(points, capacity, elasticity, header) of a stored model; StoreError (module doc).
    `model_spec`, when given, must equal the stored one (a model whose shape changed under
    the same name is another model). A Capacity GP fitted as a correction of the prior
    ("capacity_base": "prior") needs that prior to load."""
    stem = file_stem(Path(directory), model)
    jpath, npath = stem.with_suffix(".json"), stem.with_suffix(".npz")
    try:
        header = json.loads(jpath.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"{jpath}: no stored oracle model") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise StoreError(f"{jpath}: unreadable: {e}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StoreError(f"{jpath}: not a {FORMAT} file")
    if header.get("version") != VERSION:
        raise StoreError(f"{jpath}: version {header.get('version')!r}, this janusd reads {VERSION}")
    if header.get("model") != model:
        raise StoreError(f"{jpath}: holds model {header.get('model')!r}, not {model!r}")
    if model_spec is not None and header.get("model_spec") != model_spec:
        raise StoreError(f"{jpath}: fitted for another shape of {model!r} ({header.get('model_spec')}); "
                         f"the model now is {model_spec}")
    base = header.get("capacity_base", "none")
    if base not in ("prior", "none"):
        raise StoreError(f"{jpath}: unknown capacity_base {base!r}")
    if base == "prior" and prior is None:
        raise StoreError(f"{jpath}: its Capacity GP corrects the roofline prior, and no prior was given")
    try:
        with np.load(npath, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise StoreError(f"{npath}: missing (its JSON {jpath.name} exists)") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise StoreError(f"{npath}: unreadable npz: {e}") from None
    try:
        points = Points({"model": model}, *(arrays[k] for k in _POINT_ARRAYS))
        points.check(str(npath))
        if len(points) != header.get("points"):
            raise ValueError(f"{len(points)} points, the JSON says {header.get('points')}")
        served = served_mask(points.attainment)  # fit.py's rule: capacity learns from served loads only
        per = per_instance(points.features[served], points.instances[served])
        cx = capacity_inputs(per)
        cap_prior = prior if base == "prior" else None
        bw = header.get("capacity_bw")
        if not (isinstance(bw, dict) and isinstance(bw.get("step_factor"), int | float)):
            raise ValueError(f"capacity_bw is {bw!r}, expected {{'form': ..., 'step_factor': number}}")
        form, factor = bw.get("form"), float(bw["step_factor"])
        check_bw_form(str(form), cap_prior)
        st = bw.get("step_time")
        if st is not None and not (isinstance(st, list) and len(st) == 3 and all(isinstance(v, int | float) for v in st)):
            raise ValueError(f"capacity_bw.step_time is {st!r}, expected null or 3 numbers")
        step_time = None if st is None else StepTime(*(float(v) for v in st))
        cy = CapacityModel.targets(per, points.resources[served], cap_prior, str(form), factor,
                                   points.instances[served], step_time)
        gps = [GPRegressor.from_state({"x": cx, "y": cy[:, k], "theta": arrays[f"cap{k}_theta"],
                                       "x_mean": arrays[f"cap{k}_x_mean"], "x_std": arrays[f"cap{k}_x_std"],
                                       "trend": trend})
               for k, trend in enumerate(gp_trends(str(form)))]
        input_set = header.get("elasticity_inputs", "full")
        ex = ElasticityModel.inputs(points.features, points.instances, cap_prior, input_set)
        link_state = header.get("elasticity_link")
        link = None if link_state is None else PressureLink.from_state(link_state)
        ela = GPRegressor.from_state({"x": ex, "y": ElasticityModel.gp_target(ex, points.attainment, link),
                                      "theta": arrays["ela_theta"], "x_mean": arrays["ela_x_mean"],
                                      "x_std": arrays["ela_x_std"], "trend": link is None})
        elasticity = ElasticityModel(ela, cap_prior, input_set, link)
    except KeyError as e:
        raise StoreError(f"{npath}: missing array {e.args[0]!r}") from None
    except (ValueError, np.linalg.LinAlgError) as e:
        raise StoreError(f"{npath}: inconsistent: {e}") from None
    return points, CapacityModel(gps, cap_prior, str(form), factor, step_time), elasticity, header


def load_into(oracle: Any, directory: str | os.PathLike[str], model: str, model_spec: dict[str, Any],
              log: Any) -> tuple[str, Points | None]:
    """Install a stored fit into `oracle` for `model`; ("gp", points) when it loaded. When
    there is none, or it is refused, log why (naming the file) and leave the model on its
    prior: ("prior", None)."""
    try:
        points, cap, ela, header = load(directory, model, model_spec, oracle.entry(model).prior)
    except StoreError as e:
        missing = "no stored oracle model" in str(e)
        (log.info if missing else log.warning)("oracle: %s; %s uses the roofline prior", e, model)
        return "prior", None
    oracle.set_fitted(model, cap, ela, {**header.get("info", {}), "points": len(points)})
    log.info("oracle: %s: loaded a fit on %d points from %s", model, len(points), directory)
    return "gp", points

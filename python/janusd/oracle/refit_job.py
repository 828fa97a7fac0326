"""The oracle's work that must not run in the daemon's process: what a model costs (the
checkpoint is read with the engine's loader, which the daemon never imports) and the GP
fits (seconds of CPU holding the GIL in sklearn's optimiser).

Both run in a spawned helper process (server/oracle_refit.py owns it). Arguments and
results are plain values: points travel as dataset.py's npz bytes, models come back
through the store (oracle/store.py) on disk, where the daemon loads them: the hand-off
is the persistence, no model object crosses the process edge.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


HELPER_NICE = 10


def lower_priority() -> None:
    """The helper's first act: yield the CPU to serving. On a busy host a fit at the
    daemon's own priority takes the core the event loop needs (measured: 300 ms stalls)."""
    import os

    try:
        os.nice(HELPER_NICE)
    except OSError:
        pass


def describe(checkpoint: str, dtype: str, cache_dir: str, device: str, hbm_bytes: float | None) -> dict[str, Any]:
    """{"model_spec": ModelSpec fields, "identity": ModelSpec.identity(), "device": DeviceSpec fields}."""
    import msgspec

    from janusd.engine import step_probe
    from janusd.engine.loader import open_checkpoint
    from janusd.engine.model_cost import served_spec
    from janusd.hw.devices import device_spec

    ck = open_checkpoint(checkpoint, Path(cache_dir).expanduser())
    dev = device_spec(device, hbm_bytes=hbm_bytes, cache_dir=Path(cache_dir).expanduser(),
                      overhead_probe=step_probe.bind(cache_dir))
    spec = served_spec(ck, dtype, "cpu" if dev.host_is_device else "accelerator")
    return {"model_spec": msgspec.to_builtins(spec), "identity": spec.identity(), "device": msgspec.to_builtins(dev)}


def fit_and_store(points_npz: bytes, model: str, state_dir: str, identity: dict[str, Any], device: str,
                  fitted_at: float, prior_args: dict[str, Any] | None = None, seed: int = 0) -> dict[str, Any]:
    """Held-out error (by load point) of a fit without a third of the points, then the fit
    on all of them, saved under state_dir; returns what `janus ctl oracle` shows.
    prior_args: {"model_spec", "device", "ttft_slo_s", "tpot_slo_s", "tp"} of the roofline prior
    the Capacity GP corrects (none: it learns the demand itself)."""
    from janusd.hw.devices import DeviceSpec
    from janusd.hw.model_spec import ModelSpec
    from janusd.oracle import store
    from janusd.oracle.dataset import decode
    from janusd.oracle.fit import errors, fit_points, split_by_point
    from janusd.oracle.prior import RooflinePrior

    prior = None
    if prior_args is not None:
        prior = RooflinePrior(ModelSpec(**prior_args["model_spec"]), DeviceSpec(**prior_args["device"]),
                              prior_args["ttft_slo_s"], prior_args["tpot_slo_s"], tp=prior_args.get("tp", 1))
    pts = decode(points_npz, f"online points of {model}")
    heldout = None
    if len(set(pts.point_id.tolist())) >= 6:
        test = split_by_point(pts.point_id, 0.3, seed)
        cap, ela = fit_points(pts.take(~test), seed, prior)
        heldout = errors(cap, ela, pts.take(test))
    t0 = time.perf_counter()
    cap, ela = fit_points(pts, seed, prior)
    fit_s = time.perf_counter() - t0
    info = {"fitted_at": fitted_at, "fit_s": round(fit_s, 3), "heldout": heldout, "points": len(pts)}
    store.save(state_dir, model, pts, cap, ela, identity, device, info)
    return info

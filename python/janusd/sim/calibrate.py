"""Fit the performance model to an engine's measured step times.

Why: the roofline's defaults (sim/perfmodel.py) describe an accelerator, where a step is
its FLOPs or bytes plus a few ms of launch cost. The cpu engine running a demo model is
another machine: most of a decode step is host work per sequence, and prefill runs at
some fraction of the measured peak. Fitting overhead_s, seq_overhead_s, compute_eff and
bandwidth_eff to measured steps of the same model on the same device lets `janus sim
--device cpu` predict a real `janus replay` run (bench/RESULTS.md "sim": the side by
side).

The measurements are `janus bench engine`'s (bench/engine.py: per batch size b, the
prefill of b prompts of `prompt_len` tokens and `decode_steps` decode steps of b
sequences, on a DeviceEngine with max_num_batched_tokens = BENCH_BATCHED_TOKENS). `janus
profile` points (oracle/) carry load and attainment, not step times, so they cannot
separate the four figures; the engine bench measures exactly a step.

Pure: the fit reads no clock and no file (points come in, figures go out).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from janusd.sim.perfmodel import PerfModel
from janusd.sim.worker import EngineLimits
from janusd.sim.specs import SimModel

# bench/engine.py's _load: EngineConfig(max_num_batched_tokens=512) for every model
BENCH_BATCHED_TOKENS = 512
FITTED = ("overhead_s", "seq_overhead_s", "compute_eff", "bandwidth_eff")


class CalibrationError(ValueError):
    """Measurements the fit cannot use; says which and why."""


@dataclass(frozen=True)
class StepPoint:
    """One measured step: `prefill_tokens` new prompt tokens covering `prefill_pairs`
    (token, context) pairs, `decode_batch` sequences decoding over `decode_context`
    tokens in all, `seqs` sequences in the step, and the seconds it took."""

    prefill_tokens: float
    prefill_pairs: float
    decode_batch: float
    decode_context: float
    seqs: float
    seconds: float

    def predict(self, perf: PerfModel, m: SimModel) -> float:
        f, b = perf.work(m, self.prefill_tokens, self.prefill_pairs, self.decode_batch, self.decode_context)
        return perf.step_s(f, b, self.seqs)  # type: ignore[arg-type]


def prefill_point(batch: int, prompt_len: int, seconds_all: float,
                  batched_tokens: int = BENCH_BATCHED_TOKENS) -> StepPoint:
    """`batch` prompts of `prompt_len` tokens prefilled in `seconds_all`, in steps of at
    most `batched_tokens` tokens: one mean step."""
    steps = max(1, math.ceil(batch * prompt_len / batched_tokens))
    per = batch / steps
    return StepPoint(per * prompt_len, per * prompt_len * (prompt_len + 1) / 2.0, 0.0, 0.0, per,
                     seconds_all / steps)


def decode_point(batch: int, context_per_seq: float, step_s: float) -> StepPoint:
    return StepPoint(0.0, 0.0, batch, batch * context_per_seq, batch, step_s)


def points_from_bench(result: Mapping[str, Any], label: str) -> list[StepPoint]:
    """The steps of model `label` in a `janus bench engine` JSON result (module doc)."""
    if not isinstance(result, Mapping) or result.get("bench") != "engine":
        raise CalibrationError('not a `janus bench engine` result (no "bench": "engine")')
    entry = result.get(label)
    if not isinstance(entry, Mapping):
        known = [k for k, v in result.items() if isinstance(v, Mapping) and any(str(b).startswith("b") for b in v)]
        raise CalibrationError(f"no model {label!r} in the bench result (models: {', '.join(known) or 'none'})")
    try:
        prompt_len = int(result["prompt_len"])
        decode_steps = int(result["decode_steps"])
    except (KeyError, TypeError, ValueError):
        raise CalibrationError("the bench result lacks prompt_len / decode_steps") from None
    out = []
    rows = {int(k[1:]): row for k, row in entry.items()
            if k.startswith("b") and k[1:].isdigit() and isinstance(row, Mapping)}
    for b, row in sorted(rows.items()):
        key = f"b{b}"
        try:
            pf_tok_s = float(row["prefill_tok_s"])
            step_ms = float(row["decode_step_ms"])
        except (KeyError, TypeError, ValueError):
            raise CalibrationError(f"{label}.{key}: needs prefill_tok_s and decode_step_ms") from None
        if not (pf_tok_s > 0 and step_ms > 0 and b > 0):
            raise CalibrationError(f"{label}.{key}: non-positive figures")
        out.append(prefill_point(b, prompt_len, b * prompt_len / pf_tok_s))
        out.append(decode_point(b, prompt_len + 1 + decode_steps / 2.0, step_ms / 1000.0))
    if len(out) < len(FITTED):
        raise CalibrationError(f"{label}: {len(out)} measured steps; the fit needs at least {len(FITTED)}")
    return out


@dataclass(frozen=True)
class Fit:
    perf: PerfModel
    rel_errors: tuple[float, ...]  # (predicted - measured) / measured, per point

    @property
    def max_rel_error(self) -> float:
        return max(abs(e) for e in self.rel_errors)

    def figures(self) -> dict[str, float]:
        return {f: float(getattr(self.perf, f)) for f in FITTED} | {"max_rel_error": self.max_rel_error}


def fit(points: list[StepPoint], m: SimModel, base: PerfModel) -> Fit:
    """The four figures (FITTED) of `base` that best predict `points` of model `m`, by
    least squares on relative errors (each point counts alike whatever its length);
    several starts, since the roofline's max() makes the surface piecewise."""
    from scipy.optimize import least_squares

    if len(points) < len(FITTED):
        raise CalibrationError(f"{len(points)} points; the fit needs at least {len(FITTED)}")
    measured = np.array([p.seconds for p in points])

    def model(x: np.ndarray) -> PerfModel:
        return replace(base, overhead_s=float(x[0]), seq_overhead_s=float(x[1]), compute_eff=float(x[2]),
                       bandwidth_eff=float(x[3]))

    def residuals(x: np.ndarray) -> np.ndarray:
        perf = model(x)
        return np.array([p.predict(perf, m) for p in points]) / measured - 1.0

    lo, hi = [0.0, 0.0, 1e-4, 1e-4], [1.0, 1.0, 1.0, 1.0]
    t_min = float(measured.min())
    best = None
    for ce in (0.9, 0.3, 0.05):
        for be in (0.9, 0.3, 0.05):
            x0 = [t_min / 2, t_min / 20, ce, be]
            r = least_squares(residuals, x0, bounds=(lo, hi), x_scale=[t_min, t_min / 10, 0.1, 0.1])
            if best is None or r.cost < best.cost:
                best = r
    assert best is not None
    perf = model(best.x)
    return Fit(perf, tuple(float(e) for e in residuals(best.x)))


PERF_KEYS = ("overhead_s", "seq_overhead_s", "compute_eff", "bandwidth_eff", "usable_frac")
ENGINE_KEYS = ("max_num_seqs", "max_batched_tokens", "kv_wait_timeout_s")


def settings_from_mapping(data: Mapping[str, Any], base: PerfModel,
                          engine: EngineLimits = EngineLimits()) -> tuple[PerfModel, EngineLimits]:
    """`janus sim --perf FILE`'s object: any of PERF_KEYS (the performance model) and
    ENGINE_KEYS (the engine's limits, as the daemon's [engine] section sets them); other
    keys are an error naming them, bad values one naming the key."""
    if not isinstance(data, Mapping):
        raise CalibrationError("expected a JSON object")
    reported = {"max_rel_error", "host_scale"}  # in a summary's "perf": accepted, not used
    unknown = sorted(set(data) - set(PERF_KEYS) - set(ENGINE_KEYS) - reported)
    if unknown:
        raise CalibrationError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(PERF_KEYS + ENGINE_KEYS)})")
    vals: dict[str, Any] = {}
    for k in PERF_KEYS + ENGINE_KEYS:
        if k not in data:
            continue
        v = data[k]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise CalibrationError(f"{k} must be a finite number >= 0, got {v!r}")
        if k in ("max_num_seqs", "max_batched_tokens") and (not isinstance(v, int) or v < 1):
            raise CalibrationError(f"{k} must be an integer >= 1, got {v!r}")
        vals[k] = v
    try:
        perf = replace(base, **{k: float(v) for k, v in vals.items() if k in PERF_KEYS})
    except ValueError as e:
        raise CalibrationError(str(e)) from None
    eng = replace(engine, **{k: v for k, v in vals.items() if k in ENGINE_KEYS})
    return perf, eng


def scale_host(perf: PerfModel, tpot_p50_ms: Callable[[PerfModel], float | None], target_ms: float,
               lo: float = 0.25, hi: float = 256.0, iters: int = 14) -> tuple[PerfModel, float]:
    """The multiplier k on the host figures (overhead_s and seq_overhead_s) under which a
    simulation gives a measured median TPOT: bisection on log k (a longer host share of
    every step lengthens every gap). `tpot_p50_ms(perf)` runs the simulation of the real
    run's trace. Why: the engine bench times a DeviceEngine alone; a real replay on the
    same cores adds the daemon, the token stream and the replayer, all host work per step
    and per sequence. Returns (the scaled model, k)."""
    if not target_ms > 0:
        raise CalibrationError(f"the measured TPOT p50 must be > 0 ms, got {target_ms!r}")

    def scaled(k: float) -> PerfModel:
        return replace(perf, overhead_s=perf.overhead_s * k, seq_overhead_s=perf.seq_overhead_s * k)

    def gap(k: float) -> float:
        v = tpot_p50_ms(scaled(k))
        return math.inf if v is None else v - target_ms  # None: nothing served, slower than any

    a, b = math.log(lo), math.log(hi)
    if gap(math.exp(a)) > 0 or gap(math.exp(b)) < 0:
        raise CalibrationError(f"no host scale in [{lo:g}, {hi:g}] gives a TPOT p50 of {target_ms:g} ms")
    for _ in range(iters):
        mid = (a + b) / 2.0
        if gap(math.exp(mid)) > 0:
            b = mid
        else:
            a = mid
    k = math.exp((a + b) / 2.0)
    return scaled(k), k

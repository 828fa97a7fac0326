"""The bursty trace a dispatch-replay load runs (bench/dispatch_replay.py, step 2 of its
doc): trace/synth.py's skewed, per-app length mix and bursts, synthesized over a longer
span and compressed, so a burst's ramp and decay become sharper as when the paper
compresses its day; every app mapped onto the one served model with the bench's SLO.
numpy and the trace modules load inside the functions (`janus --help` stays light)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from janusd.trace.formats import Trace
    from janusd.trace.synth import SynthParams


def synth_params(rate_rps: float, duration_s: float, *, apps: int, seed: int, compress: float,
                 bursts_per_app: float, base_length: float, max_input: int, max_output: int) -> SynthParams:
    """SynthParams for `compress` x duration_s seconds whose compression to duration_s has
    mean rate rate_rps and about bursts_per_app bursts per app."""
    from janusd.trace.synth import SynthParams

    if not (rate_rps > 0 and duration_s > 0 and compress >= 1 and bursts_per_app >= 0):
        raise ValueError("need rate > 0, duration > 0, compress >= 1, bursts_per_app >= 0")
    span = duration_s * compress
    return SynthParams(
        apps=apps, hours=span / 3600.0, seed=seed, rate=rate_rps / compress,
        bursts_per_app_hour=bursts_per_app * 3600.0 / span, base_length=base_length,
        max_input=max_input, max_output=max_output,
    )  # fmt: skip


def make_trace(rate_rps: float, duration_s: float, model: str, ttft_slo_ms: float, tpot_slo_ms: float,
               **kw: Any) -> Trace:
    """The bursty trace of one load: synthesized, compressed to ~duration_s, every app on
    `model`, every row with the given SLO. kw: the rest of synth_params'."""
    import numpy as np

    from janusd.trace.formats import Trace
    from janusd.trace.synth import synthesize
    from janusd.trace.transform import compress, remap_models

    compress_by = kw.get("compress", 1.0)
    t = synthesize(synth_params(rate_rps, duration_s, **kw))
    if len(t) < 2:
        raise ValueError(f"the trace at {rate_rps:.3g} req/s over {duration_s} s has {len(t)} requests")
    t = remap_models(compress(t, factor=compress_by), [model])
    n = len(t)
    return Trace(t.arrival_s, t.app_id, t.model_id, t.input_tokens, t.output_tokens,
                 np.full(n, float(ttft_slo_ms)), np.full(n, float(tpot_slo_ms)), t.apps, t.models)


def peak_to_mean(arrival_s: Sequence[float] | np.ndarray, window_s: float = 2.0) -> float | None:
    """Burstiness of the aggregate: the busiest window's rate over the mean rate."""
    import numpy as np

    a = np.asarray(arrival_s, dtype=np.float64)
    if len(a) < 2 or a[-1] - a[0] < window_s:
        return None
    counts = np.bincount(((a - a[0]) // window_s).astype(np.int64))
    return float(counts.max() / window_s / (len(a) / (a[-1] - a[0])))


def make_mixed_trace(rate_rps: float, duration_s: float, classes: Sequence[Any], *, seed: int,
                     bursts: int = 3, burst_factor: float = 3.0, burst_s: float = 3.0,
                     jitter_s: float = 1.0) -> Trace:
    """The mixed scenario's trace (replay_setup.MIXED): one app and one model per class,
    each row with its class's SLO and a length drawn from its class's lognormal mix
    (capped), arrivals Poisson at `rate_rps` in all, split by the classes' shares. On top
    of a flat base, `bursts` burst centres shared by every class (each class's burst
    shifted by up to `jitter_s`, so bursts overlap but do not coincide): inside a burst
    of `burst_s` a class arrives `burst_factor` times faster. The mean rate over the run
    stays `rate_rps` (the base is lowered to make room for the bursts). Seeded: every
    policy and run replays the same trace."""
    import numpy as np

    from janusd.trace.formats import Trace

    if not (rate_rps > 0 and duration_s > 0 and bursts >= 0 and burst_factor >= 1 and burst_s > 0):
        raise ValueError("need rate > 0, duration > 0, bursts >= 0, burst_factor >= 1, burst_s > 0")
    rng = np.random.default_rng([seed, 36])
    step = 0.05
    t = np.arange(0.0, duration_s, step)
    centres = np.sort(rng.uniform(0.15 * duration_s, 0.85 * duration_s, bursts))
    arrivals, app, ins, outs = [], [], [], []
    for k, c in enumerate(classes):
        shape = np.ones_like(t)
        for x in centres + rng.uniform(-jitter_s, jitter_s, bursts):
            shape[np.abs(t - x) < burst_s / 2] += burst_factor - 1.0
        lam = shape * (rate_rps * c.share * duration_s / (shape.sum() * step)) * step
        counts = rng.poisson(lam)
        n = int(counts.sum())
        arrivals.append(np.repeat(t, counts) + rng.random(n) * step)
        app.append(np.full(n, k, dtype=np.int32))
        ins.append(np.clip(np.round(rng.lognormal(np.log(c.input_mean), c.input_sigma, n)), 1, c.input_cap))
        outs.append(np.clip(np.round(rng.lognormal(np.log(c.output_mean), c.output_sigma, n)), 1, c.output_cap))
    a = np.concatenate(arrivals)
    order = np.lexsort((np.concatenate(app), a))
    a = np.round(a[order] - a[order][0], 6) if len(a) else a
    app_id = np.concatenate(app)[order]
    if len(a) < 2:
        raise ValueError(f"the mixed trace at {rate_rps:.3g} req/s over {duration_s} s has {len(a)} requests")
    ttft = np.array([c.ttft_slo_ms for c in classes], dtype=np.float64)[app_id]
    tpot = np.array([c.tpot_slo_ms for c in classes], dtype=np.float64)[app_id]
    names = tuple(c.name for c in classes)
    return Trace(a, app_id, app_id.copy(), np.concatenate(ins)[order].astype(np.int64),
                 np.concatenate(outs)[order].astype(np.int64), ttft, tpot, names, names)


def synth_kw(args: Any) -> dict[str, Any]:
    """The synthesizer's settings of the one-model scenario from the scenario flags
    (add_scenario_arguments): make_trace's keyword arguments."""
    return dict(apps=args.apps, seed=args.seed, compress=args.compress, bursts_per_app=args.bursts_per_app,
                base_length=args.base_length, max_input=args.max_input, max_output=args.max_output)


def scenario_trace(scenario: str, rate_rps: float, duration_s: float, *, ttft_slo_ms: float, tpot_slo_ms: float,
                   synth: dict[str, Any]) -> Trace:
    """The trace a dispatch-replay scenario replays at `rate_rps` for `duration_s`: the one
    definition `janus bench dispatch-replay` (a real daemon) and `janus sim --scenario`
    (bench/replay_sim.py) both replay, and whose other draws (another rate and span) are
    the capacity phase's length mix. "mixed": replay_setup.MIXED's classes with their own
    SLOs (the SLO arguments unused); "one": the synthesized apps on the one model with
    the given SLO. `synth`: synth_kw's settings (the seed among them)."""
    from janusd.bench.replay_setup import MIXED, MODEL_NAME, SCENARIOS

    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {list(SCENARIOS)}")
    if scenario == "mixed":
        return make_mixed_trace(rate_rps, duration_s, MIXED, seed=int(synth["seed"]))
    return make_trace(rate_rps, duration_s, MODEL_NAME, ttft_slo_ms, tpot_slo_ms, **synth)


def add_scenario_arguments(p: Any, scenario_default: str | None = "one") -> None:
    """The flags that define a dispatch-replay scenario, its loads and its capacity
    phase: `janus bench dispatch-replay` and `janus sim --scenario` register these same
    flags (one owner of their names and defaults; the simulator's --scenario defaults to
    None: it replays --trace unless a scenario is named)."""
    from janusd.bench.replay_setup import BASELINES, DEFAULT_OBJECTIVE, POLICIES, SCENARIOS

    p.add_argument("--scenario", default=scenario_default, choices=SCENARIOS,
                   help="one: one model, one SLO class (--ttft-slo-ms, --tpot-slo-ms), the synthesized app mix; "
                        "mixed: chat (300 ms TTFT), batch (2 s) and rag (long prompts, 1 s) co-located on both "
                        "devices with overlapping bursts (replay_setup.MIXED; --apps and the synthesizer flags unused)")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated dispatch.policy values")
    p.add_argument("--objectives", default=DEFAULT_OBJECTIVE,
                   help="comma-separated dispatch.objective values for lst_imh (requests|tokens); one other than "
                        "requests is written into [dispatch], the default writes no objective key")
    p.add_argument("--baselines", default=",".join(BASELINES),
                   help="comma-separated kinds of round_robin / least_load run: peer (no deadlines: serve late, "
                        "no guard) | guarded (the daemon's deadline machinery around the baseline's choice)")
    p.add_argument("--loads", default="0.7,1.5", help="comma-separated loads as multiples of the measured capacity")
    p.add_argument("--duration-s", type=float, default=25.0, help="trace span per run in seconds")
    p.add_argument("--ttft-slo-ms", type=float, default=500.0)
    p.add_argument("--tpot-slo-ms", type=float, default=50.0)
    p.add_argument("--seed", type=int, default=0, help="trace seed (the same trace for every policy and run)")
    p.add_argument("--apps", type=int, default=8, help="synthesized apps, all mapped onto the one model")
    p.add_argument("--bursts-per-app", type=float, default=1.0,
                   help="expected bursts per app over the synthesized span")
    p.add_argument("--compress", type=float, default=4.0,
                   help="synthesize this many times the duration, then compress the time axis by it")
    p.add_argument("--base-length", type=float, default=600.0, help="synthesizer: mean tokens of the top app")
    p.add_argument("--max-input", type=int, default=1024, help="cap on input tokens")
    p.add_argument("--max-output", type=int, default=256, help="cap on output tokens")
    p.add_argument("--capacity-s", type=float, default=25.0, help="closed-loop capacity phase length")
    p.add_argument("--capacity-warmup-s", type=float, default=8.0, help="first seconds of the phase not counted")
    p.add_argument("--capacity-concurrency", type=int, default=32, help="closed-loop clients in the capacity phase")


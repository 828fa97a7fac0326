"""`janus bench placement`: the controller's policies against an exact solver, and their
decision time at the paper's size (768 devices, 62 apps).

1. Exact reference on the trace (the issue's figures). The synthetic 62-app trace
   (trace/synth.py, `--trace-hours` at its default 3 req/s, diurnal and bursty) gives
   `--snapshots` snapshots: at a random instant, each app's load over the last
   `--window-s` seconds (rates, length means and variances: oracle LoadFeatures), its
   rates times `--load-scale` (10: the synthetic 3 req/s over 62 apps is far below one
   device's capacity; at 10 the vectors are mostly decode bandwidth, median ~0.3, and
   HBM ~0.12 for an 8B model, a mix of small and near-full items; at 100 nearly every
   item fills a device and packing is trivial),
   through the Capacity prior (oracle/prior.py RooflinePrior on `--device`) of the
   model the app is given (qwen3-1.7b, qwen3-8b, llama3-8b or qwen3-32b, fixed per app
   by the seed) and policy/demand.steady_items (mean + margin x std; replicas when one
   device is too small): the capacity vectors of a random subset of the apps with
   traffic, 2..`--max-items` vectors (HiGHS proves optima of that size in well under a
   second). Each is packed fresh by policy/placement.pack and solved exactly by HiGHS
   (policy/placement_exact.min_bins, upper-bounded by the heuristic, skipped when the
   heuristic already meets the lower bound: counted in `at_lower_bound_fraction`).
   Reported: the fraction where the bin counts match, the worst gap in bins, pack's
   decision time.
   Random families (`random_*` keys, the earlier reference): `--snapshots` instances of
   2..`--max-items` vectors drawn in turn from uniform in [0.05, 0.7]^3, a 0.01 grid in
   [0.05, 0.6]^3 (exact fills are common), and complementary pairs like PAPER.md's A
   and B (HBM-heavy or compute-heavy).
2. Scale. `--devices` devices and `--apps` apps: `--items` steady instances (apps with
   replicas, vectors from the uniform family at half size) packed from nothing (cold
   start); then a slow tick on the result with 10% of instances gone and 10% grown by
   30% (forced moves, repack, consolidation within the migration budget); one new
   model arriving; and a fast tick: scaling the elastic apps over what the steady pool
   leaves, plus classifying all apps. Times are wall-clock milliseconds, median of
   `--reps` runs. `bins_per_period`: devices used after the tick and after each later
   slow period of consolidation (plans fed back as executed, up to `--periods`, until
   one takes no migration), next to `fresh_pack_bins`, a packing of the same instances
   from nothing: how far bounded migrations get from a global re-solve.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Iterable, Iterator

from janusd.policy.classify import classify
from janusd.policy.placement import pack, plan
from janusd.policy.policy_config import ClassifyConfig, PlacementConfig, ScalingConfig
from janusd.policy.scaling import scale
from janusd.policy.snapshot import AppTraffic, Assignment, ElasticApp, PlacementSnapshot, ScalingState, SteadyItem

Vec = tuple[float, float, float]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--snapshots", type=int, default=1000, help="random instances compared with the exact solver")
    p.add_argument("--max-items", type=int, default=14, help="largest instance compared with the exact solver")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--devices", type=int, default=768, help="devices at scale (PAPER.md §8: 768)")
    p.add_argument("--apps", type=int, default=62, help="apps at scale (PAPER.md §9: 62)")
    p.add_argument("--items", type=int, default=400, help="steady instances at scale")
    p.add_argument("--reps", type=int, default=3, help="runs per timed step at scale (median)")
    p.add_argument("--periods", type=int, default=20, help="slow periods of consolidation followed after the tick")
    p.add_argument("--trace-hours", type=float, default=24.0, help="length of the synthetic trace snapshots come from")
    p.add_argument("--window-s", type=float, default=60.0, help="load window of a snapshot (the telemetry window)")
    p.add_argument("--load-scale", type=float, default=10.0,
                   help="the trace's rates are multiplied by this (10: bandwidth vectors p50 ~0.3 on an h200)")
    p.add_argument("--device", default="h200", help="device preset the Capacity prior sizes vectors for")


def instance(rng: random.Random, n: int, family: int) -> list[Vec]:
    out: list[Vec] = []
    for _ in range(n):
        if family == 0:
            v = (rng.uniform(0.05, 0.7), rng.uniform(0.05, 0.7), rng.uniform(0.05, 0.7))
        elif family == 1:
            v = (round(rng.uniform(0.05, 0.6), 2), round(rng.uniform(0.05, 0.6), 2), round(rng.uniform(0.05, 0.6), 2))
        else:
            a = rng.uniform(0.4, 0.8)
            v = (a, rng.uniform(0.05, 0.4), rng.uniform(0.05, 0.4)) if rng.random() < 0.5 else \
                (rng.uniform(0.05, 0.3), a, rng.uniform(0.1, 0.5))
        out.append(v)
    return out


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _compare(snapshots: Iterable[list[Vec]]) -> dict:
    """Fresh packing vs the HiGHS optimum on each list of vectors."""
    from janusd.policy.placement_exact import lower_bound, min_bins  # scipy: only when run

    gaps: list[int] = []
    ms: list[float] = []
    at_lb = 0
    sizes: list[int] = []
    bins_seen: list[int] = []
    for vs in snapshots:
        t0 = time.perf_counter()
        bins = len(set(pack(vs)))
        ms.append((time.perf_counter() - t0) * 1e3)
        if bins == lower_bound(vs):
            exact = bins
            at_lb += 1
        else:
            exact = min_bins(vs, upper=bins)
        gaps.append(bins - exact)
        sizes.append(len(vs))
        bins_seen.append(exact)
    return {"at_lower_bound_fraction": round(at_lb / len(gaps), 4), "items_mean": round(statistics.mean(sizes), 2),
            "optimal_bins_mean": round(statistics.mean(bins_seen), 2), "optimal_bins_max": max(bins_seen),
            "snapshots": len(gaps), "optimal_match_fraction": sum(g == 0 for g in gaps) / len(gaps),
            "worst_gap_bins": max(gaps), "decision_ms_p50": round(statistics.median(ms), 3),
            "decision_ms_p99": round(_pct(ms, 0.99), 3)}


def random_reference(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    out = _compare(instance(rng, rng.randint(2, args.max_items), t % 3) for t in range(args.snapshots))
    return {f"random_{k}": v for k, v in out.items()}


TRACE_MODELS = (("qwen3-1.7b", 0.3), ("qwen3-8b", 0.3), ("llama3-8b", 0.3), ("qwen3-32b", 0.1))


def trace_snapshots(args: argparse.Namespace) -> Iterator[list[Vec]]:
    """Capacity vectors of random subsets of the synthetic trace's apps at random instants
    (module doc, 1)."""
    import numpy as np

    from janusd.hw.devices import device_spec
    from janusd.oracle.oracle import Oracle
    from janusd.oracle.prior import RooflinePrior
    from janusd.oracle.types import LoadFeatures
    from janusd.policy.demand import SteadyModel, steady_items
    from janusd.policy.policy_config import DemandConfig
    from janusd.sim.specs import presets
    from janusd.trace.synth import SynthParams, app_profiles, synthesize

    params = SynthParams(hours=args.trace_hours, seed=args.seed)
    tr = synthesize(params)
    profiles = app_profiles(params)
    rng = random.Random(args.seed + 11)
    table = presets()
    dev = device_spec(args.device)
    oracle = Oracle()
    names = [n for n, _ in TRACE_MODELS]
    weights = [w for _, w in TRACE_MODELS]
    for a, prof in enumerate(profiles):
        arch = table[rng.choices(names, weights)[0]].spec
        if arch is None:
            raise ValueError("TRACE_MODELS must name dense presets (the roofline prior needs a spec)")
        oracle.set_prior(tr.apps[a], RooflinePrior(arch, dev, prof.ttft_slo_ms / 1000, prof.tpot_slo_ms / 1000))
    cfg = DemandConfig()
    end = float(tr.arrival_s[-1])
    made = 0
    while made < args.snapshots:
        t = rng.uniform(args.window_s, end)
        lo, hi = np.searchsorted(tr.arrival_s, [t - args.window_s, t])
        ids = tr.app_id[lo:hi]
        models = []
        for a in map(int, np.unique(ids)):
            sel = ids == a
            ins = tr.input_tokens[lo:hi][sel].astype(float)
            outs = tr.output_tokens[lo:hi][sel].astype(float)
            k = args.load_scale / args.window_s
            z = LoadFeatures(request_rate=len(ins) * k, input_token_rate=float(ins.sum()) * k,
                             output_token_rate=float(outs.sum()) * k, input_len_mean=float(ins.mean()),
                             input_len_var=float(ins.var()), output_len_mean=float(outs.mean()),
                             output_len_var=float(outs.var()))
            models.append(SteadyModel(model=tr.apps[a], load=z))
        demands = [d for d in steady_items(models, oracle, cfg) if d.items]
        rng.shuffle(demands)
        want = rng.randint(2, args.max_items)
        vs: list[Vec] = []
        for d in demands:
            if len(vs) + len(d.items) <= want:
                vs += [it.vector for it in d.items]
        if len(vs) < 2:  # a quiet instant (too few apps with traffic): another one
            continue
        made += 1
        yield vs


def exact_reference(args: argparse.Namespace) -> dict:
    return _compare(trace_snapshots(args))


def _median_ms(fn: Callable[[], object], reps: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 2), out


def at_scale(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed + 7)
    cfg = PlacementConfig()
    apps = [f"app{k:02d}" for k in range(args.apps)]
    items = []
    for k in range(args.items):
        v = tuple(x / 2 for x in instance(rng, 1, 0)[0])
        app = apps[k % len(apps)]
        items.append(SteadyItem(key=f"{app}#{k}", model=app, vector=v))  # type: ignore[arg-type]
    pool = tuple(range(args.devices))
    cold_ms, cold = _median_ms(lambda: plan(PlacementSnapshot(pool=pool, items=tuple(items)), cfg,
                                            consolidate=True), args.reps)
    current = [a for a in cold.assignment]  # type: ignore[attr-defined]
    gone = set(rng.sample(range(len(items)), len(items) // 10))
    grown = set(rng.sample(range(len(items)), len(items) // 10))
    tick_items = tuple(SteadyItem(key=it.key, model=it.model, pinned_device=None,
                                  vector=tuple(x * 1.3 for x in it.vector) if k in grown else it.vector)  # type: ignore[arg-type]
                       for k, it in enumerate(items) if k not in gone)
    snap = PlacementSnapshot(pool=pool, items=tick_items, current=tuple(current))
    slow_ms, slow = _median_ms(lambda: plan(snap, cfg, consolidate=True), args.reps)
    settled = PlacementSnapshot(pool=pool, items=tick_items, current=tuple(
        Assignment(key=a.key, device=a.device, vector=a.vector) for a in slow.assignment))  # type: ignore[attr-defined]
    one = SteadyItem(key="new#0", model="new", vector=(0.2, 0.1, 0.15))
    add_ms, _ = _median_ms(lambda: plan(PlacementSnapshot(pool=pool, items=tick_items + (one,),
                                                          current=settled.current), cfg, consolidate=False), args.reps)
    # consolidation over later periods (the plan fed back, as if executed) against a fresh
    # packing of the same instances: bounded migrations instead of a global re-solve
    fresh_bins = len({d for d in pack([it.vector for it in tick_items], args.devices) if d >= 0})
    per_period = [slow.bins_used]  # type: ignore[attr-defined]
    cur = settled
    for _ in range(args.periods):
        nxt = plan(cur, cfg, consolidate=True)
        per_period.append(nxt.bins_used)
        if nxt.migrations == 0:
            break
        cur = PlacementSnapshot(pool=pool, items=tick_items, current=nxt.assignment)
    budget = args.devices - slow.bins_used  # type: ignore[attr-defined]
    elastic = [ElasticApp(app=a, demand=rng.randint(1, 40), current=rng.randint(0, 20), prefill_share=rng.random())
               for a in apps]
    traffic = [AppTraffic(app=a, rate=r, peak_rate=r * rng.uniform(1.0, 8.0))
               for a, r in zip(apps, (rng.uniform(0.0, 20.0) for _ in apps))]
    state = scale(elastic, budget, ScalingState(), ScalingConfig()).state

    def fast() -> object:
        classify(traffic, (), 0.0, ClassifyConfig())
        return scale(elastic, budget, state, ScalingConfig())

    fast_ms, scaled = _median_ms(fast, max(args.reps, 20))
    return {"devices": args.devices, "apps": args.apps, "steady_items": args.items,
            "cold_start_ms": cold_ms, "cold_start_bins": cold.bins_used,  # type: ignore[attr-defined]
            "slow_tick_ms": slow_ms, "slow_tick_moves": len(slow.moves),  # type: ignore[attr-defined]
            "slow_tick_migrations": slow.migrations, "slow_tick_bins": slow.bins_used,  # type: ignore[attr-defined]
            "fresh_pack_bins": fresh_bins, "bins_per_period": per_period,
            "new_model_ms": add_ms, "fast_tick_ms": fast_ms, "elastic_budget": budget,
            "elastic_given": scaled.given}  # type: ignore[attr-defined]


def run(args: argparse.Namespace) -> dict:
    out = at_scale(args)
    out.update(random_reference(args))
    out.update(exact_reference(args))  # the figures last, in its order
    return out

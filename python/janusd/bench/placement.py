"""`janus bench placement`: the controller's policies against an exact solver, and their
decision time at the paper's size (768 devices, 62 apps).

1. Exact reference. `--snapshots` random instances of 2..`--max-items` capacity vectors,
   in three families drawn in turn: uniform in [0.05, 0.7]^3; a 0.01 grid in
   [0.05, 0.6]^3 (exact fills are common); complementary pairs like PAPER.md's A and B
   (HBM-heavy or compute-heavy). Each is packed fresh by policy/placement.pack and
   solved exactly by HiGHS (policy/placement_exact.min_bins, upper-bounded by the
   heuristic, skipped when the heuristic already meets the lower bound). Reported: the
   fraction where the bin counts match, the worst gap in bins, pack's decision time.
   The vectors are random, not yet the 62-app trace through the Capacity GP: that needs
   [O]'s predictor (see bench/RESULTS.md).
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
from collections.abc import Callable

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


def exact_reference(args: argparse.Namespace) -> dict:
    from janusd.policy.placement_exact import lower_bound, min_bins  # scipy: only when run

    rng = random.Random(args.seed)
    gaps: list[int] = []
    ms: list[float] = []
    for t in range(args.snapshots):
        vs = instance(rng, rng.randint(2, args.max_items), t % 3)
        t0 = time.perf_counter()
        bins = len(set(pack(vs)))
        ms.append((time.perf_counter() - t0) * 1e3)
        exact = bins if bins == lower_bound(vs) else min_bins(vs, upper=bins)
        gaps.append(bins - exact)
    return {"snapshots": len(gaps), "optimal_match_fraction": sum(g == 0 for g in gaps) / len(gaps),
            "worst_gap_bins": max(gaps), "decision_ms_p50": round(statistics.median(ms), 3),
            "decision_ms_p99": round(_pct(ms, 0.99), 3)}


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
    out.update(exact_reference(args))  # the figures last, in its order
    return out

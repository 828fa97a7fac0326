"""The profile run (package doc): for each instance count a fresh daemon, its series (m,
mix) taking turns at the rates oracle/knee.py picks, each load point measured `repeats`
times, the budget bounding it all; then the points file and the summary."""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from janusd.oracle.dataset import ENGINE_COLUMNS
from janusd.oracle.knee import HIGH, MIN_RATIO, series_next_rate
from janusd.profiling.args import ProfileArgs
from janusd.profiling.daemon import MODEL_NAME, daemon_config, split_cores, warm
from janusd.profiling.load import KNEE_STRETCH, in_knee, make_trace, point_seconds, settle_seconds
from janusd.profiling.measure import arun, measure
from janusd.profiling.rows import Rows, header


@dataclass
class Series:
    m: int
    mix: str
    measured: list[tuple[float, float]] = field(default_factory=list)
    done: bool = False


@dataclass
class Subject:
    """What every point is measured against: the model's spec (FLOPs and bytes per token),
    the device's (peaks, host time per step) and the longest context a trace may ask for."""

    spec: Any
    dev: Any
    max_len: int


def open_subject(a: ProfileArgs) -> Subject:
    from janusd.engine import step_probe
    from janusd.engine.loader import open_checkpoint
    from janusd.engine.model_cost import served_spec
    from janusd.hw.devices import DEFAULT_FOR_KIND, device_spec

    ck = open_checkpoint(a.spec, Path(a.cache_dir).expanduser() if a.cache_dir else None)
    spec = served_spec(ck, a.dtype, a.device)
    dev = device_spec(a.device_spec or DEFAULT_FOR_KIND[a.device],
                      hbm_bytes=a.memory_mib * 2**20 if a.device == "cpu" else None,
                      cache_dir=Path(a.cache_dir) if a.cache_dir else None,
                      overhead_probe=step_probe.bind(a.cache_dir))
    return Subject(spec, dev, min(2048, int(ck.arch.max_position_embeddings)))


@dataclass
class Profile:
    """One run's progress: the rows so far and what the knee search has learned."""

    a: ProfileArgs
    subject: Subject
    bar: Any  # tqdm progress bar
    t_start: float
    rng: np.random.Generator
    rows: Rows = field(default_factory=Rows)
    knees: dict[str, float] = field(default_factory=dict)  # mix -> highest rate one instance served at HIGH
    lag_caps: dict[str, float] = field(default_factory=dict)  # mix -> below the lowest rate the replayer lagged at
    pinning: dict[str, Any] = field(default_factory=dict)  # m -> the cores used, or why not pinned
    next_point: int = 0
    dropped: int = 0
    longest_point: float = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.t_start

    def instances(self, m: int, work: Path, own_cores: set[int]) -> bool:
        """Profile m instances on a fresh daemon; False when the budget left cannot cover a point."""
        from janusd.bench import daemon_proc

        a = self.a
        share_end = self.t_start + a.budget_s * m / a.max_instances  # later m inherit what earlier ones left
        if a.budget_s - self.elapsed() < 2 * max(self.longest_point, a.point_s):
            return False
        run_dir = work / f"m{m}"
        run_dir.mkdir(parents=True, exist_ok=True)
        split = split_cores(sorted(own_cores), m, a.torch_threads) if a.pin_cores and a.device == "cpu" else None
        self.pinning[str(m)] = {"workers": split[0], "host": split[1]} if split else "not pinned"
        # the daemon (started from this thread, its workers then pinning themselves) and the
        # replayer (this thread) run on the host's cores; the run's end gives back own_cores
        os.sched_setaffinity(0, split[1] if split else own_cores)
        proc, port = daemon_proc.start(daemon_config(a, run_dir, m, split[0] if split else None), run_dir,
                                       a.torch_threads, {MODEL_NAME: m})
        try:
            warm(port)
            self.series(m, port, run_dir, share_end)
        finally:
            daemon_proc.stop(proc)
        return True

    def series(self, m: int, port: int, run_dir: Path, share_end: float) -> None:
        """The mixes' series of m instances take turns until each is done or m's share of the
        budget cannot cover the longest point so far."""
        a = self.a
        series = [Series(m, mix) for mix in a.mixes]
        k = 0
        while not all(s.done for s in series):
            left = min(share_end, self.t_start + a.budget_s) - time.monotonic()
            if left < max(self.longest_point, a.point_s):
                break
            s = series[k % len(series)]
            k += 1
            if s.done:
                continue
            rate = series_next_rate(s.measured, m, self.knees.get(s.mix, 0.0), self.lag_caps.get(s.mix, math.inf),
                                    a.start_rate, a.max_rate)
            if rate is None:
                s.done = True
                continue
            self.point(s, port, run_dir, rate)

    def point(self, s: Series, port: int, run_dir: Path, rate: float) -> None:
        """One load point, measured `repeats` times; the knee search follows their mean."""
        a = self.a
        t0 = time.monotonic()
        base = point_seconds(rate, a.point_s)
        window = min(3.0 * a.point_s, base * KNEE_STRETCH) if in_knee(s.measured, rate) else base
        atts = []
        for _ in range(a.repeats):  # one load point: the same setting, fresh samples
            att = self.repeat(s, port, run_dir, rate, window)
            if att is None:
                break  # a repeat would lag as well
            atts.append(att)
        self.longest_point = max(self.longest_point, time.monotonic() - t0)
        if not atts:  # the client cannot offer this rate: the series stays below it
            self.lag_caps[s.mix] = min(self.lag_caps.get(s.mix, math.inf), rate / MIN_RATIO)
            return
        self.next_point += 1
        att = float(np.mean(atts))  # the knee search follows the setting's mean
        s.measured.append((rate, att))
        if s.m == 1 and att >= HIGH:
            self.knees[s.mix] = max(self.knees.get(s.mix, 0.0), rate)

    def repeat(self, s: Series, port: int, run_dir: Path, rate: float, window: float) -> float | None:
        """One replay of the point: its row added, its attainment returned; None when the
        replayer fell behind (the replay measured the client) and nothing was kept."""
        from janusd.oracle.features import features_from_results, in_window, token_attainment, usage_in_window

        a, subj = self.a, self.subject
        settle = settle_seconds(window)
        w0, w1 = settle, settle + window  # the measured window on the trace's time axis
        trace = make_trace(rate, (settle, window, settle), s.mix, self.rng, a.ttft_slo_ms, a.tpot_slo_ms,
                           subj.max_len)
        rows, summary, peak = arun(measure(port, trace, run_dir / f"p{len(self.rows) + self.dropped}", a,
                                           w1 + settle))
        mine = in_window(rows, w0, w1)
        if not summary.get("valid", False) or not mine:
            self.dropped += 1
            self.bar.set_postfix_str(f"m={s.m} {s.mix} {rate:.3g}/s dropped (client lag)")
            return None
        att = token_attainment(mine)
        # usage over the window and the cool-down: arrivals go on at the rate through both,
        # so both are steady, and more tokens make a steadier figure
        compute, bw = usage_in_window(rows, w0, w1 + settle, s.m, subj.spec, subj.dev)
        self.rows.add(features_from_results(mine, window, MODEL_NAME, t0=w0).vector(), s.m,
                      [hbm_share(peak, s.m, subj.dev), compute, bw], att, self.next_point,
                      [round(summary["engine"][k], 6) for k in ENGINE_COLUMNS])
        self.bar.set_postfix_str(f"m={s.m} {s.mix} {rate:.3g}/s att={att:.2f} pts={len(self.rows)}")
        self.bar.n = min(int(self.elapsed()), int(a.budget_s))
        self.bar.refresh()
        return att


def hbm_share(peak: dict[str, dict[str, float]], m: int, dev: Any) -> float:
    """The mean over the m devices of their peak weight + KV pages over the device's memory."""
    from janusd.oracle.features import hbm_fraction

    devs = [peak.get(str(d), {}) for d in range(m)]
    return float(np.mean([hbm_fraction(int(p.get("weight_pages", 0)), int(p.get("kv_pages", 0)),
                                       int(p.get("page_size", 2 * 2**20)), dev) for p in devs]))


def run(a: ProfileArgs) -> dict[str, Any]:
    """Profile; write a.out; return the summary (also the CLI's last line)."""
    from tqdm import tqdm

    t_start = time.monotonic()
    load_start = os.getloadavg()[0]  # a shared machine's other work shows in every figure: recorded
    subject = open_subject(a)
    work = Path(a.keep_dir) if a.keep_dir else Path(tempfile.mkdtemp(prefix="janus-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=int(a.budget_s), unit="s", disable=a.quiet, file=sys.stderr,
               bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} s {postfix}")
    prof = Profile(a, subject, bar, t_start, np.random.default_rng(a.seed))
    own_cores = os.sched_getaffinity(0)
    try:
        for m in range(1, a.max_instances + 1):
            if not prof.instances(m, work, own_cores):
                break
    finally:
        os.sched_setaffinity(0, own_cores)
        bar.close()
        if not a.keep_dir:  # the per-point results are only for a kept run
            shutil.rmtree(work, ignore_errors=True)
    return finish(prof, load_start)


def finish(prof: Profile, load_start: float) -> dict[str, Any]:
    """Write the points (with their noise floor in the header's notes); the run's summary."""
    from janusd.oracle.dataset import write_points
    from janusd.oracle.noise import noise_floor

    a, rows = prof.a, prof.rows
    pts = rows.points(header(a, prof.subject.spec, prof.subject.dev, prof.dropped, prof.pinning, load_start))
    pts.header["notes"]["noise"] = noise_floor(pts)
    write_points(a.out, pts)
    return {"out": str(a.out), "points": len(rows), "load_points": prof.next_point, "dropped_points": prof.dropped,
            "elapsed_s": round(prof.elapsed(), 1), "noise": pts.header["notes"]["noise"],
            "instances": sorted(set(rows.instances)),
            "attainment_min": float(min(rows.attainment)) if rows.attainment else None,
            "attainment_max": float(max(rows.attainment)) if rows.attainment else None}

"""`janus profile`: measure a model on the real engine, through real worker processes.

For each instance count m = 1..k a real daemon (bench/daemon_proc.py) serves the model on
m devices; each load point is an open-loop replay (trace/replay.py: the same client
`janus replay` uses) at one rate and one length mix, stratified (make_trace: the rate's
request count and the mix's length quantiles in the measured window) so that repeats
offer the same load. The load
runs through a warm-up, the measured window and a cool-down (settle_seconds); only the
window counts, so the figures are the steady state's, not an empty engine's start or a
drain's tail (on the loaded afternoon of bench/RESULTS.md "oracle" a whole-run SmolLM2
point read 0.8 attainment and a third of its compute at three times its capacity: the
queue had not built up yet, and the drain stretched the wall). The window is measured by:
- load features: the requests that arrived in it, seen through telemetry's windows
  (features.py);
- per-token SLO attainment of those requests (trace/slo.py rules, failures and 503s are
  misses);
- compute and bandwidth: the work the engine did in it and in the cool-down (arrivals go
  on at the rate through both), FLOPs and bytes counted from the model config per token
  that landed there, against the device spec's peaks (features.py, hw/);
- HBM: weight pages plus the peak KV pages seen by polling the daemon's /metrics (the
  workers' xTensor pools) during the replay, over the device's memory.
Rates follow knee.py (bracket, then crowd the knee), series (m, mix) taking turns so a
short budget still covers every series; a point inside a series' knee bracket measures a
KNEE_STRETCH times longer window (in_knee: the budget goes where attainment changes); a series of m instances starts at m/2 times the
highest rate one instance served at knee.HIGH attainment with that mix. The budget bounds the whole run: a point starts
only when the time left covers the longest point so far. Each load point (rate, mix, m)
is measured `repeats` times back to back, each a fresh sample of the trace; the rows
share the point's point_id (a held-out split keeps them together) and the knee search
follows their mean. Their spread is the measurement's noise floor (noise.py), stored in
the header's notes and shown by `janus oracle eval`. Each row also keeps the
engine's own counters over its whole replay (steps, decode tokens, forward seconds, summed
over the instances, and the replay's wall time: dataset.py's engine array), from which
step_rate.fit_step_time reads the engine's step time under load. Back-to-back repeats share the
machine's state of the moment, so on a machine whose load drifts over minutes the floor
understates the noise. A replay whose replayer fell behind schedule (lag bound) is
dropped: it measured the client; its repeats are skipped and every series of that mix
stays below that rate from then on (knee.series_next_rate: a retried rate lagged again,
and one llama-small profile lost 9 replays and a third of its budget to it).
With --pin-cores (cpu) each worker runs on cores of its own and the daemon and the
replayer on the rest (split_cores; devices.cpu_cores), where the host has cores to spare:
near the engine's limit a worker sharing its core with the load generator falls into
small or large batches by chance (bench/RESULTS.md "Twice the budget ..."). The profiled
daemon's own oracle is off (no online refits: a helper process fitting GPs would take CPU
from the worker being measured). The points are written in dataset.py's format; the run's
last line is one JSON object.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from janusd.oracle.dataset import ENGINE_COLUMNS
from janusd.oracle.knee import HIGH, MIN_RATIO, series_next_rate

MIXES: dict[str, tuple[float, float]] = {"tiny": (32.0, 16.0), "short": (96.0, 32.0), "long": (384.0, 96.0)}  # mean in, out
LENGTH_SIGMA = 0.5  # lognormal spread of lengths within a mix
MODEL_NAME = "profiled"
MIN_REQUESTS = 16  # requests in a point's measured window, at least (point_seconds)
SETTLE_FRACTION = 0.25  # warm-up and cool-down, each, as a fraction of the measured window ...
SETTLE_MIN_S = 2.0  # ... and at least this long
KNEE_STRETCH = 2.0  # a point inside a series' knee bracket measures this many times longer


@dataclass
class ProfileArgs:
    spec: str
    device: str = "cpu"  # engine device kind
    device_spec: str | None = None  # hw preset; None = the kind's default
    out: Path = Path("profile.npz")
    budget_s: float = 180.0
    max_instances: int = 2
    point_s: float = 8.0
    ttft_slo_ms: float = 1000.0
    tpot_slo_ms: float = 200.0
    mixes: tuple[str, ...] = ("short", "long")
    start_rate: float = 1.0
    max_rate: float = 256.0
    memory_mib: int = 1024
    kv_cache_mib: int = 256
    dtype: str = "float32"
    torch_threads: int = 1
    cache_dir: str | None = None
    seed: int = 0
    repeats: int = 2  # measurements of each load point (noise.py: their spread is the noise floor)
    pin_cores: bool = False  # cpu: workers on cores of their own, the daemon and the replayer on the rest (split_cores)
    quiet: bool = False
    keep_dir: Path | None = None


@dataclass
class Series:
    m: int
    mix: str
    measured: list[tuple[float, float]] = field(default_factory=list)
    done: bool = False


def point_seconds(rate: float, point_s: float) -> float:
    """A point's measured window: point_s, longer at low rates so it holds about
    MIN_REQUESTS requests (at most 3 x point_s): attainment over a few requests is noise."""
    return min(max(point_s, MIN_REQUESTS / rate), 3.0 * point_s)


def settle_seconds(window_s: float) -> float:
    """Warm-up before and cool-down after a measured window (each): the load runs through
    both, so the window's requests meet a system already at its steady state and keep
    meeting it until they end, instead of an empty engine first and a draining one last."""
    return max(SETTLE_MIN_S, SETTLE_FRACTION * window_s)


def in_knee(measured: list[tuple[float, float]], rate: float) -> bool:
    """Whether `rate` lies between the highest measured rate served at knee.HIGH and the
    lowest one that was not: where attainment changes, which a point measures longer
    (KNEE_STRETCH)."""
    ok = [r for r, a in measured if a >= HIGH]
    bad = [r for r, a in measured if a < HIGH]
    return bool(ok and bad) and max(ok) < rate < min(bad)


def _segment(rate: float, t0: float, seconds: float, mean_in: float, mean_out: float, rng: np.random.Generator
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrivals, input lengths, output lengths) of one stratified stretch of a trace."""
    from scipy.stats import norm

    n = max(1, int(round(rate * seconds)))
    quantiles = norm.ppf((np.arange(n) + 0.5) / n)

    def lengths(mean: float) -> np.ndarray:
        mu = math.log(mean) - LENGTH_SIGMA**2 / 2
        return np.exp(mu + LENGTH_SIGMA * rng.permutation(quantiles))

    return t0 + np.sort(rng.uniform(0.0, seconds, n)), lengths(mean_in), lengths(mean_out)


def make_trace(rate: float, segments: Sequence[float], mix: str, rng: np.random.Generator, ttft_ms: float,
               tpot_ms: float, max_len: int) -> Any:
    """An open-loop trace at `rate` over back-to-back stretches of the given seconds (a
    profile point: warm-up, measured window, cool-down), lognormal lengths around the mix's
    means.

    Each stretch is stratified, so that repeats of a load point offer the same load where
    it is measured: round(rate * seconds) arrivals placed as a Poisson process given their
    count (sorted uniforms; a Poisson count would spread a 16-request window's rate by
    +-25%), and lengths at the lognormal's quantiles (i + 1/2) / n in a random order (the
    window's mean and spread are the mix's, only their order varies). What is left between
    repeats is the arrival pattern and the machine."""
    from janusd.trace.formats import Trace

    mean_in, mean_out = MIXES[mix]
    parts, t0 = [], 0.0
    for seconds in segments:
        if not seconds > 0:
            raise ValueError(f"segments must be > 0 seconds, got {list(segments)}")
        parts.append(_segment(rate, t0, seconds, mean_in, mean_out, rng))
        t0 += seconds
    arrivals, ins, outs = (np.concatenate(c) for c in zip(*parts, strict=True))
    ins = np.clip(np.round(ins), 1, max_len // 2).astype(np.int64)
    outs = np.clip(np.round(outs), 1, max_len // 4).astype(np.int64)
    n = len(arrivals)
    return Trace.build(arrivals, ["profile"] * n, [MODEL_NAME] * n, ins, outs,
                       np.full(n, ttft_ms), np.full(n, tpot_ms))


def split_cores(cores: Sequence[int], m: int, threads: int) -> tuple[list[list[int]], list[int]] | None:
    """(each of m workers' cores, the host's cores) for a pinned cpu profile: workers take
    `threads` cores each from the top, the daemon and the replayer keep the rest; None when
    that leaves the host no core (then nothing is pinned and the header says the engine
    shared its cores: on a 2-core VM the bandwidth of the same setting spread 14% that way
    against 6% pinned, bench/RESULTS.md "The served range first")."""
    cs = sorted(set(cores))
    per = max(1, threads)
    host = len(cs) - m * per
    if host < 1:
        return None
    return [cs[host + i * per:host + (i + 1) * per] for i in range(m)], cs[:host]


def daemon_config(a: ProfileArgs, run_dir: Path, m: int, cpu_cores: list[list[int]] | None = None) -> str:
    cache = f'cache_dir = "{a.cache_dir}"\n' if a.cache_dir else ""
    pinned = f"cpu_cores = {cpu_cores}\n" if cpu_cores else ""
    return (
        f'[server]\nport = 0\nadmin_socket = "{run_dir / "admin.sock"}"\n{cache}queue_limit = 100000\n'
        # the daemon's own oracle stays idle: no online refits in a helper process competing
        # with the worker for the cores being measured
        f'[oracle]\nonline = false\nstate_dir = "{run_dir / "state"}"\n'
        f'[devices]\nkind = "{a.device}"\ncount = {m}\nmemory_mib = {a.memory_mib}\n{pinned}'
        f'[[models]]\nname = "{MODEL_NAME}"\ncheckpoint = "{a.spec}"\ndevices = {list(range(m))}\n'
        f"ttft_slo_ms = {float(a.ttft_slo_ms)}\ntpot_slo_ms = {float(a.tpot_slo_ms)}\n"
        f'kv_cache_mib = {a.kv_cache_mib}\ndtype = "{a.dtype}"\n'
    )


def pool_pages(text: str) -> dict[str, dict[str, float]]:
    """device -> {weight_pages, kv_pages, num_pages, page_size} from one /metrics scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "janusd_pool_pages":
            for s in fam.samples:
                out.setdefault(s.labels["device"], {})[s.labels["kind"]] = s.value
        elif fam.name == "janusd_pool_stat":
            for s in fam.samples:
                if s.labels.get("stat") == "page_size":
                    out.setdefault(s.labels["device"], {})["page_size"] = s.value
    return out


ENGINE_COUNTERS = ENGINE_COLUMNS[:3]  # the rest of a row (wall_s) is the replay's own clock


def engine_counters(text: str) -> dict[str, float]:
    """The profiled model's engine counters (janusd_engine_*: steps, decode tokens, forward
    seconds), summed over its instances, from one /metrics scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    out = dict.fromkeys(ENGINE_COUNTERS, 0.0)
    for fam in text_string_to_metric_families(text):
        key = fam.name.removeprefix("janusd_engine_").removesuffix("_total")  # exposition spells it either way
        if key in out and fam.name.startswith("janusd_engine_"):
            out[key] += sum(s.value for s in fam.samples
                            if s.labels.get("model") == MODEL_NAME and not s.name.endswith("_created"))
    return out


async def _engine_counters(port: int) -> dict[str, float]:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        return engine_counters(await resp.text())


async def _poll_pools(port: int, peak: dict[str, dict[str, float]], period_s: float = 0.25) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    for dev, kinds in pool_pages(await resp.text()).items():
                        mine = peak.setdefault(dev, {})
                        for k, v in kinds.items():
                            mine[k] = max(mine.get(k, 0.0), v)
            except (aiohttp.ClientError, OSError, ValueError):
                pass
            await asyncio.sleep(period_s)


async def _measure(port: int, trace: Any, out_dir: Path, a: ProfileArgs, span_s: float
                   ) -> tuple[list[Any], dict[str, Any], dict]:
    import msgspec

    from janusd.trace.replay import ReplayConfig, replay
    from janusd.trace.results import RequestResult

    peak: dict[str, dict[str, float]] = {}
    before = await _engine_counters(port)
    t0 = time.monotonic()
    poller = asyncio.create_task(_poll_pools(port, peak))
    try:
        cfg = ReplayConfig(url=f"http://127.0.0.1:{port}", ttft_slo_ms=a.ttft_slo_ms, tpot_slo_ms=a.tpot_slo_ms,
                           timeout_s=span_s + 60.0, devices_poll_s=0.0)
        summary = await replay(trace, cfg, out_dir)
    finally:
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
    after = await _engine_counters(port)
    summary["engine"] = {k: after[k] - before[k] for k in ENGINE_COUNTERS} | {"wall_s": time.monotonic() - t0}
    dec = msgspec.json.Decoder(RequestResult)
    rows = [dec.decode(line) for line in (out_dir / "results.jsonl").read_bytes().splitlines() if line.strip()]
    return rows, summary, peak


def _warm(port: int) -> None:
    import urllib.request

    from janusd.trace.replay import PromptMaker

    body = {"model": MODEL_NAME, "prompt": PromptMaker()(64), "max_tokens": 4, "min_tokens": 4, "ignore_eos": True,
            "temperature": 0.0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    for _ in range(3):
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()


def _arun(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run(a: ProfileArgs) -> dict[str, Any]:
    """Profile; write a.out; return the summary (also the CLI's last line)."""
    import msgspec
    from tqdm import tqdm

    from janusd.bench import daemon_proc
    from janusd.engine import step_probe
    from janusd.engine.loader import open_checkpoint
    from janusd.hw.cpu_peaks import machine_identity
    from janusd.hw.devices import DEFAULT_FOR_KIND, device_spec
    from janusd.hw.model_spec import ModelSpec
    from janusd.oracle.dataset import Points, write_points
    from janusd.oracle.features import (features_from_results, hbm_fraction, in_window, token_attainment,
                                        usage_in_window)
    from janusd.oracle.noise import noise_floor

    t_start = time.monotonic()
    load_start = os.getloadavg()[0]  # a shared machine's other work shows in every figure: recorded
    ck = open_checkpoint(a.spec, Path(a.cache_dir).expanduser() if a.cache_dir else None)
    spec = ModelSpec.from_config(msgspec.to_builtins(ck.arch), dtype=a.dtype)
    max_len = min(2048, int(ck.arch.max_position_embeddings))
    dev_name = a.device_spec or DEFAULT_FOR_KIND[a.device]
    dev = device_spec(dev_name, hbm_bytes=a.memory_mib * 2**20 if a.device == "cpu" else None,
                      cache_dir=Path(a.cache_dir) if a.cache_dir else None,
                      overhead_probe=step_probe.bind(a.cache_dir))
    rng = np.random.default_rng(a.seed)
    rows_f: list[list[float]] = []
    rows_m: list[int] = []
    rows_r: list[list[float]] = []
    rows_a: list[float] = []
    rows_p: list[int] = []  # load point of each row: repeats share one
    rows_e: list[list[float]] = []  # the engine's own counters over each row's whole replay (Points.engine)
    next_point = 0
    dropped = 0
    longest_point = 0.0
    work = Path(a.keep_dir) if a.keep_dir else Path(tempfile.mkdtemp(prefix="janus-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=int(a.budget_s), unit="s", disable=a.quiet, file=sys.stderr,
               bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} s {postfix}")

    def elapsed() -> float:
        return time.monotonic() - t_start

    own_cores = os.sched_getaffinity(0)
    pinning: dict[str, Any] = {}  # m -> the cores used, or why not pinned
    try:
        knees: dict[str, float] = {}  # mix -> the highest rate one instance served at HIGH attainment
        lag_caps: dict[str, float] = {}  # mix -> below the lowest total rate the replayer could not offer
        for m in range(1, a.max_instances + 1):
            share_end = t_start + a.budget_s * m / a.max_instances  # later m inherit what earlier ones left
            if a.budget_s - elapsed() < 2 * max(longest_point, a.point_s):
                break
            run_dir = work / f"m{m}"
            run_dir.mkdir(parents=True, exist_ok=True)
            split = split_cores(sorted(own_cores), m, a.torch_threads) if a.pin_cores and a.device == "cpu" else None
            pinning[str(m)] = {"workers": split[0], "host": split[1]} if split else "not pinned"
            # the daemon (started from this thread, its workers then pinning themselves) and the
            # replayer (this thread) run on the host's cores; the run's end gives back own_cores
            os.sched_setaffinity(0, split[1] if split else own_cores)
            proc, port = daemon_proc.start(daemon_config(a, run_dir, m, split[0] if split else None), run_dir,
                                           a.torch_threads, {MODEL_NAME: m})
            try:
                _warm(port)
                series = [Series(m, mix) for mix in a.mixes]
                k = 0
                while not all(s.done for s in series):
                    left = min(share_end, t_start + a.budget_s) - time.monotonic()
                    if left < max(longest_point, a.point_s):
                        break
                    s = series[k % len(series)]
                    k += 1
                    if s.done:
                        continue
                    rate = series_next_rate(s.measured, m, knees.get(s.mix, 0.0), lag_caps.get(s.mix, math.inf),
                                            a.start_rate, a.max_rate)
                    if rate is None:
                        s.done = True
                        continue
                    t0 = time.monotonic()
                    base = point_seconds(rate, a.point_s)
                    window = min(3.0 * a.point_s, base * KNEE_STRETCH) if in_knee(s.measured, rate) else base
                    settle = settle_seconds(window)
                    w0, w1 = settle, settle + window  # the measured window on the trace's time axis
                    atts = []
                    for _ in range(a.repeats):  # one load point: the same setting, fresh samples
                        trace = make_trace(rate, (settle, window, settle), s.mix, rng, a.ttft_slo_ms, a.tpot_slo_ms,
                                           max_len)
                        pdir = run_dir / f"p{len(rows_f) + dropped}"
                        rows, summary, peak = _arun(_measure(port, trace, pdir, a, w1 + settle))
                        mine = in_window(rows, w0, w1)
                        if not summary.get("valid", False) or not mine:
                            dropped += 1
                            bar.set_postfix_str(f"m={m} {s.mix} {rate:.3g}/s dropped (client lag)")
                            break  # a repeat would lag as well
                        att = token_attainment(mine)
                        atts.append(att)
                        # usage over the window and the cool-down: arrivals go on at the rate through both,
                        # so both are steady, and more tokens make a steadier figure
                        compute, bw = usage_in_window(rows, w0, w1 + settle, m, spec, dev)
                        devs = [peak.get(str(d), {}) for d in range(m)]
                        hbm = float(np.mean([hbm_fraction(int(p.get("weight_pages", 0)), int(p.get("kv_pages", 0)),
                                                          int(p.get("page_size", 2 * 2**20)), dev) for p in devs]))
                        rows_f.append(features_from_results(mine, window, MODEL_NAME, t0=w0).vector())
                        rows_m.append(m)
                        rows_r.append([hbm, compute, bw])
                        rows_a.append(att)
                        rows_p.append(next_point)
                        rows_e.append([round(summary["engine"][k], 6) for k in ENGINE_COLUMNS])
                        bar.set_postfix_str(f"m={m} {s.mix} {rate:.3g}/s att={att:.2f} pts={len(rows_f)}")
                        bar.n = min(int(elapsed()), int(a.budget_s))
                        bar.refresh()
                    longest_point = max(longest_point, time.monotonic() - t0)
                    if not atts:  # the client cannot offer this rate: the series stays below it
                        lag_caps[s.mix] = min(lag_caps.get(s.mix, math.inf), rate / MIN_RATIO)
                        continue
                    next_point += 1
                    att = float(np.mean(atts))  # the knee search follows the setting's mean
                    s.measured.append((rate, att))
                    if m == 1 and att >= HIGH:
                        knees[s.mix] = max(knees.get(s.mix, 0.0), rate)
            finally:
                daemon_proc.stop(proc)
    finally:
        os.sched_setaffinity(0, own_cores)
        bar.close()
        if not a.keep_dir:  # the per-point results are only for a kept run
            shutil.rmtree(work, ignore_errors=True)
    n = len(rows_f)
    header = {
        "model": a.spec, "model_spec": spec.identity(), "device": msgspec.to_builtins(dev),
        "machine": machine_identity(), "slo": {"ttft_ms": a.ttft_slo_ms, "tpot_ms": a.tpot_slo_ms},
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "source": "profile",
        "notes": {"engine_device": a.device, "mixes": {k: MIXES[k] for k in a.mixes}, "point_s": a.point_s,
                  "budget_s": a.budget_s, "max_instances": a.max_instances, "dropped_points": dropped,
                  "length_sigma": LENGTH_SIGMA, "dtype": a.dtype, "memory_mib": a.memory_mib,
                  "min_requests": MIN_REQUESTS, "repeats": a.repeats, "settle_fraction": SETTLE_FRACTION,
                  "settle_min_s": SETTLE_MIN_S, "knee_stretch": KNEE_STRETCH, "trace": "stratified", "pinning": pinning,
                  "load_avg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)]},
    }
    pts = Points(header, np.array(rows_f, dtype=np.float64).reshape(n, 7), np.array(rows_m, dtype=np.int64),
                 np.array(rows_r, dtype=np.float64).reshape(n, 3), np.clip(np.array(rows_a, dtype=np.float64), 0, 1),
                 np.array(rows_p, dtype=np.int64), np.array(rows_e, dtype=np.float64).reshape(n, len(ENGINE_COLUMNS)))
    pts.header["notes"]["noise"] = noise_floor(pts)
    write_points(a.out, pts)
    return {"out": str(a.out), "points": n, "load_points": next_point, "dropped_points": dropped,
            "elapsed_s": round(elapsed(), 1), "noise": pts.header["notes"]["noise"],
            "instances": sorted(set(rows_m)), "attainment_min": float(min(rows_a)) if rows_a else None,
            "attainment_max": float(max(rows_a)) if rows_a else None}

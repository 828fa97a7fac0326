"""What `janus bench cluster` replays ([W]): six apps on six demo models over the cpu
devices, and the two daemon configurations it compares. Pure (numpy with a seed, text),
so the trace and the configs are tested without running anything.

The apps (one model each, the trace's model names are the daemon's):
- burst-a, burst-b (demo small models, 200 -> 64 tokens): a Poisson base of BASE_RPS and
  two bursts each of BURST_S seconds at BURST_RPS, the two apps' bursts apart. One
  instance serves ~650-820 output tok/s on this machine's core; a burst asks ~900.
- quiet-a, quiet-b (demo tiny, 100 -> 32): clusters of 8 s at 1.5 req/s with 40-90 s
  gaps, so keep-alive (warm_after_s 25) sends them Warm between clusters.
- steady-a, steady-b (demo tiny, 100 -> 32): Poisson at 0.5 req/s.
Every request carries TTFT 1 s and TPOT 100 ms.

static: the operator's even split, unmanaged: device 0 holds the -a apps, device 1 the
-b apps, every instance Active all run. janus: managed; every model starts on device 0,
each bursty model has a Warm instance on device 1 that its elastic count wakes (and a
scale-in rests again), the other four are steady with keep-alive on (demote_pinned).
"""

from __future__ import annotations

import math

import numpy as np

from janusd.trace.formats import Trace

BASE_RPS = 1.0
BURST_RPS = 14.0
BURST_S = 15.0
TTFT_MS, TPOT_MS = 1000.0, 100.0
# app -> (checkpoint, device in the static split, kind)
APPS: dict[str, tuple[str, int, str]] = {
    "burst-a": ("demo:llama-small", 0, "bursty"),
    "burst-b": ("demo:qwen2-small", 1, "bursty"),
    "quiet-a": ("demo:llama-tiny", 0, "quiet"),
    "quiet-b": ("demo:qwen2-tiny", 1, "quiet"),
    "steady-a": ("demo:llama-tiny", 0, "steady"),
    "steady-b": ("demo:qwen2-tiny", 1, "steady"),
}
LENGTHS = {"bursty": (200, 64), "quiet": (100, 32), "steady": (100, 32)}
HOLD_S = 10.0  # the janus arm's control.scaling.scale_in_hold_s


def burst_starts(seconds: float) -> dict[str, list[float]]:
    """Each bursty app's burst start times: a at 15% and 60% of the run, b at 35% and 80%."""
    return {"burst-a": [round(0.15 * seconds, 1), round(0.60 * seconds, 1)],
            "burst-b": [round(0.35 * seconds, 1), round(0.80 * seconds, 1)]}


def _poisson(rng: np.random.Generator, rate: float, start: float, end: float) -> np.ndarray:
    n = rng.poisson(rate * max(0.0, end - start))
    return np.sort(rng.uniform(start, end, n))


def _arrivals(rng: np.random.Generator, app: str, kind: str, seconds: float) -> np.ndarray:
    if kind == "bursty":
        parts = [_poisson(rng, BASE_RPS, 0.0, seconds)]
        parts += [_poisson(rng, BURST_RPS - BASE_RPS, t, min(seconds, t + BURST_S))
                  for t in burst_starts(seconds)[app]]
        return np.sort(np.concatenate(parts))
    if kind == "quiet":
        out, t = [], float(rng.uniform(2.0, 10.0))
        while t < seconds:
            out.append(_poisson(rng, 1.5, t, min(seconds, t + 8.0)))
            t += 8.0 + float(rng.uniform(40.0, 90.0))
        return np.sort(np.concatenate(out)) if out else np.zeros(0)
    return _poisson(rng, 0.5, 0.0, seconds)


def make_trace(seconds: float, seed: int) -> Trace:
    """The six apps' requests over `seconds` (module doc), deterministic for `seed`."""
    if not (math.isfinite(seconds) and seconds >= 60.0):
        raise ValueError(f"the cluster trace needs at least 60 s, got {seconds}")
    rng = np.random.default_rng(seed)
    t, apps, ins, outs = [], [], [], []
    for app, (_, _, kind) in APPS.items():
        a = _arrivals(rng, app, kind, seconds)
        i, o = LENGTHS[kind]
        t.append(a)
        apps += [app] * len(a)
        ins.append(np.full(len(a), i, dtype=np.int64))
        outs.append(np.full(len(a), o, dtype=np.int64))
    arrival = np.concatenate(t)
    order = np.argsort(arrival, kind="stable")
    app_arr = np.array(apps)[order]
    n = len(arrival)
    return Trace.build(arrival[order], app_arr, app_arr, np.concatenate(ins)[order], np.concatenate(outs)[order],
                       np.full(n, TTFT_MS), np.full(n, TPOT_MS))


def _header(devices: int, managed: bool, run_dir: str) -> str:
    text = (f'[server]\nport = 0\nadmin_socket = "{run_dir}/admin.sock"\nmodel_wait_timeout_s = 30.0\n\n'
            f"[devices]\ncount = {devices}\nmemory_mib = 512\n\n"
            f'[oracle]\nonline = false\nstate_dir = "{run_dir}/state"\n\n'
            f"[control]\nmanaged = {'true' if managed else 'false'}\n")
    if managed:
        text += ("\n[control.scaling]\n"
                 f"scale_in_hold_s = {HOLD_S}\n\n"
                 "[control.keepalive]\nwarm_after_s = 25.0\ncold_after_s = 90.0\ndemote_pinned = true\n")
    return text


def config(arm: str, run_dir: str, devices: int = 2) -> str:
    """The daemon's TOML for an arm ("janus" or "static"; module doc)."""
    if arm not in ("janus", "static"):
        raise ValueError(f"unknown arm {arm!r} (janus, static)")
    if devices != 2:
        raise ValueError("the cluster bench's split is written for 2 devices")
    text = _header(devices, arm == "janus", run_dir)
    for app, (ckpt, dev, kind) in APPS.items():
        text += f'\n[[models]]\nname = "{app}"\ncheckpoint = "{ckpt}"\nttft_slo_ms = {TTFT_MS}\ntpot_slo_ms = {TPOT_MS}\n'
        if arm == "static":
            text += f"devices = [{dev}]\n"
        elif kind == "bursty":
            text += 'devices = [0, 1]\nwarm_devices = [1]\npool = "elastic"\n'
        else:
            text += 'devices = [0]\npool = "steady"\n'
    return text


def expected_active(arm: str) -> dict[str, int]:
    """Active instances per model once the daemon has loaded (what the bench waits for)."""
    return {app: 1 for app in APPS}

"""The real side of `janus sim`'s cpu side by side (bench/RESULTS.md "sim, second pass"):
`janus bench engine`, then two real replays (a calibration load and a validation load)
against `janus serve`. Writes tests/data/sim_calib_*. Run from the repository root on a
quiet machine: `PYTHONPATH=python python bench/sim_calib_record.py` (as run on
2026-12-03, except that the engine bench then lacked --json and was rerun alone)."""
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np

from janusd.bench import daemon_proc
from janusd.bench import dispatch_replay as dr
from janusd.bench.closed_loop import warmup
from janusd.engine.loader import default_cache_dir
from janusd.sim.compare import figures
from janusd.trace.formats import Trace, write_trace
from janusd.trace.replay import ReplayConfig, replay
from janusd.trace.results import RequestResult

DUR = 45.0
DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
t0 = time.time()


def one_app(trace):
    # one app: the daemon serves one model "llm" for all of them, and the simulator makes a
    # served model per (app, model) pair
    return Trace(trace.arrival_s, np.zeros(len(trace), dtype=trace.app_id.dtype), trace.model_id, trace.input_tokens,
                 trace.output_tokens, trace.ttft_slo_ms, trace.tpot_slo_ms, ("chat",), trace.models)


traces = {}
for tag, rate in (("lo", 3.0), ("hi", 5.5)):
    tr = one_app(dr.make_trace(rate, DUR, "llm", 500.0, 50.0, apps=8, seed=0, compress=4.0, bursts_per_app=1.0,
                               base_length=600.0, max_input=1024, max_output=256))
    write_trace(tr, DATA / f"sim_calib_trace_{tag}.csv")
    traces[tag] = tr
    print(tag, len(tr), "requests", tr.input_tokens.mean(), tr.output_tokens.mean(), file=sys.stderr)
if os.environ.get("DRY"):
    sys.exit(0)
eng = subprocess.run([sys.executable, "-m", "janusd.cli", "bench", "engine", "--skip-smollm2", "--json"],
                     capture_output=True, text=True)
(DATA / "sim_calib_engine.json").write_text(eng.stdout.strip().splitlines()[-1] + "\n")
print("engine bench done", time.time() - t0, file=sys.stderr)
cache = str(default_cache_dir())
out = {}
for tag, tr in traces.items():
    run_dir = Path(tempfile.mkdtemp(prefix=f"sim-calib-{tag}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = dr.daemon_config(run_dir=run_dir, cache=cache, checkpoint="demo:llama-small", policy="lst_imh", plan=None,
                           ttft_slo_ms=500.0, tpot_slo_ms=50.0, memory_mib=1024, kv_cache_mib=256)
    proc, port = daemon_proc.start(cfg, run_dir, 1, {"llm": 2})
    try:
        asyncio.run(warmup(port, dr.MODEL_NAME, [(400, 2)] * 4, dr.RELAXED_SLO_MS))
        rcfg = ReplayConfig(url=f"http://127.0.0.1:{port}", max_lag_ms=100.0, timeout_s=300.0, ttft_slo_ms=500.0,
                            tpot_slo_ms=50.0, devices_poll_s=0.0)
        summ = asyncio.run(replay(tr, rcfg, run_dir))
    finally:
        daemon_proc.stop(proc)
    dec = msgspec.json.Decoder(RequestResult)
    rows = [dec.decode(x) for x in (run_dir / "results.jsonl").read_bytes().splitlines() if x.strip()]
    real = figures(rows, tr.duration_s)
    real["valid"] = summ.get("valid")
    real["lag_max_ms"] = summ.get("lag_max_ms")
    (DATA / f"sim_calib_real_{tag}.json").write_text(json.dumps(real, indent=1) + "\n")
    out[tag] = real
    print(tag, "done", time.time() - t0, json.dumps(real), file=sys.stderr)
print(json.dumps({"real": out, "wall_s": time.time() - t0}))

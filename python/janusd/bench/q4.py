"""`janus bench q4`: batch-1 decode tok/s, worker memory after load and load time of
SmolLM2-135M-Instruct's Q4_1 GGUF per config dtype ("auto": the Q4 linears stay packed,
engine/models/qlinear.py; float32 / bfloat16: dequantized). Each run is a fresh process
(memory after load is its own), the dtypes alternate round by round, and the figures are
medians over rounds: this machine is shared, so only ratios within one run are evidence.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

PROMPT = "Tell me a long story about the sea."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=3, help="runs per dtype, alternating (default 3)")
    p.add_argument("--tokens", type=int, default=64, help="decode steps timed per run (default 64)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: 2 swing 10x here)")
    p.add_argument("--dtypes", default="auto,float32,bfloat16", help="config dtypes compared")
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="a GGUF Q4 checkpoint")


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024


def one(model: str, dtype: str, tokens: int, threads: int) -> dict[str, Any]:
    """One load and one greedy decode in this process."""
    import torch

    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.types import SamplingParams

    torch.set_num_threads(threads)
    base = _rss_mib()
    de = DeviceEngine(memory_bytes=1024 << 20)
    t = time.perf_counter()
    me = de.load_model(ModelConfig(name="m", checkpoint=model, dtype=dtype, kv_cache_mib=16, max_model_len=512),
                       EngineConfig())
    load_s = time.perf_counter() - t
    rss = _rss_mib()
    tok = me.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True))
    me.add_request("r", prompt, SamplingParams(max_tokens=tokens + 1, temperature=0.0, ignore_eos=True))
    me.step(time.monotonic())  # prefill and the first token
    t0, n = time.perf_counter(), 0
    while me.has_work():
        n += sum(len(o.token_ids) for o in me.step(time.monotonic()))
    dt = time.perf_counter() - t0
    return {"dtype": dtype, "decode_tok_s": n / dt, "tokens": n, "rss_after_load_mib": rss,
            "rss_before_load_mib": base, "load_s": load_s, "weight_bytes": int(me.weight_bytes),
            "bytes_per_token": int(me.model.weight_bytes_per_token)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {}
    code = "import json, sys; from janusd.bench.q4 import one; print(json.dumps(one(*sys.argv[1:3], " \
           "int(sys.argv[3]), int(sys.argv[4]))))"
    for r in range(args.rounds):
        for dt in args.dtypes.split(","):
            out = subprocess.run([sys.executable, "-c", code, args.model, dt, str(args.tokens), str(args.threads)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"janus bench q4: the {dt} run failed:\n{out.stderr[-2000:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            runs.setdefault(dt, []).append(row)
            print(f"round {r} {dt}: {row['decode_tok_s']:.1f} tok/s, rss {row['rss_after_load_mib']:.0f} MiB",
                  file=sys.stderr, flush=True)
    return {dt: {"decode_tok_s": [round(x["decode_tok_s"], 1) for x in rows],
                 "median_decode_tok_s": round(statistics.median(x["decode_tok_s"] for x in rows), 1),
                 "median_rss_after_load_mib": round(statistics.median(x["rss_after_load_mib"] for x in rows)),
                 "rss_before_load_mib": round(rows[0]["rss_before_load_mib"]),
                 "median_load_s": round(statistics.median(x["load_s"] for x in rows), 2),
                 "weight_bytes": rows[0]["weight_bytes"], "bytes_per_token": rows[0]["bytes_per_token"]}
            for dt, rows in runs.items()}

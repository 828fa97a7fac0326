"""Batch-1 decode tok/s and worker RSS after load of SmolLM2-135M-Instruct Q4_1 per config
dtype ("auto" = Q4 linears packed, engine/models/qlinear.py; float32 / bfloat16 =
dequantized): each run a fresh process, variants alternating, medians over rounds.

    python bench/q4_decode.py [--rounds 3] [--tokens 64] [--threads 2] [--dtypes auto,float32,bfloat16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024


def one(dtype: str, tokens: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.types import SamplingParams

    spec = "builtin:smollm2-135m-instruct"
    base = rss_mib()
    de = DeviceEngine(memory_bytes=1024 << 20)
    t = time.perf_counter()
    me = de.load_model(ModelConfig(name="m", checkpoint=spec, dtype=dtype, kv_cache_mib=16, max_model_len=512),
                       EngineConfig())
    load_s = time.perf_counter() - t
    rss = rss_mib()
    tok = me.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Tell me a long story about the sea."}],
                                                add_generation_prompt=True))
    me.add_request("r", prompt, SamplingParams(max_tokens=tokens + 1, temperature=0.0, ignore_eos=True))
    me.step(time.monotonic())  # prefill and the first token
    t0, n = time.perf_counter(), 0
    while me.has_work():
        n += sum(len(o.token_ids) for o in me.step(time.monotonic()))
    dt = time.perf_counter() - t0
    return {"dtype": dtype, "decode_tok_s": n / dt, "tokens": n, "rss_after_load_mib": rss,
            "rss_before_load_mib": base, "load_s": load_s, "weight_bytes": int(me.weight_bytes),
            "bytes_per_token": int(me.model.weight_bytes_per_token)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtypes", default="auto,float32,bfloat16")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.tokens, a.threads)))
        return
    runs: dict[str, list[dict]] = {}
    for r in range(a.rounds):
        for dt in a.dtypes.split(","):
            out = subprocess.run([sys.executable, __file__, "--one", dt, "--tokens", str(a.tokens),
                                  "--threads", str(a.threads)], capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            runs.setdefault(dt, []).append(row)
            print(f"round {r} {dt}: {row['decode_tok_s']:.1f} tok/s, rss {row['rss_after_load_mib']:.0f} MiB", flush=True)
    summary = {dt: {"decode_tok_s": [round(x["decode_tok_s"], 1) for x in rows],
                    "median_decode_tok_s": round(statistics.median(x["decode_tok_s"] for x in rows), 1),
                    "median_rss_after_load_mib": round(statistics.median(x["rss_after_load_mib"] for x in rows)),
                    "rss_before_load_mib": round(rows[0]["rss_before_load_mib"]),
                    "median_load_s": round(statistics.median(x["load_s"] for x in rows), 2),
                    "weight_bytes": rows[0]["weight_bytes"], "bytes_per_token": rows[0]["bytes_per_token"]}
               for dt, rows in runs.items()}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

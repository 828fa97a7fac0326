"""`janus bench pd`: what a P/D handoff costs a request, measured through a real daemon.

One daemon, two CPU workers, the same checkpoint served twice: "pd" prefills on device 0
and decodes on device 1 (its KV read over Mooncake by base + offset), "ref" is one mixed
instance on device 1. The same greedy requests (prompts of several lengths, given as
random words; the daemon's usage gives their token counts) go to both, one at a time, streaming. The handoff
shows up between the first and the second token: the P/D request's extra gap there over
the mixed one is the handoff's cost (KVReady, routing, ImportKV, the transfer, the first
decode step on a fresh worker). The bytes moved and the decode worker's transfer time
come from the daemon's /metrics, so the bandwidth is Mooncake's own (loopback TCP here).
Both paths run interleaved in the same process on the same machine: the ratios and
differences are meaningful on a noisy box; absolute numbers are for orientation only.
"""

from __future__ import annotations

import argparse
import http.client
import random
import tempfile
from pathlib import Path
from typing import Any

from janusd.bench import daemon_proc


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default="builtin:smollm2-135m-instruct", help="model checkpoint spec")
    p.add_argument("--lengths", default="64,512,1536", help="comma-separated prompt lengths in words")
    p.add_argument("--repeats", type=int, default=3, help="requests per length and path")
    p.add_argument("--max-tokens", type=int, default=8, help="output tokens per request")
    p.add_argument("--memory-mib", type=int, default=2048, help="page pool per device")
    p.add_argument("--cache-dir", default=None, help="checkpoint cache dir (default: the config default)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads per worker")


def _config(args: argparse.Namespace, cache: str, run_dir: Path) -> str:
    model = f'checkpoint = "{args.checkpoint}"\nkv_cache_mib = 256\nttft_slo_ms = 600000.0\ntpot_slo_ms = 600000.0\n'
    return (
        f'[server]\nport = 0\nadmin_socket = "{run_dir / "admin.sock"}"\ncache_dir = "{cache}"\n'
        f"[devices]\ncount = 2\nmemory_mib = {args.memory_mib}\n"
        f'[[models]]\nname = "pd"\n{model}devices = [0, 1]\nprefill_devices = [0]\n'
        f'[[models]]\nname = "ref"\n{model}devices = [1]\n'
    )


def _metric(port: int, name: str) -> float:
    """The sample `name` of model "pd" on the daemon's /metrics (0 when not there yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == name and s.labels.get("model") == "pd")


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if s else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from janusd.config import ServerConfig, cache_dir

    cache = args.cache_dir or str(cache_dir(ServerConfig()))
    lengths = [int(x) for x in args.lengths.split(",")]
    rng = random.Random(0)
    run_dir = Path(tempfile.mkdtemp(prefix="janus-bench-pd-"))
    proc, port = daemon_proc.start(_config(args, cache, run_dir), run_dir, args.torch_threads, {"pd": 2, "ref": 1})
    rows = []
    identical = True
    try:
        words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "light", "north", "amber"]
        for model in ("pd", "ref"):  # warm-up: first requests pay lazy set-up on every path
            daemon_proc.stream_completion(port, model, "hello there", 2)
        for n in lengths:
            gap: dict[str, list[float]] = {"pd": [], "ref": []}
            ttft: dict[str, list[float]] = {"pd": [], "ref": []}
            later: dict[str, list[float]] = {"pd": [], "ref": []}
            b0, s0 = _metric(port, "janusd_kv_transfer_bytes_total"), _metric(port, "janusd_kv_transfer_seconds_sum")
            tokens = 0
            for _ in range(args.repeats):
                prompt = " ".join(rng.choice(words) for _ in range(n))
                texts = {}
                for model in ("pd", "ref"):
                    t, texts[model], tokens = daemon_proc.stream_completion(port, model, prompt, args.max_tokens)
                    ttft[model].append(t[0])
                    gap[model].append(t[1] - t[0])
                    later[model].append((t[-1] - t[1]) / max(1, len(t) - 2))
                identical &= texts["pd"] == texts["ref"]
            nbytes = _metric(port, "janusd_kv_transfer_bytes_total") - b0
            secs = _metric(port, "janusd_kv_transfer_seconds_sum") - s0
            ms = lambda x: round(x * 1e3, 2)  # noqa: E731
            rows.append({
                "prompt_words": n,
                "prompt_tokens": tokens,
                "kv_mib_per_request": round(nbytes / args.repeats / 2**20, 3),
                "transfer_ms": ms(secs / args.repeats),
                "transfer_gbps": round(nbytes / secs / 1e9, 3) if secs > 0 else None,
                "ttft_ms": {"pd": ms(_median(ttft["pd"])), "ref": ms(_median(ttft["ref"]))},
                "token1_to_2_ms": {"pd": ms(_median(gap["pd"])), "ref": ms(_median(gap["ref"]))},
                "handoff_extra_ms": ms(_median(gap["pd"]) - _median(gap["ref"])),
                "later_tpot_ms": {"pd": ms(_median(later["pd"])), "ref": ms(_median(later["ref"]))},
            })  # fmt: skip
    finally:
        daemon_proc.stop(proc)
    return {"bench": "pd", "model": args.checkpoint, "repeats": args.repeats, "greedy_outputs_identical": identical,
            "by_prompt_length": rows}

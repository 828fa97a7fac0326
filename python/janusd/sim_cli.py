"""`janus sim --trace FILE --devices N --policy P`: replay a trace on a simulated supernode.

The daemon's request path (core/ServingCore, the Rust Dispatcher) on a virtual clock,
with simulated workers from a roofline performance model (janusd.sim). Without --json a
human line per figure goes to stderr; the last stdout line is always the summary JSON.
--out DIR writes results.jsonl (with every token time), devices.csv and summary.json for
`janus report`. Exit status 0, or 2 for bad input (the message says what is wrong).
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from janusd.sim.policies import POLICIES
    from janusd.hw.devices import DEVICE_NAMES

    parser.add_argument("--trace", required=True, help="canonical trace (csv or jsonl, optionally .gz)")
    parser.add_argument("--devices", type=int, required=True, help="devices in the pool")
    parser.add_argument("--policy", required=True, choices=sorted(POLICIES), help="the system to simulate")
    parser.add_argument("--models", default=None,
                        help="TOML: trace model name -> preset or config.json, tp, SLOs (default: the presets)")
    parser.add_argument("--device", default="ascend-910c-die", choices=[d for d in DEVICE_NAMES if d != "cpu"],
                        help="device kind (default: ascend-910c-die, the paper's)")
    parser.add_argument("--out", default=None, help="run directory: results.jsonl, devices.csv, summary.json")
    parser.add_argument("--json", action="store_true", help="print only the summary JSON")


def run(args: argparse.Namespace) -> int:
    from janusd.sim.placement import PlacementError
    from janusd.sim.run import simulate, write_run
    from janusd.sim.specs import SpecError, load_models_file, resolve
    from janusd.trace.formats import TraceError, read_trace
    from janusd.trace.results import jsonable

    def fail(msg: str) -> int:
        print(f"janus sim: error: {msg}", file=sys.stderr)
        return 2

    if args.devices < 1:
        return fail(f"--devices must be >= 1, got {args.devices}")
    try:
        trace = read_trace(args.trace)
        table = load_models_file(args.models) if args.models else None
        archs = resolve(trace.models, table)
    except (TraceError, SpecError, OSError) as e:
        return fail(str(e))
    if len(trace.arrival_s) == 0:
        return fail(f"{args.trace}: the trace has no requests")
    try:
        cluster, summ = simulate(trace, archs, args.devices, args.policy, args.device,
                                 keep_times=args.out is not None)
    except (PlacementError, ValueError) as e:
        return fail(str(e))
    if args.out:
        try:
            write_run(cluster, args.out, summ)
        except OSError as e:
            return fail(f"--out {args.out}: {e.strerror or e}")
    if not args.json:
        for k in ("token_attainment", "ttft_attainment", "tpot_attainment", "goodput_rps", "device_hours",
                  "worst_app_attainment", "wall_s", "sim_requests_per_wall_s"):
            v = summ[k]
            print(f"{k:>26}: {v:.4g}" if isinstance(v, float) else f"{k:>26}: {v}", file=sys.stderr)
    print(json.dumps(jsonable(summ)))
    return 0

"""`janus oracle eval --data FILE [--runs-of FILE] [--plot PNG] [--json]`: held-out error of the oracle's
GPs and of the roofline prior on profiled points (oracle/evaluate.py). The last line is
one JSON object whose first keys are the issue's headline figures."""

from __future__ import annotations

import argparse
import json
import math
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="oracle_command", metavar="ACTION", required=True)
    ev = sub.add_parser("eval", help="held-out error of the GPs and the prior on a points file")
    ev.add_argument("--data", required=True, help="points file from `janus profile` (or the daemon's store)")
    ev.add_argument("--plot", default=None, help="write a parity plot (PNG) here")
    ev.add_argument("--folds", type=int, default=5, help="folds of whole load points")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--prior-overheads", default=None, metavar="STEP,LAYER,SEQ,PREFILL_TOKEN",
                    help="the prior's host seconds per step, per layer per step, per sequence per step and per prompt "
                         "token per layer of a prefill (0 when left out), "
                         "instead of the file's device spec (e.g. a file written before they were measured)")
    ev.add_argument("--runs-of", default=None, metavar="FILE",
                    help="another profile of the same model: adds the floor between the two runs (noise.across_runs)")
    ev.add_argument("--json", action="store_true", help="accepted for uniformity: the JSON object is always last")


def run(args: argparse.Namespace) -> int:
    from janusd.hw.devices import OVERHEAD_FIELDS
    from janusd.oracle.dataset import DatasetError, read_points
    from janusd.oracle.evaluate import HEADLINE, evaluate, parity_plot

    if args.folds < 2:
        print("janus oracle eval: --folds must be >= 2", file=sys.stderr)
        return 2
    overheads = None
    if args.prior_overheads is not None:
        try:
            vals = [float(v) for v in args.prior_overheads.split(",")]
            if len(vals) not in (3, 4) or not all(math.isfinite(v) and v >= 0 for v in vals):
                raise ValueError
        except ValueError:
            print(f"janus oracle eval: --prior-overheads: need 3 or {len(OVERHEAD_FIELDS)} finite seconds >= 0 "
                  f"separated by commas, got {args.prior_overheads!r}", file=sys.stderr)
            return 2
        overheads = dict(zip(OVERHEAD_FIELDS, vals + [0.0] * (len(OVERHEAD_FIELDS) - len(vals)), strict=True))
    try:
        points = read_points(args.data)
        figures, arrays = evaluate(points, args.folds, args.seed, overheads)
    except (DatasetError, KeyError, TypeError, ValueError) as e:
        print(f"janus oracle eval: {args.data}: {e}", file=sys.stderr)
        return 1
    if args.runs_of is not None:
        from janusd.oracle.noise import across_runs

        try:
            figures |= across_runs(points, read_points(args.runs_of))
        except (DatasetError, KeyError, TypeError, ValueError) as e:
            print(f"janus oracle eval: --runs-of {args.runs_of}: {e}", file=sys.stderr)
            return 1
    if args.plot:
        try:
            parity_plot(arrays, args.plot, f"{points.header.get('model')}: held-out predictions ({len(points)} points)")
        except OSError as e:
            print(f"janus oracle eval: --plot {args.plot}: {e}", file=sys.stderr)
            return 1
    out = {k: figures.get(k) for k in HEADLINE} | {k: v for k, v in figures.items() if k not in HEADLINE}
    out["model"] = points.header.get("model")
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}))
    return 0

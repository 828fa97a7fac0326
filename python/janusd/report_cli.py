"""`janus report DIR [DIR...] --out DIR`: PNG figures and a markdown table from run directories.

Prints one JSON object last: the figure paths, the table path and each run's headline
figures (from janusd.trace.slo).
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="DIR", help="run directories (results.jsonl [+ devices.csv])")
    parser.add_argument("--out", required=True, help="directory for the PNGs and summary.md")
    parser.add_argument("--window-s", type=float, default=None, help="time window of the series (default: ~60 points)")
    parser.add_argument("--json", action="store_true",
                        help="accepted for uniformity: the JSON object is always the last line")


def run(args: argparse.Namespace) -> int:
    from janusd.trace.formats import TraceError
    from janusd.trace.report import make_report
    from janusd.trace.results import jsonable

    if args.window_s is not None and not args.window_s > 0:
        print("janus report: error: --window-s must be > 0", file=sys.stderr)
        return 2
    try:
        result = make_report(args.runs, args.out, args.window_s)
    except (TraceError, ValueError, OSError) as e:
        print(f"janus report: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(jsonable(result)))
    return 0

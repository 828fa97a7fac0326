"""`janus trace convert|synth|sample|compress|remap|clip|stats`: make and inspect canonical traces.

Every subcommand writes the canonical format (formats.py) and prints one JSON object as
its last line (the output path and the trace's headline statistics), so scripts can chain.
Top-level imports stay light: numpy and friends load inside `run`.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trace_command", metavar="ACTION", required=True)

    p = sub.add_parser("convert", help="convert a public trace (azure, servegen) to the canonical format")
    p.add_argument("--format", required=True, choices=["azure", "servegen", "canonical"], help="input format")
    p.add_argument("inputs", nargs="+", metavar="IN", help="azure: one or more files (merged); servegen: one rates_*.csv[.gz]")
    p.add_argument("--out", required=True, help="output trace (.csv or .jsonl, optionally .gz)")
    p.add_argument("--model", default=None, help="model column for every request (default: from the file name)")
    p.add_argument("--lengths", default=None, help="servegen: the lengths_*.csv[.gz] file (default: next to the rates file)")
    p.add_argument("--start", default="0", help="servegen: slice start (e.g. 0, 6h)")
    p.add_argument("--duration", default="1h", help="servegen: slice length (e.g. 3600, 30m, 1h)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="servegen: multiply every client's rate")
    p.add_argument("--seed", type=int, default=0, help="servegen: random seed for arrivals and lengths")

    p = sub.add_parser("synth", help="generate a production-like skewed, diurnal, bursty trace")
    p.add_argument("--apps", type=int, default=62)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, default=3.0, help="mean requests/s over the trace (default 3: ~260 k per day)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply the rate")
    p.add_argument("--bursts-per-app-hour", type=float, default=0.5)
    p.add_argument("--no-slo", action="store_true", help="leave out the per-app ttft/tpot SLO columns")
    p.add_argument("--out", required=True)

    p = sub.add_parser("sample", help="keep a uniformly random fraction of the requests (order kept)")
    p.add_argument("input", metavar="IN")
    p.add_argument("--fraction", type=float, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)

    p = sub.add_parser("compress", help="compress the time axis (24 h -> 30 min keeps order and relative gaps)")
    p.add_argument("input", metavar="IN")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--to-duration", help="target span, e.g. 30m, 1800, 2h")
    g.add_argument("--factor", type=float, help="divide every gap by this")
    p.add_argument("--out", required=True)

    p = sub.add_parser("remap", help="point apps at the given models, round-robin by popularity")
    p.add_argument("input", metavar="IN")
    p.add_argument("--models", required=True, help="comma-separated model names")
    p.add_argument("--out", required=True)

    p = sub.add_parser("clip", help="cap input/output token counts (e.g. to a small model's context)")
    p.add_argument("input", metavar="IN")
    p.add_argument("--max-input", type=int, default=None)
    p.add_argument("--max-output", type=int, default=None)
    p.add_argument("--out", required=True)

    p = sub.add_parser("stats", help="requests, apps, span, skew and burstiness of a trace")
    p.add_argument("input", metavar="IN")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    for name, action in sub.choices.items():  # every action prints its JSON object last anyway
        if name != "stats":
            action.add_argument("--json", action="store_true",
                                help="accepted for uniformity: the JSON object is always the last line")


def run(args: argparse.Namespace) -> int:
    from janusd.trace.formats import TraceError

    try:
        return _run(args)
    except (TraceError, ValueError, OSError) as e:
        print(f"janus trace {args.trace_command}: error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from janusd.trace import transform
    from janusd.trace.formats import read_trace, write_trace
    from janusd.trace.stats import app_table, trace_stats

    cmd = args.trace_command
    if cmd == "stats":
        trace = read_trace(args.input)
        stats = trace_stats(trace)
        if not args.json:
            for row in app_table(trace)[:20]:
                print(f"{row['app']:>24} {row['requests']:>9} {row['share']:7.2%} in {row['mean_input']:8.1f} out {row['mean_output']:7.1f}")
        print(json.dumps(stats))
        return 0
    if cmd == "convert":
        trace = _convert(args)
    elif cmd == "synth":
        from janusd.trace.synth import SynthParams, synthesize

        trace = synthesize(
            SynthParams(
                apps=args.apps, hours=args.hours, seed=args.seed, rate=args.rate, rate_scale=args.rate_scale,
                bursts_per_app_hour=args.bursts_per_app_hour, with_slo=not args.no_slo,
            )
        )  # fmt: skip
    elif cmd == "sample":
        trace = transform.sample(read_trace(args.input), args.fraction, args.seed)
    elif cmd == "compress":
        src = read_trace(args.input)
        if args.to_duration is not None:
            trace = transform.compress(src, to_duration_s=transform.parse_duration(args.to_duration))
        else:
            trace = transform.compress(src, factor=args.factor)
    elif cmd == "remap":
        trace = transform.remap_models(read_trace(args.input), [m.strip() for m in args.models.split(",")])
    elif cmd == "clip":
        trace = transform.clip_lengths(read_trace(args.input), args.max_input, args.max_output)
    else:  # argparse prevents this
        raise ValueError(f"unknown action {cmd}")
    write_trace(trace, args.out)
    print(json.dumps({"out": args.out, **trace_stats(trace)}))
    return 0


def _convert(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from janusd.trace.formats import read_trace
    from janusd.trace.transform import parse_duration

    if args.format == "azure":
        from janusd.trace.azure import load_azure

        return load_azure(args.inputs, model=args.model)
    if args.format == "servegen":
        from janusd.trace.servegen import load_servegen

        if len(args.inputs) != 1:
            raise ValueError("servegen: give one rates_<category>_<model>.csv[.gz] file")
        start = 0.0 if args.start in ("0", "0s") else parse_duration(args.start)
        return load_servegen(
            args.inputs[0], args.lengths, start_s=start, duration_s=parse_duration(args.duration),
            rate_scale=args.rate_scale, seed=args.seed, model=args.model,
        )  # fmt: skip
    if len(args.inputs) != 1:
        raise ValueError("canonical: give one file")
    return read_trace(args.inputs[0])

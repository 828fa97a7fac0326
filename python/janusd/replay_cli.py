"""`janus replay --url URL --trace FILE --out DIR`: open-loop replay, results and a summary.

While replaying it samples the server's GET /metrics every --devices-poll-s (default 1 s)
into DIR/devices.csv, the active-devices series `janus report` draws (trace/devices_poll.py).

Prints the summary JSON as the last line. Exit status 0 for a valid run, 3 when the
replayer fell behind schedule by more than --max-lag-ms (the run's figures are then
not to be trusted), 2 for bad input.

One Python process streams some tens of thousands of SSE chunks per second; the
paper's replay (~335 req/s of a few hundred tokens each) needs more. --processes N
starts N replayer processes on one shared schedule (each takes every N-th request and
1/N of the connections), then merges their results into DIR and summarises them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

KEY_ENV = "JANUS_REPLAY_API_KEY"  # how the parent hands the key to its children (not argv)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--trace", required=True, help="canonical trace (csv or jsonl)")
    parser.add_argument("--out", required=True, help="run directory for results.jsonl and summary.json")
    parser.add_argument("--max-connections", type=int, default=512, help="bounded connection pool size (all processes)")
    parser.add_argument("--max-lag-ms", type=float, default=100.0, help="largest acceptable lag behind schedule")
    parser.add_argument("--api-key", default=None, help=f"sent as 'Authorization: Bearer KEY' (or set {KEY_ENV})")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per-request limit; later counts as timeout")
    parser.add_argument("--ttft-slo-ms", type=float, default=1000.0, help="TTFT target for rows without one")
    parser.add_argument("--tpot-slo-ms", type=float, default=200.0, help="TPOT target for rows without one")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--processes", type=int, default=1, help="replayer processes sharing the schedule")
    parser.add_argument("--devices-poll-s", type=float, default=1.0,
                        help="sample the server's GET /metrics this often into devices.csv (0: off)")
    parser.add_argument("--json", action="store_true",
                        help="accepted for uniformity: the JSON object is always the last line")
    parser.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # k/n, set by the parent
    parser.add_argument("--start-at", type=float, default=None, help=argparse.SUPPRESS)  # time.time() of t=0


def _parse_shard(text: str | None) -> tuple[int, int]:
    if text is None:
        return (0, 1)
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must be k/n, got {text!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise ValueError(f"--shard must be k/n with 0 <= k < n, got {text!r}")
    return k, n


def run(args: argparse.Namespace) -> int:
    from janusd.trace.formats import TraceError

    try:
        if args.processes < 1:
            raise ValueError("--processes must be >= 1")
        if args.limit is not None and args.limit < 1:
            raise ValueError("--limit must be >= 1")
        summary = _run_many(args) if args.processes > 1 else _run_one(args)
    except (TraceError, ValueError, OSError) as e:
        print(f"janus replay: error: {e}", file=sys.stderr)
        return 2
    if not summary["valid"]:
        print(
            f"janus replay: INVALID run: the replayer fell {summary['lag_max_ms']:.1f} ms behind schedule "
            f"(bound {args.max_lag_ms} ms); raise --max-connections or --processes, or use a faster client",
            file=sys.stderr,
        )
    print(json.dumps(summary))
    return 0 if summary["valid"] else 3


def _config(args: argparse.Namespace, connections: int):  # type: ignore[no-untyped-def]
    from janusd.trace.replay import ReplayConfig

    cfg = ReplayConfig(
        url=args.url, max_connections=connections, max_lag_ms=args.max_lag_ms,
        api_key=args.api_key or os.environ.get(KEY_ENV) or None, timeout_s=args.timeout_s,
        ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms, devices_poll_s=args.devices_poll_s,
    )  # fmt: skip
    cfg.check()
    return cfg


def _load(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from janusd.trace.formats import read_trace

    trace = read_trace(args.trace)
    return trace.take(slice(0, args.limit)) if args.limit is not None else trace  # type: ignore[arg-type]


def _run_one(args: argparse.Namespace) -> dict:
    import asyncio

    from janusd.trace.replay import replay

    trace = _load(args)
    cfg = _config(args, args.max_connections)
    coro = replay(trace, cfg, args.out, shard=_parse_shard(args.shard), start_at=args.start_at)
    try:
        import uvloop  # a faster event loop keeps the replayer's own lag down
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _run_many(args: argparse.Namespace) -> dict:
    import subprocess
    import time
    from pathlib import Path

    import msgspec

    from janusd.trace.replay import summarize_run
    from janusd.trace.results import RequestResult

    trace = _load(args)  # validate once here, and size the start delay
    _config(args, args.max_connections)
    n = args.processes
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start_at = time.time() + 3.0 + 5e-6 * len(trace)  # children start and load the trace first
    env = dict(os.environ)
    if args.api_key:
        env[KEY_ENV] = args.api_key
    procs = []
    for k in range(n):
        cmd = [
            sys.executable, "-m", "janusd.cli", "replay", "--url", args.url, "--trace", args.trace,
            "--out", str(out / "shards" / str(k)), "--max-connections", str(max(1, -(-args.max_connections // n))),
            "--max-lag-ms", str(args.max_lag_ms), "--timeout-s", str(args.timeout_s), "--ttft-slo-ms",
            str(args.ttft_slo_ms), "--tpot-slo-ms", str(args.tpot_slo_ms), "--shard", f"{k}/{n}",
            "--start-at", repr(start_at), "--devices-poll-s", str(args.devices_poll_s),
        ]  # fmt: skip
        if args.limit is not None:
            cmd += ["--limit", str(args.limit)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    if any(c not in (0, 3) for c in codes):
        raise OSError(f"replayer processes exited with {codes}; see their messages above")
    decoder = msgspec.json.Decoder(RequestResult)
    rows = []
    with open(out / "results.jsonl", "wb") as sink:
        for k in range(n):
            for line in (out / "shards" / str(k) / "results.jsonl").read_bytes().splitlines():
                if line.strip():
                    rows.append(decoder.decode(line))
                    sink.write(line + b"\n")
    summary = summarize_run(rows, args.max_lag_ms, trace.duration_s, time.time() - start_at)
    summary["processes"] = n
    devices = out / "shards" / "0" / "devices.csv"  # only shard 0 polls /metrics
    (out / "devices.csv").unlink(missing_ok=True)
    if args.devices_poll_s > 0 and devices.is_file():
        (out / "devices.csv").write_bytes(devices.read_bytes())
        shard0 = json.loads((out / "shards" / "0" / "summary.json").read_text())
        summary.update({k: shard0[k] for k in ("device_polls", "device_poll_failures") if k in shard0})
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary

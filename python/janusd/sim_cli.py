"""`janus sim --trace FILE --devices N --policy P`: replay a trace on a simulated supernode.

The daemon's request path (core/ServingCore, the Rust Dispatcher) on a virtual clock,
with simulated workers from a roofline performance model (janusd.sim). Without --json a
human line per figure goes to stderr; the last stdout line is always the summary JSON.
--out DIR writes results.jsonl (with every token time), devices.csv and summary.json for
`janus report`. Exit status 0, or 2 for bad input (the message says what is wrong).

The cpu device (a virtual device of the daemon's, `--device-memory-mib` of memory, the
peaks measured on this machine) is for the side by side with a real `janus replay`:
`--calibrate BENCH_JSON` fits the performance model to `janus bench engine`'s step times
of the model (sim/calibrate.py), `--calibrate-tpot-ms` then scales its host figures to a
real replay's median TPOT on the same trace, `--perf FILE` sets its figures and the
engine's limits directly (the fitted ones are in the summary's "perf").

`--scenario one|mixed` runs `janus bench dispatch-replay`'s scenario instead (same trace
generator, seed, models, SLO classes and daemon configs; loads relative to the simulated
capacity) and, with `--bench-json`, prints a real run's figures beside (bench/replay_sim.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from janusd.sim.policies import POLICIES
    from janusd.hw.devices import DEVICE_NAMES

    parser.add_argument("--trace", default=None, help="canonical trace (csv or jsonl, optionally .gz); required "
                        "unless --scenario")
    parser.add_argument("--devices", type=int, default=None, help="devices in the pool (required unless --scenario)")
    parser.add_argument("--policy", default=None, choices=sorted(POLICIES),
                        help="the system to simulate (required unless --scenario)")
    parser.add_argument("--models", default=None,
                        help="TOML: trace model name -> preset or config.json, tp, SLOs (default: the presets)")
    parser.add_argument("--device", default="ascend-910c-die", choices=list(DEVICE_NAMES),
                        help="device kind (default: ascend-910c-die, the paper's; cpu: the daemon's virtual device)")
    parser.add_argument("--device-memory-mib", type=int, default=None,
                        help="memory of one device (default: the preset's; cpu: 2048, the daemon's devices.memory_mib)")
    parser.add_argument("--perf", default=None,
                        help="JSON object: performance model figures (overhead_s, seq_overhead_s, compute_eff, "
                             "bandwidth_eff, usable_frac) and engine limits (max_num_seqs, max_batched_tokens, "
                             "kv_wait_timeout_s)")
    parser.add_argument("--calibrate", default=None, metavar="BENCH_JSON",
                        help="fit the performance model to the step times of a `janus bench engine --json` result "
                             "(one served model; --calibrate-label names it in the result)")
    parser.add_argument("--calibrate-label", default="demo-llama-small",
                        help="the model's label in the bench result (default demo-llama-small)")
    parser.add_argument("--calibrate-tpot-ms", type=float, default=None, metavar="MS",
                        help="then scale the host figures (overhead_s, seq_overhead_s) until the simulation of this "
                             "trace gives this median TPOT: a real replay's, measured on the same trace (the summary's "
                             "perf is the calibrated model, for --perf on other traces)")
    parser.add_argument("--oracle-error", type=float, default=0.0, metavar="F",
                        help="a controller policy's oracle misjudges each model's load by a fixed factor in "
                             "[1-F, 1+F] (e.g. the held-out P90 relative error of `janus oracle eval`; default 0: the "
                             "simulator's own performance model)")
    parser.add_argument("--oracle-seed", type=int, default=0, help="seed of --oracle-error's factors (default 0)")
    parser.add_argument("--vs-static", action="store_true",
                        help="also run static: on all devices, right-sized (the fewest devices reaching this "
                             "policy's token attainment, by bisection) and on this policy's mean devices")
    parser.add_argument("--config", default=None, metavar="JANUSD_TOML",
                        help="run a daemon's configuration: its models' devices, start states and pools, its "
                             "[control] and [dispatch] (policy janus: its controller; static: its placement alone); "
                             "the trace's model names are the config's")
    parser.add_argument("--out", default=None, help="run directory: results.jsonl, devices.csv, summary.json")
    parser.add_argument("--json", action="store_true", help="print only the summary JSON")
    from janusd.bench.replay_sim import add_arguments as add_scenario

    add_scenario(parser)


def run(args: argparse.Namespace) -> int:
    from janusd.sim.placement import PlacementError
    from janusd.sim.run import simulate, write_run
    from janusd.sim.calibrate import CalibrationError, scale_host
    from janusd.sim.compare import figures as run_figures
    from janusd.sim.specs import SpecError, load_models_file, resolve
    from janusd.trace.formats import TraceError, read_trace
    from janusd.trace.results import jsonable

    def fail(msg: str) -> int:
        print(f"janus sim: error: {msg}", file=sys.stderr)
        return 2

    if getattr(args, "scenario", None):
        return _scenario(args, fail)
    missing = [f"--{k}" for k in ("trace", "devices", "policy") if getattr(args, k) is None]
    if missing:
        return fail(f"{', '.join(missing)} required (or --scenario one|mixed)")
    if args.devices < 1:
        return fail(f"--devices must be >= 1, got {args.devices}")
    if args.device_memory_mib is not None and args.device_memory_mib < 1:
        return fail(f"--device-memory-mib must be >= 1, got {args.device_memory_mib}")
    try:
        trace = read_trace(args.trace)
        table = load_models_file(args.models) if args.models else None
        archs = resolve(trace.models, table)
    except (TraceError, SpecError, OSError) as e:
        return fail(str(e))
    if len(trace.arrival_s) == 0:
        return fail(f"{args.trace}: the trace has no requests")
    config = None
    if args.config:
        from janusd.sim.configured import ConfigError, read

        try:
            config = read(args.config)
        except ConfigError as e:
            return fail(str(e))
    try:
        perf, engine, figures = _perf(args, archs)
    except (CalibrationError, ValueError, OSError) as e:
        return fail(str(e))
    try:
        if args.calibrate_tpot_ms is not None:
            def tpot_p50_ms(p: object) -> float | None:
                c, _ = simulate(trace, archs, args.devices, args.policy, args.device, keep_times=True, perf=p,
                                engine=engine)
                return run_figures(c.result_rows(), trace.duration_s)["tpot_p50_ms"]

            perf, k = scale_host(perf, tpot_p50_ms, args.calibrate_tpot_ms)
            fitted = {f: getattr(perf, f) for f in ("overhead_s", "seq_overhead_s", "compute_eff", "bandwidth_eff")}
            figures = {**figures, **fitted, "host_scale": k}
        cluster, summ = simulate(trace, archs, args.devices, args.policy, args.device,
                                 keep_times=args.out is not None, perf=perf, engine=engine,
                                 oracle_error=args.oracle_error, oracle_seed=args.oracle_seed, config=config)
        if args.vs_static:
            summ["static"] = _vs_static(args, trace, archs, perf, engine, summ)
    except (PlacementError, ValueError) as e:
        return fail(str(e))
    if figures:
        summ["perf"] = figures
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


def _scenario(args: argparse.Namespace, fail) -> int:  # type: ignore[no-untyped-def]
    """`--scenario`: the dispatch-replay scenario simulated (bench/replay_sim.py)."""
    from janusd.bench.replay_sim import run as run_scenario
    from janusd.trace.results import jsonable

    try:
        out = run_scenario(args)
    except (ValueError, OSError, KeyError) as e:
        return fail(f"--scenario: {e}")
    print(json.dumps(jsonable(out)))
    return 0


def _vs_static(args: argparse.Namespace, trace, archs, perf, engine, summ):  # type: ignore[no-untyped-def]
    """sim/right_size.py's static figures beside this run's."""
    from janusd.sim.right_size import vs_static
    from janusd.sim.run import simulate

    def static(n: int) -> dict:  # type: ignore[type-arg]
        return simulate(trace, archs, n, "static", args.device, perf=perf, engine=engine)[1]

    return vs_static(static, summ, args.devices, len(trace.apps))


def _perf(args: argparse.Namespace, archs: dict) -> tuple:  # type: ignore[type-arg]
    """(PerfModel, EngineLimits, fitted figures or {}) from --device, --device-memory-mib,
    --perf and --calibrate; CalibrationError / ValueError / OSError say what is wrong."""
    from janusd.hw import device_spec
    from janusd.sim.calibrate import CalibrationError, fit, points_from_bench, settings_from_mapping
    from janusd.sim.perfmodel import PerfModel

    mib = args.device_memory_mib
    if mib is None and args.device == "cpu":
        mib = 2048
    dev = device_spec(args.device, hbm_bytes=None if mib is None else mib * 2**20)
    perf, engine = settings_from_mapping({}, PerfModel(dev))
    figures: dict = {}  # type: ignore[type-arg]
    if args.perf:
        try:
            data = json.loads(Path(args.perf).read_text())
        except json.JSONDecodeError as e:
            raise CalibrationError(f"--perf {args.perf}: not JSON: {e}") from None
        try:
            perf, engine = settings_from_mapping(data, perf, engine)
        except CalibrationError as e:
            raise CalibrationError(f"--perf {args.perf}: {e}") from None
    if args.calibrate:
        if len(archs) != 1:
            raise CalibrationError(f"--calibrate fits one model; the trace has {len(archs)} ({', '.join(archs)})")
        try:
            text = Path(args.calibrate).read_text().strip().splitlines()
            result = json.loads(text[-1]) if text else None
        except json.JSONDecodeError as e:
            raise CalibrationError(f"--calibrate {args.calibrate}: the last line is not JSON: {e}") from None
        try:
            f = fit(points_from_bench(result or {}, args.calibrate_label), next(iter(archs.values())), perf)
        except CalibrationError as e:
            raise CalibrationError(f"--calibrate {args.calibrate}: {e}") from None
        perf = f.perf
        figures = f.figures()
    return perf, engine, figures

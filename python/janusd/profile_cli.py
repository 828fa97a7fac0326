"""`janus profile SPEC --device cpu|cuda|npu [--out FILE] [--budget-s S]`: measure a model
on the real engine and write oracle training points (profiling/, oracle/dataset.py).
The last line is one JSON object."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    from janusd.hw.devices import DEVICE_NAMES
    from janusd.profiling.args import ProfileArgs
    from janusd.profiling.load import MIXES

    d = ProfileArgs(spec="")
    p.add_argument("spec", help="checkpoint spec as `janus generate` takes it (HF dir, .gguf, builtin:NAME, demo:ARCH-SIZE)")
    p.add_argument("--device", choices=("cpu", "cuda", "npu"), default=d.device, help="engine device kind")
    p.add_argument("--device-spec", choices=DEVICE_NAMES, default=None,
                   help="peak figures to measure against (default: cpu, h100 for cuda, ascend-910c-die for npu)")
    p.add_argument("--out", default=str(d.out), help="points file to write (JSON header + npz)")
    p.add_argument("--budget-s", type=float, default=d.budget_s, help="bound on the whole run, seconds")
    p.add_argument("--max-instances", type=int, default=d.max_instances, help="profile m = 1..this many instances")
    p.add_argument("--point-s", type=float, default=d.point_s, help="seconds of a point's measured window (longer at low rates and at the knee; a warm-up and a cool-down of a quarter of it, at least 2 s each, run around it)")
    p.add_argument("--ttft-slo-ms", type=float, default=d.ttft_slo_ms)
    p.add_argument("--tpot-slo-ms", type=float, default=d.tpot_slo_ms)
    p.add_argument("--mixes", default=",".join(d.mixes), help=f"length mixes, from {', '.join(MIXES)}")
    p.add_argument("--start-rate", type=float, default=d.start_rate, help="first rate of each series, req/s")
    p.add_argument("--max-rate", type=float, default=d.max_rate, help="highest rate tried, req/s")
    p.add_argument("--memory-mib", type=int, default=d.memory_mib, help="page pool per device")
    p.add_argument("--kv-cache-mib", type=int, default=d.kv_cache_mib)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=d.dtype)
    p.add_argument("--torch-threads", type=int, default=d.torch_threads, help="torch threads per worker")
    p.add_argument("--pin-cores", action="store_true",
                   help="cpu: each worker on cores of its own (--torch-threads each, from the top), the daemon and "
                        "the load generator on the rest; an instance count that leaves them none runs unpinned")
    p.add_argument("--cache-dir", default=None, help="checkpoint (and cpu peaks) cache dir")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--repeats", type=int, default=d.repeats,
                   help="measurements of each load point (their spread is the noise floor `janus oracle eval` shows)")
    p.add_argument("--keep-dir", default=None, help="keep daemon logs and per-point results here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="accepted for uniformity: the JSON object is always last")


def run(args: argparse.Namespace) -> int:
    from janusd.engine.loader import CheckpointError
    from janusd.profiling.args import ProfileArgs
    from janusd.profiling.load import MIXES
    from janusd.profiling.run import run as profile

    mixes = tuple(x.strip() for x in args.mixes.split(",") if x.strip())
    bad = [x for x in mixes if x not in MIXES]
    problems = []
    if bad or not mixes:
        problems.append(f"--mixes: unknown {bad or 'empty'} (known: {', '.join(MIXES)})")
    if not args.budget_s > 0 or not args.point_s > 0:
        problems.append("--budget-s and --point-s must be > 0")
    if args.max_instances < 1 or not (0 < args.start_rate <= args.max_rate):
        problems.append("need --max-instances >= 1 and 0 < --start-rate <= --max-rate")
    if args.repeats < 1:
        problems.append("--repeats must be >= 1")
    if problems:
        print(f"janus profile: {'; '.join(problems)}", file=sys.stderr)
        return 2
    a = ProfileArgs(spec=args.spec, device=args.device, device_spec=args.device_spec, out=Path(args.out),
                    budget_s=args.budget_s, max_instances=args.max_instances, point_s=args.point_s,
                    ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms, mixes=mixes,
                    start_rate=args.start_rate, max_rate=args.max_rate, memory_mib=args.memory_mib,
                    kv_cache_mib=args.kv_cache_mib, dtype=args.dtype, torch_threads=args.torch_threads,
                    cache_dir=args.cache_dir, seed=args.seed, repeats=args.repeats, quiet=args.quiet,
                    pin_cores=args.pin_cores,
                    keep_dir=Path(args.keep_dir) if args.keep_dir else None)
    try:
        summary = profile(a)
    except (CheckpointError, RuntimeError, ValueError, OSError) as e:
        print(f"janus profile: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0

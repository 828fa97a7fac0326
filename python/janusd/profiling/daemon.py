"""The daemon a profile measures: its configuration (one model, its own oracle off), the
host's cores split between its workers and the rest, and the warm-up before the first point."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from janusd.profiling.args import ProfileArgs

MODEL_NAME = "profiled"  # the name the profiled daemon serves the model under


def split_cores(cores: Sequence[int], m: int, threads: int) -> tuple[list[list[int]], list[int]] | None:
    """(each of m workers' cores, the host's cores) for a pinned cpu profile: workers take
    `threads` cores each from the top, the daemon and the replayer keep the rest; None when
    that leaves the host no core (then nothing is pinned and the header says the engine
    shared its cores: on a 2-core VM the bandwidth of the same setting spread 14% that way
    against 6% pinned, bench/RESULTS.md "The served range first")."""
    cs = sorted(set(cores))
    per = max(1, threads)
    host = len(cs) - m * per
    if host < 1:
        return None
    return [cs[host + i * per:host + (i + 1) * per] for i in range(m)], cs[:host]


def daemon_config(a: ProfileArgs, run_dir: Path, m: int, cpu_cores: list[list[int]] | None = None) -> str:
    cache = f'cache_dir = "{a.cache_dir}"\n' if a.cache_dir else ""
    pinned = f"cpu_cores = {cpu_cores}\n" if cpu_cores else ""
    return (
        f'[server]\nport = 0\nadmin_socket = "{run_dir / "admin.sock"}"\n{cache}queue_limit = 100000\n'
        # the daemon's own oracle stays idle: no online refits in a helper process competing
        # with the worker for the cores being measured
        f'[oracle]\nonline = false\nstate_dir = "{run_dir / "state"}"\n'
        f'[devices]\nkind = "{a.device}"\ncount = {m}\nmemory_mib = {a.memory_mib}\n{pinned}'
        f'[[models]]\nname = "{MODEL_NAME}"\ncheckpoint = "{a.spec}"\ndevices = {list(range(m))}\n'
        f"ttft_slo_ms = {float(a.ttft_slo_ms)}\ntpot_slo_ms = {float(a.tpot_slo_ms)}\n"
        f'kv_cache_mib = {a.kv_cache_mib}\ndtype = "{a.dtype}"\n'
    )


def warm(port: int) -> None:
    """Three short greedy requests before the first point: a fresh daemon's first requests pay
    one-time costs (first kernels, allocations) that no point should measure."""
    import urllib.request

    from janusd.trace.replay import PromptMaker

    body = {"model": MODEL_NAME, "prompt": PromptMaker()(64), "max_tokens": 4, "min_tokens": 4, "ignore_eos": True,
            "temperature": 0.0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    for _ in range(3):
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()

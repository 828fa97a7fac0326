"""`janus bench restore`: what bringing weights back costs against the raw speed of the
same bytes on the same machine, in the same run (PAPER.md §8, issue [L]).

Synthetic segments of each size (default 64 MiB to 2 GiB), in this process's own cpu
pool, through the code the worker runs. The pool is all resident (`devices.resident_mib`:
its pages faulted in when it is made, `resident_populate_s_per_gib` is what that costs);
each `*_fresh_pages_*` figure is the same operation on pages given back to the OS first, as
a pool without a resident zone has them after a model went Cold (the kernel zeroes every
4 KiB page on first touch):
- H2D: a weight segment filled from a host copy by engine/restore.Copier (chunks, several
  in flight), against one plain copy of the same bytes into the same resident pages, the
  two timed in turns (ABBA), 3 to 15 turns by size, medians (`h2d_vs_memcpy` = memcpy
  time / restore time);
- D2D: engine/worker_fork.pull_segment (match the pieces, chunked batch read over
  Mooncake, sampled checksums) from a peer process into a new segment, against a raw
  Mooncake read of the same bytes from the same peer into the same kind of segment
  (`d2d_vs_raw_transfer`);
- Cold: the converted image read into a new segment (Copier.read_file: chunked preads in
  flight), against a sequential read() of the same file into one 16 MiB buffer
  (`cold_vs_disk`); the file is in the page cache for all of them.
Then through a real daemon serving the same small model (SmolLM2-135M-Instruct by
default, in `--dtype`, bfloat16 unless given: its GGUF holds 4-bit Q4_1 matrices, which no
16-bit float holds exactly; bf16 rounds them by 0.13% rms against Q4_1's own ~8% and halves
what each step reads and each restore moves; the JSON's `dtype` says which) on two cpu devices:
- `control_overhead_ms`: client-side time of `ctl state active` (Warm -> Active) minus the
  transfer and first-token phases: everything but moving bytes and the first token;
- `source_tpot_p99_increase_pct`: the p99 inter-token gap of a stream on the source
  device over the tokens that arrived while forks to the other device ran, against its
  gaps in quiet windows as long as each fork, in ABBA order (fork-quiet, quiet-fork, ...:
  drift and the machine's other work fall on both sides alike); at least --forks pairs,
  more (up to --max-forks) until both sides have --min-during-tokens gaps. The spread:
  `source_tpot_p99_increase_ci90` (5th-95th percentile of the figure over the pairs
  resampled) and `source_tpot_mean_increase_pct` (the mean gap, which one slow token does
  not move). `devices.transfer_nice` and `lifecycle.fork_bandwidth_mib_s` from
  --transfer-nice / --fork-bandwidth-mib-s; --tpot-null-fork-s S runs the same procedure
  with S seconds of no fork in each fork window (an A/A check: the figure's chance spread);
- `warm_first_token_s` / `cold_first_token_s`: a request to the model while its only
  instances are Warm / Cold, sent to the first streamed token (the request wakes one); the
  image is dropped from the page cache before the daemon starts (as a reboot or memory
  pressure leaves an image of an earlier run), `cold_image_cached_pct` is how much of it
  the page cache held at the first Cold start, and `cold_uncached_first_token_s` one more
  Cold start with the image dropped from the cache right before it (the disk's cost);
- `cold_rss_after_mib`: the worker's RSS once the model is Cold on its device, and
  `cold_rss_over_idle_mib` that less the RSS of a worker that never held the model
  (`worker_rss_idle_mib`; both hold the pool's resident zone, `resident_mib`).
The machine is shared and noisy: medians of a few repeats; ratios (same bytes, same run)
mean more than absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from janusd.bench import daemon_proc

if TYPE_CHECKING:  # torch loads in the functions: `janus --help` builds every bench's parser
    import torch


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes-mib", default="64,256,1024,2048", help="synthetic segment sizes (MiB)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per size and path (median)")
    p.add_argument("--fresh-repeats", type=int, default=1, help="repeats of the *_fresh_pages_* figures")
    p.add_argument("--streams", type=int, default=4, help="chunked copies in flight")
    p.add_argument("--chunk-mib", type=int, default=64, help="chunk size")
    p.add_argument("--checkpoint", default="builtin:smollm2-135m-instruct", help="model for the daemon part")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16",
                   help="the daemon part's model dtype (default bfloat16: SmolLM2's GGUF is 4-bit Q4_1, bf16 "
                        "rounds it by 0.13%% rms and halves the bytes each step reads and each restore moves)")
    p.add_argument("--no-daemon", action="store_true", help="synthetic segments only")
    p.add_argument("--forks", type=int, default=6, help="forks during the source stream (at least; an even number "
                   "of fork / quiet pairs is kept, ABBA)")
    p.add_argument("--min-during-tokens", type=int, default=800,
                   help="fork again (up to --max-forks) until this many source tokens arrived during forks and as "
                        "many in the quiet windows beside them: the p99 of ~400 gaps is its 4th-largest gap")
    p.add_argument("--max-forks", type=int, default=40, help="the most forks --min-during-tokens may take")
    p.add_argument("--tpot-null-fork-s", type=float, default=0.0,
                   help="A/A check of the TPOT comparison: each 'fork' window is this many seconds of no fork "
                        "(the same pairs, order and statistics: how far the figure moves by chance)")
    p.add_argument("--cache-dir", default=None, help="checkpoint cache dir (default: the config default)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--transfer-nice", type=int, default=None, help="devices.transfer_nice (default: the config's)")
    p.add_argument("--fork-bandwidth-mib-s", type=int, default=None,
                   help="lifecycle.fork_bandwidth_mib_s (default: the config's)")
    p.add_argument("--resident-mib", type=int, default=1024,
                   help="devices.resident_mib of the daemon part (0: pages backed on first touch)")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))] if s else float("nan")


TPOT_STREAM_TOKENS = 4000  # the source stream's length at most (max_model_len 4096); it stops when the pairs end
SETTLE_S = 0.2  # after the target's Cold transition, before the next window


def _pair_bootstrap(by_pair: list[tuple[list[float], list[float]]], n: int = 2000) -> list[float]:
    """The 5th and 95th percentiles of the p99 increase (%) over the pairs resampled with
    replacement (n draws, seeded): how far the figure moves with which pairs one happened
    to measure. [nan, nan] for fewer than 2 pairs."""
    import random

    if len(by_pair) < 2:
        return [float("nan"), float("nan")]
    rng = random.Random(0)
    draws = []
    for _ in range(n):
        pick = [by_pair[rng.randrange(len(by_pair))] for _ in by_pair]
        q = [g for a, _ in pick for g in a]
        d = [g for _, b in pick for g in b]
        if q and d:
            draws.append((_p99(d) / _p99(q) - 1) * 100)
    draws.sort()
    return [round(draws[int(0.05 * len(draws))], 1), round(draws[int(0.95 * len(draws)) - 1], 1)]


def _turns(nbytes: int, repeats: int) -> int:
    """Timed turns for a copy of nbytes: `repeats`, more for small copies (a 64 MiB copy
    takes ~4 ms, where one scheduling hiccup moves a median of 3), at most 15."""
    return max(repeats, min(15, repeats * (1 << 30) // max(nbytes, 1)))


def _fill(t: torch.Tensor) -> None:
    import torch

    gen = torch.Generator().manual_seed(1)
    step = 64 << 20
    for a in range(0, t.numel(), step):
        n = min(step, t.numel() - a)
        t[a: a + n].copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen))


def _synthetic(sizes: list[int], args: argparse.Namespace, work: Path) -> tuple[list[dict[str, Any]], float]:
    """Rows per size, and the seconds per GiB of faulting a resident zone in (what a
    worker with `devices.resident_mib` pays once, at start)."""
    import torch

    from janusd.engine.restore import Copier
    from janusd.engine.worker_fork import pull_segment
    from janusd.lifecycle.transfer import GlobalRegionTransport, Piece
    from janusd.memory import DevicePool, residency
    from janusd.wire import worker_msgs as wm

    import msgspec

    page = 2 << 20
    pages = max(sizes) // page + 2
    t0 = time.perf_counter()
    pool = DevicePool("cpu", pages, page, background=False, resident_pages=pages)  # all of it resident
    populate_s_per_gib = (time.perf_counter() - t0) / (pages * page / (1 << 30))
    transport = GlobalRegionTransport(pool.global_base, pool.global_nbytes)
    copier = Copier(args.streams, args.chunk_mib << 20)
    rows = []

    def fresh(n: int) -> Any:
        return pool.alloc_weights("w", n)

    def drop(seg: Any) -> None:
        pool.free("w")

    def timed(op: Any, given_back: bool, n: int) -> float:
        """Seconds of op(seg) on a new segment: in the resident zone, or (given_back) on
        pages handed back to the OS, as a pool without a resident zone has them after a
        model went Cold (the kernel zeroes each on first touch)."""
        seg = fresh(n)
        if given_back:
            residency.give_back(seg.addr, seg.nbytes)
        t0 = time.perf_counter()
        op(seg)
        dt = time.perf_counter() - t0
        if given_back:
            pool.populate(seg.page_ids)  # resident again for the next measurement
        drop(seg)
        return dt

    for n in sizes:
        row: dict[str, Any] = {"mib": n >> 20}
        host = torch.empty(n, dtype=torch.uint8)
        _fill(host)
        # H2D: the Copier into a new segment vs one plain copy (one memcpy on one core) of the
        # same bytes into the same resident pages, measured in turns (ABBA order) so both
        # sides see the same moments of a shared machine; small sizes get more turns
        memcpy: list[float] = []
        h2d_s: list[float] = []
        ok: list[bool] = []
        for r in range(_turns(n, args.repeats)):
            seg = fresh(n)
            dst = seg.tensor()[:n]
            if r == 0:
                dst.copy_(host)  # warm-up
            for side in (("memcpy", "h2d") if r % 2 == 0 else ("h2d", "memcpy")):
                t0 = time.perf_counter()
                if side == "memcpy":
                    dst.copy_(host)
                else:
                    copier.copy(dst, host)
                (memcpy if side == "memcpy" else h2d_s).append(time.perf_counter() - t0)
            dst.zero_()
            copier.copy(dst, host)
            ok.append(torch.equal(dst[n - (1 << 20):], host[n - (1 << 20):]) and torch.equal(dst[: 1 << 20], host[: 1 << 20]))
            del dst
            drop(seg)

        def h2d(seg: Any) -> None:
            copier.copy(seg.tensor()[:n], host)

        fresh_h2d = [timed(h2d, True, n) for _ in range(args.fresh_repeats)]
        row.update(turns=len(h2d_s), memcpy_s=_median(memcpy), h2d_s=_median(h2d_s),
                   h2d_vs_memcpy=_median(memcpy) / _median(h2d_s), h2d_fresh_pages_s=_median(fresh_h2d),
                   h2d_fresh_pages_vs_memcpy=_median(memcpy) / _median(fresh_h2d), h2d_bytes_ok=all(ok))
        # Cold: the image file read into a new segment vs a sequential read() of the same file
        path = work / f"image-{n >> 20}.bin"
        with open(path, "wb") as fh:
            fh.write(memoryview(host.numpy()))  # type: ignore[arg-type]
        buf = bytearray(1 << 24)
        disk = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
            disk.append(time.perf_counter() - t0)
        cold = [timed(lambda seg: copier.read_file(seg.tensor()[:n], path), False, n) for _ in range(args.repeats)]
        cold_fresh = [timed(lambda seg: copier.read_file(seg.tensor()[:n], path), True, n)
                      for _ in range(args.fresh_repeats)]
        path.unlink()
        row.update(disk_read_s=_median(disk), cold_s=_median(cold), cold_vs_disk=_median(disk) / _median(cold),
                   cold_fresh_pages_s=_median(cold_fresh),
                   cold_fresh_pages_vs_disk=_median(disk) / _median(cold_fresh))
        del host
        # D2D: a peer process's segment, raw read vs the fork's pull (pieces, chunks, checksums)
        peer = subprocess.Popen([sys.executable, "-m", "janusd.bench.restore_peer", str(n)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            src = msgspec.convert(json.loads(peer.stdout.readline()), wm.ForkSource)  # type: ignore[union-attr]

            def raw_read(seg: Any) -> None:
                off = 0
                pieces = []
                for a, m in src.pieces:  # one piece per run of the source's pages, into ours
                    pieces.append(Piece(a, seg.global_offset + off, m))
                    off += m
                transport.read(src.session, src.global_base, pieces)

            def fork(seg: Any) -> None:
                pull_segment(transport, src, seg, args.chunk_mib << 20)

            raw = [timed(raw_read, False, n) for _ in range(args.repeats)]
            d2d = [timed(fork, False, n) for _ in range(args.repeats)]
            d2d_fresh = [timed(fork, True, n) for _ in range(args.fresh_repeats)]
        finally:
            peer.stdin.close()  # type: ignore[union-attr]
            peer.wait(30)
        row.update(raw_transfer_s=_median(raw), d2d_s=_median(d2d), d2d_vs_raw_transfer=_median(raw) / _median(d2d),
                   d2d_fresh_pages_s=_median(d2d_fresh),
                   d2d_fresh_pages_vs_raw_transfer=_median(raw) / _median(d2d_fresh), d2d_gbps=n / _median(d2d) / 1e9)
        rows.append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    transport.close()
    pool.close()
    return rows, populate_s_per_gib


# ---- through a daemon ----
def _ctl(sock: str, req: Any) -> dict[str, Any]:
    from janusd.ctl_cli import call
    from janusd.wire import admin_msgs as am

    reply = call(sock, req, 600.0)
    if isinstance(reply, am.AdminError):
        raise RuntimeError(f"ctl: {reply.message}")
    return reply.data


def _stream(port: int, model: str, max_tokens: int, on_token: Any = None) -> list[float]:
    """Arrival times (s after sending) of each streamed token."""
    return daemon_proc.stream_completion(port, model, "Tell me a long story about the sea.", max_tokens, on_token)[0]


def _image_weights(args: argparse.Namespace, cache: str) -> Path | None:
    """The weights file of the model's host image (None when there is none yet)."""
    from janusd.engine.host_image import image_dir
    from janusd.engine.loader import checkpoint_path

    try:
        root = image_dir(Path(cache), checkpoint_path(args.checkpoint, Path(cache)), args.dtype)
    except Exception:
        return None
    w = root / "weights.bin"
    return w if (root / "meta.msgpack").exists() and w.is_file() else None


def _cached_pct(path: Path | None) -> float:
    from janusd.engine.host_image import cached_fraction

    return float("nan") if path is None else cached_fraction(path) * 100


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024


def _daemon(args: argparse.Namespace) -> dict[str, Any]:
    from janusd.config import ServerConfig, cache_dir
    from janusd.wire import admin_msgs as am

    cache = args.cache_dir or str(cache_dir(ServerConfig()))
    run_dir = Path(tempfile.mkdtemp(prefix="janus-bench-restore-"))
    sock = str(run_dir / "admin.sock")
    text = (f'[server]\nport = 0\nadmin_socket = "{sock}"\ncache_dir = "{cache}"\nmodel_wait_timeout_s = 120.0\n'
            f"[devices]\ncount = 2\nmemory_mib = 2048\nresident_mib = {args.resident_mib}\n"
            + (f"transfer_nice = {args.transfer_nice}\n" if args.transfer_nice is not None else "")
            + (f"[lifecycle]\nfork_bandwidth_mib_s = {args.fork_bandwidth_mib_s}\n"
               if args.fork_bandwidth_mib_s is not None else "")
            + f'[[models]]\nname = "m"\ncheckpoint = "{args.checkpoint}"\nkv_cache_mib = 256\nmax_model_len = 4096\n'
            f'dtype = "{args.dtype}"\n'
            f"ttft_slo_ms = 600000.0\ntpot_slo_ms = 600000.0\ndevices = [0, 1]\ncold_devices = [1]\n")
    # the model's host image (the file a Cold start reads) out of the page cache, if it exists,
    # as a reboot or memory pressure leaves an image written in an earlier run: the first Cold
    # start then finds what the daemon itself put in the cache (lifecycle.cold_prefetch_image)
    image = _image_weights(args, cache)
    if image is not None:
        from janusd.engine.host_image import drop_cached

        drop_cached(image)
    proc, port = daemon_proc.start(text, run_dir, args.torch_threads, {"m": 1})
    from janusd.config import DevicesConfig, LifecycleConfig

    out: dict[str, Any] = {  # the settings in effect (the config's defaults unless given)
        "dtype": args.dtype, "resident_mib": args.resident_mib,
        "transfer_nice": DevicesConfig().transfer_nice if args.transfer_nice is None else args.transfer_nice,
        "fork_bandwidth_mib_s": (LifecycleConfig().fork_bandwidth_mib_s if args.fork_bandwidth_mib_s is None
                                 else args.fork_bandwidth_mib_s)}
    try:
        _stream(port, "m", 4)  # warm-up
        pids = {w["device"]: w["pid"] for w in _ctl(sock, am.StatusReq())["workers"]}
        out["worker_rss_idle_mib"] = round(_rss_mib(pids[1]), 1)  # device 1: the model Cold, nothing loaded yet
        # fixed control overhead of an activation: Warm -> Active on device 0, client side
        overhead, phases = [], []
        for _ in range(args.repeats):
            _ctl(sock, am.StateReq("m", 0, "warm"))
            t0 = time.perf_counter()
            r = _ctl(sock, am.StateReq("m", 0, "active"))
            wall = time.perf_counter() - t0
            overhead.append(wall - r["phases"].get("transfer", 0.0) - r["phases"].get("first_token", 0.0))
            phases.append(r["phases"])
        out["control_overhead_ms"] = round(_median(overhead) * 1e3, 2)
        out["warm_restore_phases_s"] = phases[-1]
        # source TPOT p99 without vs during forks 0 -> 1 (device 1 back to Cold after each), in
        # pairs of one fork window and one quiet window as long as it, in ABBA order (fork then
        # quiet, quiet then fork, ...: F Q Q F F Q Q F), so drift (the context growing, other
        # work on the machine) falls on both sides alike and a slow fork (a busy machine) gets
        # as much quiet time beside it. A gap counts for the window its token arrived in; the
        # target's Cold transition after each fork and SETTLE_S after it are in neither.
        min_tok = args.min_during_tokens
        max_pairs = max(args.forks, args.max_forks)
        seen = [0]
        cv = threading.Condition()
        stop = threading.Event()
        t_send: list[float] = []

        def on_token(i: int) -> bool:
            with cv:
                seen[0] = i
                cv.notify_all()
            return stop.is_set()

        res: dict[str, list[float]] = {}

        def source_stream() -> None:
            t_send.append(time.perf_counter())
            try:
                res["t"] = _stream(port, "m", TPOT_STREAM_TOKENS, on_token)
            finally:
                with cv:
                    cv.notify_all()

        def now() -> float:
            return time.perf_counter() - t_send[0]

        def alive() -> None:
            if not th.is_alive():
                raise RuntimeError("the source stream ended before the forks did: fewer --min-during-tokens")

        def quiet(d: float) -> tuple[float, float, int]:
            """A quiet window of d seconds: (start, end) in stream time and the tokens in it."""
            alive()
            t0, n0 = now(), seen[0]
            with cv:
                cv.wait_for(lambda: not th.is_alive(), d)
            alive()
            return t0, now(), seen[0] - n0

        def fork() -> tuple[float, float, int]:
            alive()
            t0, n0 = now(), seen[0]
            if args.tpot_null_fork_s > 0:  # the A/A check: a window of no fork, as long as a fork
                time.sleep(args.tpot_null_fork_s)
            else:
                fork_rows.append(_ctl(sock, am.ForkReq("m", 0, 1)))
            w = (t0, now(), seen[0] - n0)
            _ctl(sock, am.StateReq("m", 1, "cold"))
            time.sleep(SETTLE_S)
            return w

        th = threading.Thread(target=source_stream)
        th.start()
        while not t_send:
            time.sleep(0.001)
        with cv:  # warm-up: the stream is decoding
            cv.wait_for(lambda: seen[0] >= 20 or not th.is_alive(), 600)
        fork_rows: list[dict[str, Any]] = []
        pairs: list[tuple[tuple[float, float, int], tuple[float, float, int]]] = []  # (quiet, fork) windows
        while len(pairs) < max_pairs and (len(pairs) < args.forks or len(pairs) % 2
                                          or min(sum(q[2] for q, _ in pairs), sum(f[2] for _, f in pairs)) < min_tok):
            if len(pairs) % 2 == 0:  # A: fork, then quiet for as long
                f = fork()
                q = quiet(f[1] - f[0])
            else:  # B: quiet for as long as the last fork took, then fork
                q = quiet(pairs[-1][1][1] - pairs[-1][1][0])
                f = fork()
            pairs.append((q, f))
        stop.set()
        th.join(600)
        times = res["t"]
        gaps = [(b, b - a) for a, b in zip(times, times[1:])]

        def inside(w: tuple[float, float, int]) -> list[float]:
            return [g for t, g in gaps if w[0] < t <= w[1]]

        by_pair = [(inside(q), inside(f)) for q, f in pairs]
        before = [g for q, _ in by_pair for g in q]
        during = [g for _, f in by_pair for g in f]
        out["source_tpot_order"] = "ABBA"
        out["source_tpot_pairs"] = len(pairs)
        out["source_tokens_quiet"] = len(before)
        out["source_tpot_p99_before_ms"] = round(_p99(before) * 1e3, 2)
        out["source_tpot_p99_during_ms"] = round(_p99(during) * 1e3, 2)
        out["source_tokens_during_forks"] = len(during)
        out["source_tpot_mean_increase_pct"] = round((statistics.fmean(during) / statistics.fmean(before) - 1) * 100, 1)
        out["source_tpot_p99_increase_ci90"] = _pair_bootstrap(by_pair)
        out["source_tpot_p99_increase_pct"] = round((_p99(during) / _p99(before) - 1) * 100, 1)
        out["fork_paths"] = [r["path"] for r in fork_rows]
        out["fork_phases_s"] = fork_rows[-1]["phases"] if fork_rows else {}
        if args.tpot_null_fork_s > 0:
            out["tpot_null_fork_s"] = args.tpot_null_fork_s
        # first token through the API: the only instances Warm (then Cold), the request wakes one;
        # against the first token of the same request to an Active instance
        out["active_first_token_s"] = round(_median([_stream(port, "m", 1)[0] for _ in range(args.repeats)]), 4)
        _ctl(sock, am.StateReq("m", 0, "warm"))
        warm = [_stream(port, "m", 1)[0]]
        for _ in range(args.repeats - 1):
            _ctl(sock, am.StateReq("m", 0, "warm"))
            warm.append(_stream(port, "m", 1)[0])
        _ctl(sock, am.StateReq("m", 0, "cold"))
        time.sleep(0.5)
        out["cold_rss_after_mib"] = round(_rss_mib(pids[0]), 1)
        out["cold_rss_over_idle_mib"] = round(out["cold_rss_after_mib"] - out["worker_rss_idle_mib"], 1)
        image = _image_weights(args, cache)  # written by now (Warm wrote it if no run had)
        out["cold_image_cached_pct"] = round(_cached_pct(image), 1)  # before the first Cold start
        cold = [_stream(port, "m", 1)[0]]
        for _ in range(args.repeats - 1):
            _ctl(sock, am.StateReq("m", 0, "cold"))
            cold.append(_stream(port, "m", 1)[0])
        # one Cold start from the disk: the image dropped from the page cache after the
        # readahead of going Cold finished (what a Cold start costs when memory pressure
        # evicted the image since; not the product's usual path, reported beside it)
        _ctl(sock, am.StateReq("m", 0, "cold"))
        if image is not None:
            from janusd.engine.host_image import drop_cached

            deadline = time.monotonic() + 10
            while _cached_pct(image) < 99 and time.monotonic() < deadline:
                time.sleep(0.05)
            drop_cached(image)
            out["cold_uncached_image_cached_pct"] = round(_cached_pct(image), 1)
            out["cold_uncached_first_token_s"] = round(_stream(port, "m", 1)[0], 4)
        _ctl(sock, am.StateReq("m", 0, "cold"))
        out["cold_restore_phases_s"] = _ctl(sock, am.StateReq("m", 0, "active"))["phases"]
        out["warm_first_token_s"] = round(_median(warm), 4)
        out["cold_first_token_s"] = round(_median(cold), 4)
        out["first_tokens_s"] = {"warm": [round(x, 4) for x in warm], "cold": [round(x, 4) for x in cold]}
    finally:
        daemon_proc.stop(proc)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(x) << 20 for x in args.sizes_mib.split(",")]
    with tempfile.TemporaryDirectory(prefix="janus-bench-restore-") as work:
        rows, populate_s_per_gib = _synthetic(sizes, args, Path(work))
    daemon = {} if args.no_daemon else _daemon(args)
    worst = lambda key: round(min(r[key] for r in rows), 3)  # noqa: E731
    result: dict[str, Any] = {"bench": "restore", "streams": args.streams, "chunk_mib": args.chunk_mib,
                              "cpus": os.cpu_count(), "resident_populate_s_per_gib": round(populate_s_per_gib, 3),
                              "by_size": rows, **daemon}
    result.update(h2d_fresh_pages_vs_memcpy=worst("h2d_fresh_pages_vs_memcpy"),
                  d2d_fresh_pages_vs_raw_transfer=worst("d2d_fresh_pages_vs_raw_transfer"),
                  cold_fresh_pages_vs_disk=worst("cold_fresh_pages_vs_disk"),
                  h2d_vs_memcpy=worst("h2d_vs_memcpy"), d2d_vs_raw_transfer=worst("d2d_vs_raw_transfer"),
                  cold_vs_disk=worst("cold_vs_disk"))
    for key in ("control_overhead_ms", "source_tpot_p99_increase_pct", "warm_first_token_s", "cold_first_token_s",
                "cold_rss_after_mib"):
        if key in result:
            result[key] = result.pop(key)  # the keys last, in its order
    return result

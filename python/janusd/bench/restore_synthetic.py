"""`janus bench restore`'s synthetic part (bench/restore.py): segments of each size in this
process's own cpu pool, all resident, moved by the code the worker runs (H2D, Cold, D2D)
against the raw speed of the same bytes, in turns, on the same machine."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from janusd.bench.restore_stats import median

if TYPE_CHECKING:  # torch loads in the functions: `janus --help` builds every bench's parser
    import torch


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


class _Segments:
    """New weight segments in the bench's pool, one at a time (all measurements share one
    name, so one segment is out at once)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def fresh(self, n: int) -> Any:
        return self.pool.alloc_weights("w", n)

    def drop(self, seg: Any) -> None:
        self.pool.free("w")

    def timed(self, op: Any, given_back: bool, n: int) -> float:
        """Seconds of op(seg) on a new segment: in the resident zone, or (given_back) on
        pages handed back to the OS, as a pool without a resident zone has them after a
        model went Cold (the kernel zeroes each on first touch)."""
        from janusd.memory import residency

        seg = self.fresh(n)
        if given_back:
            residency.give_back(seg.addr, seg.nbytes)
        t0 = time.perf_counter()
        op(seg)
        dt = time.perf_counter() - t0
        if given_back:
            self.pool.populate(seg.page_ids)  # resident again for the next measurement
        self.drop(seg)
        return dt


def _h2d(segs: _Segments, copier: Any, host: torch.Tensor, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The Copier into a new segment vs one plain copy (one memcpy on one core) of the same
    bytes into the same resident pages, measured in turns (ABBA order) so both sides see
    the same moments of a shared machine; small sizes get more turns."""
    import torch

    memcpy: list[float] = []
    h2d_s: list[float] = []
    ok: list[bool] = []
    for r in range(_turns(n, args.repeats)):
        seg = segs.fresh(n)
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
        ok.append(torch.equal(dst[n - (1 << 20):], host[n - (1 << 20):])
                  and torch.equal(dst[: 1 << 20], host[: 1 << 20]))
        del dst
        segs.drop(seg)

    def h2d(seg: Any) -> None:
        copier.copy(seg.tensor()[:n], host)

    fresh_h2d = [segs.timed(h2d, True, n) for _ in range(args.fresh_repeats)]
    return dict(turns=len(h2d_s), memcpy_s=median(memcpy), h2d_s=median(h2d_s),
                h2d_vs_memcpy=median(memcpy) / median(h2d_s), h2d_fresh_pages_s=median(fresh_h2d),
                h2d_fresh_pages_vs_memcpy=median(memcpy) / median(fresh_h2d), h2d_bytes_ok=all(ok))


def _cold(segs: _Segments, copier: Any, host: torch.Tensor, n: int, args: argparse.Namespace,
          work: Path) -> dict[str, Any]:
    """The image file read into a new segment vs a sequential read() of the same file."""
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
    cold = [segs.timed(lambda seg: copier.read_file(seg.tensor()[:n], path), False, n) for _ in range(args.repeats)]
    cold_fresh = [segs.timed(lambda seg: copier.read_file(seg.tensor()[:n], path), True, n)
                  for _ in range(args.fresh_repeats)]
    path.unlink()
    return dict(disk_read_s=median(disk), cold_s=median(cold), cold_vs_disk=median(disk) / median(cold),
                cold_fresh_pages_s=median(cold_fresh), cold_fresh_pages_vs_disk=median(disk) / median(cold_fresh))


def _d2d(segs: _Segments, transport: Any, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """A peer process's segment, raw read vs the fork's pull (pieces, chunks, checksums)."""
    import msgspec

    from janusd.engine.worker_fork import pull_segment
    from janusd.lifecycle.transfer import Piece
    from janusd.wire import worker_msgs as wm

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

        raw = [segs.timed(raw_read, False, n) for _ in range(args.repeats)]
        d2d = [segs.timed(fork, False, n) for _ in range(args.repeats)]
        d2d_fresh = [segs.timed(fork, True, n) for _ in range(args.fresh_repeats)]
    finally:
        peer.stdin.close()  # type: ignore[union-attr]
        peer.wait(30)
    return dict(raw_transfer_s=median(raw), d2d_s=median(d2d), d2d_vs_raw_transfer=median(raw) / median(d2d),
                d2d_fresh_pages_s=median(d2d_fresh),
                d2d_fresh_pages_vs_raw_transfer=median(raw) / median(d2d_fresh), d2d_gbps=n / median(d2d) / 1e9)


def synthetic(sizes: list[int], args: argparse.Namespace, work: Path) -> tuple[list[dict[str, Any]], float]:
    """Rows per size, and the seconds per GiB of faulting a resident zone in (what a
    worker with `devices.resident_mib` pays once, at start)."""
    import torch

    from janusd.engine.restore import Copier
    from janusd.lifecycle.transfer import GlobalRegionTransport
    from janusd.memory import DevicePool

    page = 2 << 20
    pages = max(sizes) // page + 2
    t0 = time.perf_counter()
    pool = DevicePool("cpu", pages, page, background=False, resident_pages=pages)  # all of it resident
    populate_s_per_gib = (time.perf_counter() - t0) / (pages * page / (1 << 30))
    transport = GlobalRegionTransport(pool.global_base, pool.global_nbytes)
    copier = Copier(args.streams, args.chunk_mib << 20)
    segs = _Segments(pool)
    rows = []
    for n in sizes:
        row: dict[str, Any] = {"mib": n >> 20}
        host = torch.empty(n, dtype=torch.uint8)
        _fill(host)
        row.update(_h2d(segs, copier, host, n, args))
        row.update(_cold(segs, copier, host, n, args, work))
        del host
        row.update(_d2d(segs, transport, n, args))
        rows.append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    transport.close()
    pool.close()
    return rows, populate_s_per_gib

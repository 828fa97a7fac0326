"""Worker-to-worker byte transfer between xTensor global regions (PAPER.md §7, P/D KV transfer).

Why base + offset: a freshly created virtual KV block may have no physical page yet, so
it cannot be registered for remote access. Each worker registers its WHOLE global region
(page i at base + i * page_size) once; a peer then addresses any block as base + offset.
The two sides of a transfer usually cut the same byte stream at different page
boundaries, so `match_pieces` pairs the two segmentations into contiguous copies. Nothing
here knows about KV: the same pieces carry weights on a D2D fork.

Mooncake facts measured on this machine (non-cuda wheel 0.3.13, tcp on loopback, 2 cores):
- bandwidth: a 16 MiB read moves at ~0.8-1.5 GB/s warm (shared, loaded VM; the first
  read of a session ~0.4-0.6 GB/s); 256 page-sized pieces in one batch cost the same.
- GIL: the sync calls release it; a busy Python thread kept running inside one 100 ms
  64 MiB read (max gap ~2 ms), so a transfer thread does not stall the main thread.
- peer killed: the read fails (-1) at once (connection reset/refused; a retry of the
  lane connection makes a later call take ~1 s).
- peer alive but frozen (SIGSTOP, or stuck): the sync call blocks; with Mooncake's
  defaults it was still blocked after 20 s. MC_TCP_PROGRESS_TIMEOUT_SEC=N bounds a
  transfer that makes no progress for N s (measured: N=2 -> fails after 2.0 s) without
  limiting a long transfer that keeps moving (N=1: a 1.5 GiB read taking 3 s succeeded),
  which weights need. MC_TRANSFER_TIMEOUT also bounds the frozen case but not below ~5 s
  (3 -> 5.0 s, 8 -> 8.0 s), so we set the progress timeout (`stall_timeout_s`, default
  5 s, set before the engine starts; an operator's own MC_TCP_PROGRESS_TIMEOUT_SEC wins).
- peer range out of bounds: the peer rejects it, -1 in a few ms.

Process rules: create the transport in the worker process itself, and never fork after
it exists (the engine owns threads and sockets). One TransferEngine per process.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import msgspec

_WHEEL = "mooncake-transfer-engine-non-cuda"
_STALL_ENV = "MC_TCP_PROGRESS_TIMEOUT_SEC"


class TransferError(RuntimeError):
    """Mooncake is missing, failed to start or register, or a transfer failed."""


class Piece(msgspec.Struct, array_like=True, frozen=True):
    """One contiguous copy: `nbytes` from source global offset to destination global offset."""

    src_offset: int
    dst_offset: int
    nbytes: int


def _segments(pieces: Any, side: str) -> list[tuple[int, int]]:
    if not isinstance(pieces, (list, tuple)):
        raise ValueError(f"{side}: expected a list of (global_offset, length), got {type(pieces).__name__}")
    out = []
    for i, p in enumerate(pieces):
        if not isinstance(p, (list, tuple)) or len(p) != 2:
            raise ValueError(f"{side}[{i}]: expected (global_offset, length), got {p!r}")
        off, n = p
        for name, v in (("offset", off), ("length", n)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{side}[{i}]: {name} must be an int, got {v!r}")
        if off < 0:
            raise ValueError(f"{side}[{i}]: offset must be >= 0, got {off}")
        if n <= 0:
            raise ValueError(f"{side}[{i}]: length must be > 0, got {n}")
        out.append((off, n))
    return out


def _check_disjoint(segs: list[tuple[int, int]], side: str) -> None:
    ordered = sorted(segs)
    for (a, an), (b, _) in zip(ordered, ordered[1:]):
        if a + an > b:
            raise ValueError(f"{side}: pieces overlap ([{a}, {a + an}) and [{b}, ...)): two writes to the same bytes")


def match_pieces(src: list[tuple[int, int]], dst: list[tuple[int, int]]) -> list[Piece]:
    """Pair two segmentations of the SAME byte stream: src and dst are lists of
    (global_offset, length) pieces in stream order (a KV block spans page boundaries
    differently on each side). Returns the minimal list of contiguous copies, in stream
    order, merging adjacent copies that are contiguous on both sides. Raises ValueError
    when the totals differ, a length is <= 0, an offset is negative, or dst pieces
    overlap (src may repeat bytes: reading twice is harmless, writing twice is not)."""
    s, d = _segments(src, "src"), _segments(dst, "dst")
    s_total, d_total = sum(n for _, n in s), sum(n for _, n in d)
    if s_total != d_total:
        raise ValueError(f"src covers {s_total} bytes but dst covers {d_total}: not the same byte stream")
    _check_disjoint(d, "dst")
    out: list[Piece] = []
    i = j = 0
    si = dj = 0  # bytes already consumed of s[i] / d[j]
    while i < len(s):
        n = min(s[i][1] - si, d[j][1] - dj)
        so, do = s[i][0] + si, d[j][0] + dj
        last = out[-1] if out else None
        if last is not None and last.src_offset + last.nbytes == so and last.dst_offset + last.nbytes == do:
            out[-1] = Piece(last.src_offset, last.dst_offset, last.nbytes + n)
        else:
            out.append(Piece(so, do, n))
        si, dj = si + n, dj + n
        if si == s[i][1]:
            i, si = i + 1, 0
        if dj == d[j][1]:
            j, dj = j + 1, 0
    return out


def _load_engine_class() -> Any:
    # Mooncake reads its log level from MC_LOG_LEVEL when the engine starts: keep its
    # INFO/WARNING chatter (no RDMA device, tcp listening...) out of the daemon's log
    # unless the operator sets MC_LOG_LEVEL; errors still show
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    try:
        from mooncake.engine import TransferEngine  # type: ignore[import-untyped]
    except ImportError as e:
        raise TransferError(
            f"cannot import mooncake.engine ({e}): install the Python package `{_WHEEL}` "
            "and the system library libibverbs1 (apt-get install libibverbs1)"
        ) from e
    return TransferEngine


def preload_engine() -> bool:
    """Import Mooncake's engine module now (a worker calls this before it serves). The
    import holds the GIL for ~15-30 ms on this machine; the engine itself starts on first
    use (a fork's source publishing its weights, a P/D instance), and after the import
    that takes ~1 ms instead of ~20-30 ms of the source's stepping thread, measured as one
    late token of the stream it serves. False when Mooncake is not installed (the first
    use then raises as before)."""
    try:
        _load_engine_class()
        return True
    except TransferError:
        return False


# Mooncake protocols by device kind ("auto" in config): host memory over tcp, device
# memory over RDMA (cuda; nvlink where the CUDA wheel has it) or Ascend's HCCS/RoCE transport.
PROTOCOLS = ("tcp", "rdma", "nvlink", "ascend")
AUTO_PROTOCOL = {"cpu": "tcp", "cuda": "rdma", "npu": "ascend"}


def protocol_for(kind: str, configured: str = "auto") -> str:
    """The Mooncake protocol a worker of device `kind` uses (config devices.transfer_protocol)."""
    if configured == "auto":
        return AUTO_PROTOCOL.get(kind, "tcp")
    if configured not in PROTOCOLS:
        raise ValueError(f"transfer protocol {configured!r} is not one of auto, {', '.join(PROTOCOLS)}")
    return configured


def _thread_ids() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def lower_priority(tids: list[int], by: int) -> None:
    """Raise these threads' nice value by `by` (at most 19; Linux: nice is per thread), so
    they yield to the process's other threads whatever nice the process started with.
    Undoing it needs privileges, so only threads that never run our compute get this. A
    thread that ended meanwhile is skipped."""
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + by))
        except ProcessLookupError:
            pass


class GlobalRegionTransport:
    """One per worker process: a Mooncake TransferEngine (loopback TCP on cpu devices) with
    the pool's global region [base, base + nbytes) registered. Peers address it by `session`.

    Threading: every call holds an internal lock, so one thread may transfer while
    another steps the engine (Mooncake releases the GIL during a transfer); concurrent
    transfers from several threads are serialised, and close() waits for a running one.
    A transfer to a frozen peer fails after `stall_timeout_s` without progress."""

    def __init__(
        self, base: int, nbytes: int, kind: str = "cpu", host: str = "127.0.0.1", *, stall_timeout_s: int = 5,
        protocol: str = "auto", thread_nice: int = 0,
    ) -> None:
        """`thread_nice` > 0: the threads the engine starts (its socket and handshake
        threads, which copy every byte on tcp) run that much nicer than the process, so
        on a machine short of cores the process's own compute (a source's decode) goes
        first."""
        for name, v in (("base", base), ("nbytes", nbytes), ("stall_timeout_s", stall_timeout_s)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if kind != "cpu":
            raise TransferError(
                f"device-memory transfer (pool kind {kind!r}) needs the mooncake CUDA/NPU wheel; "
                f"the installed `{_WHEEL}` moves host memory only (kind 'cpu')"
            )
        if not isinstance(host, str) or not host:
            raise ValueError(f"host must be a non-empty str, got {host!r}")
        proto = protocol_for(kind, protocol)
        if proto != "tcp":
            raise TransferError(f"transfer protocol {proto!r} needs the mooncake CUDA/NPU wheel and its NICs; "
                                f"the installed `{_WHEEL}` moves host memory over tcp only")
        if isinstance(thread_nice, bool) or not isinstance(thread_nice, int) or not 0 <= thread_nice <= 19:
            raise ValueError(f"thread_nice must be an int in 0..19, got {thread_nice!r}")
        engine_cls = _load_engine_class()
        os.environ.setdefault(_STALL_ENV, str(stall_timeout_s))
        self._lock = threading.Lock()
        before = _thread_ids()
        self._te = engine_cls()
        rc = self._te.initialize(host, "P2PHANDSHAKE", proto, "")
        if rc != 0:
            raise TransferError(f"mooncake TransferEngine.initialize({host!r}, P2PHANDSHAKE, {proto}) returned {rc}")
        rc = self._te.register_memory(base, nbytes)
        if rc != 0:
            raise TransferError(f"mooncake register_memory(base={base:#x}, nbytes={nbytes}) returned {rc}")
        self.base = base
        self.nbytes = nbytes
        self.kind = kind
        self.session = f"{host}:{self._te.get_rpc_port()}"
        # threads born while the engine started, less Python's own (one may have started meanwhile)
        self.engine_threads = sorted(_thread_ids() - before - {t.native_id for t in threading.enumerate()})
        if thread_nice:
            lower_priority(self.engine_threads, thread_nice)
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _plan(self, peer: Any, peer_base: Any, pieces: Any, local_side: str) -> tuple[list[int], list[int], list[int]]:
        """Validate everything before touching anything; return (local, remote, lengths)."""
        if not isinstance(peer, str) or peer.rpartition(":")[0] == "" or not peer.rpartition(":")[2].isdigit():
            raise ValueError(f"peer must be a session 'host:port', got {peer!r}")
        if isinstance(peer_base, bool) or not isinstance(peer_base, int) or peer_base <= 0:
            raise ValueError(f"peer_base must be a positive int (the peer's global base), got {peer_base!r}")
        if not isinstance(pieces, (list, tuple)):
            raise ValueError(f"pieces must be a list of Piece, got {type(pieces).__name__}")
        local, remote, lengths = [], [], []
        for i, p in enumerate(pieces):
            if not isinstance(p, Piece):
                raise ValueError(f"pieces[{i}]: expected a Piece, got {p!r}")
            for name in ("src_offset", "dst_offset", "nbytes"):
                v = getattr(p, name)
                if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "nbytes" else 0):
                    raise ValueError(f"pieces[{i}].{name} must be an int >= {1 if name == 'nbytes' else 0}, got {v!r}")
            mine, theirs = (p.dst_offset, p.src_offset) if local_side == "dst" else (p.src_offset, p.dst_offset)
            if mine + p.nbytes > self.nbytes:
                raise ValueError(
                    f"pieces[{i}]: local {local_side}_offset range [{mine}, {mine + p.nbytes}) is outside "
                    f"the registered global region [0, {self.nbytes})"
                )
            local.append(self.base + mine)
            remote.append(peer_base + theirs)
            lengths.append(p.nbytes)
        return local, remote, lengths

    def _run(self, op: str, peer: str, peer_base: int, pieces: list[Piece]) -> int:
        local, remote, lengths = self._plan(peer, peer_base, pieces, "dst" if op == "read" else "src")
        if not lengths:
            return 0
        with self._lock:
            if self._closed:
                raise TransferError("transport is closed")
            call = self._te.batch_transfer_sync_read if op == "read" else self._te.batch_transfer_sync_write
            rc = call(peer, local, remote, lengths)
        if rc != 0:
            raise TransferError(
                f"mooncake batch {op} of {len(lengths)} pieces ({sum(lengths)} bytes) with peer {peer} "
                f"(peer_base {peer_base:#x}) returned {rc}: peer gone, frozen past the stall timeout, "
                "or its range is outside its registered region"
            )
        return sum(lengths)

    def read(self, peer: str, peer_base: int, pieces: list[Piece]) -> int:
        """Copy peer's global bytes [peer_base + p.src_offset, +p.nbytes) into our region at
        base + p.dst_offset for every piece, in one batch; returns bytes moved. Every piece
        is checked against our region first (ValueError, nothing moved); a Mooncake failure
        is a TransferError naming the peer and the return code (the destination bytes are
        then unspecified)."""
        return self._run("read", peer, peer_base, pieces)

    def write(self, peer: str, peer_base: int, pieces: list[Piece]) -> int:
        """The mirror of read(): our bytes at base + p.src_offset to the peer's
        peer_base + p.dst_offset; returns bytes moved."""
        return self._run("write", peer, peer_base, pieces)

    def close(self) -> None:
        """Unregister the region (idempotent). The engine's threads live until process exit:
        Mooncake has no shutdown call, which is one more reason for one transport per process."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            rc = self._te.unregister_memory(self.base)
        if rc != 0:
            raise TransferError(f"mooncake unregister_memory(base={self.base:#x}) returned {rc}")

    def __enter__(self) -> GlobalRegionTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"GlobalRegionTransport(session={self.session!r}, base={self.base:#x}, nbytes={self.nbytes}, {state})"

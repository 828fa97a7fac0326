"""Moving a model's weights between a device weight segment and host memory (PAPER.md §8).

A Warm model keeps a `HostCopy`: its weight segment's bytes in one host buffer
(page-locked on cuda/npu, so H2D copies run asynchronously; a plain host buffer outside
the device pool on cpu) plus everything a restore needs without re-parsing the
checkpoint: the opened Checkpoint (architecture, tensor table, tokenizer with its chat
template, EOS ids), the weight plan (each tensor's offset in the segment) and the model's
config. A restore reserves a fresh segment, copies the bytes in large chunks with
several in flight (`chunked_copy`), and rebuilds the views over the new segment: the
layout is the plan's, so the views are the same tensors at the same offsets and a
greedy generation after a restore is token for token the one before.

Why chunks in flight: one copy call is one memcpy on one core (cpu) or one DMA queue
(cuda); large chunks on several threads, or several async copies on a copy stream, keep
the memory system busy. `janus bench restore` compares the result with a plain copy of
the same bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from janusd.engine.types import EngineError

SMALL_SPAN = 8 << 20  # the smallest chunk a copy is cut into for its streams
LANDING_SPAN = 16 << 20  # the largest piece of an overlapped restore (Copier.copy_in_order)


@dataclass
class HostCopy:
    """What a Warm model keeps on the worker (see the module docs)."""

    name: str
    model_cfg: Any  # config.ModelConfig
    engine_cfg: Any  # config.EngineConfig
    checkpoint: Any  # engine.checkpoint.base.Checkpoint: arch, tensor table, tokenizer, EOS ids
    plan: Any  # engine.models.weights.WeightPlan: where each tensor lives in the segment
    buf: torch.Tensor | None  # uint8, plan.total_bytes long, on the host (None: read `file`)
    pinned: bool = False
    file: Path | None = None  # a Cold start: the converted image's weights, read straight in
    made_at: float = field(default_factory=time.monotonic)
    shard: Any = None  # a tp shard's (engine/tp/shard.py TPShard: its layout, its group): restored as one

    @property
    def nbytes(self) -> int:
        return int(self.plan.total_bytes)


def host_buffer(nbytes: int, kind: str) -> tuple[torch.Tensor, bool]:
    """(buffer, pinned): page-locked on cuda/npu, so H2D copies can be asynchronous; a
    plain host buffer on cpu (the device pool is host memory already). A page-locked
    allocation that fails is an EngineError, never a silent fall back to pageable memory."""
    if kind == "cpu":
        return torch.empty(nbytes, dtype=torch.uint8), False
    try:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), True
    except RuntimeError as e:
        raise EngineError(f"cannot allocate {nbytes} bytes of page-locked host memory for a host copy: {e}") from None


class Copier:
    """Chunked copies with several in flight: `streams` threads on cpu (torch's copy
    releases the GIL), async copies on one copy stream on cuda/npu. One per worker."""

    def __init__(self, streams: int = 4, chunk_bytes: int = 64 << 20) -> None:
        if streams < 1 or chunk_bytes < 1:
            raise EngineError(f"copy streams ({streams}) and chunk size ({chunk_bytes}) must be positive")
        self.streams = streams
        self.chunk_bytes = chunk_bytes
        self._pool: ThreadPoolExecutor | None = None
        self._landing_pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.streams, thread_name_prefix="janusd-copy")
            return self._pool

    def _landing_executor(self) -> ThreadPoolExecutor:
        """ONE thread for overlapped restores (copy_in_order): the forward runs on the
        worker's own thread(s) meanwhile, and one memcpy thread already moves bytes at the
        machine's copy bandwidth when it is quiet (2 GiB: one memcpy 0.143 s, four threads
        0.153 s; bench/RESULTS.md "restore"), so more threads would only take the forward's
        core. Not niced: the
        forward waits for these bytes, so they are on the request's critical path (niced,
        other processes' work starved them: a 0.5 GB copy took 0.25 s instead of 0.05 s)."""
        with self._lock:
            if self._landing_pool is None:
                self._landing_pool = ThreadPoolExecutor(1, thread_name_prefix="janusd-landing")
            return self._landing_pool

    def span_bytes(self, n: int) -> int:
        """The chunk for an n-byte copy: `chunk_bytes`, but small copies are cut into one
        chunk per stream (at least SMALL_SPAN), so a 64 MiB restore with 64 MiB chunks
        is not one memcpy on one core while the other cores idle."""
        per_stream = -(-n // self.streams)
        return max(1, min(self.chunk_bytes, max(SMALL_SPAN, -(-per_stream // SMALL_SPAN) * SMALL_SPAN)))

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> float:
        """dst[:] = src (1-D uint8 of the same length); returns the seconds it took."""
        if dst.numel() != src.numel() or dst.dtype != torch.uint8 or src.dtype != torch.uint8:
            raise EngineError(f"copy of {src.numel()} bytes into {dst.numel()}: sizes or dtypes differ")
        t0 = time.perf_counter()
        n = dst.numel()
        cuts = list(range(0, n, self.span_bytes(n))) + [n]
        spans = list(zip(cuts, cuts[1:]))
        if dst.device.type == "cpu" and src.device.type == "cpu":
            if len(spans) == 1 or self.streams == 1:
                for a, b in spans:
                    dst[a:b].copy_(src[a:b])
            else:
                list(self._executor().map(lambda ab: dst[ab[0]:ab[1]].copy_(src[ab[0]:ab[1]]), spans))
        else:  # an accelerator on one side: async copies on a copy stream, then wait for them
            dev = dst.device if dst.device.type != "cpu" else src.device
            mod = torch.cuda if dev.type == "cuda" else getattr(torch, dev.type)
            stream = mod.Stream(device=dev)
            with mod.stream(stream):
                for a, b in spans:
                    dst[a:b].copy_(src[a:b], non_blocking=True)
            stream.synchronize()
        return time.perf_counter() - t0

    def read_file(self, dst: torch.Tensor, path: Path) -> float:
        """dst[:] = the first dst.numel() bytes of the file: chunks read straight into dst
        with several reads in flight (pread on cpu; through a page-locked bounce buffer and
        an async copy on cuda/npu). Returns the seconds it took."""
        t0 = time.perf_counter()
        n = dst.numel()
        if dst.device.type != "cpu":
            mapped = torch.from_file(str(path), shared=False, size=n, dtype=torch.uint8)
            self.copy(dst, mapped)
            return time.perf_counter() - t0
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size < n:
                raise EngineError(f"{path}: {os.fstat(fd).st_size} bytes, expected at least {n}")
            view = memoryview(dst.numpy())  # type: ignore[arg-type]

            span = self.span_bytes(n)

            def read(a: int) -> None:
                end = min(a + span, n)
                while a < end:  # pread may return short
                    got = os.preadv(fd, [view[a:end]], a)
                    if got <= 0:
                        raise EngineError(f"{path}: unexpected end of file at byte {a}")
                    a += got

            list(self._executor().map(read, range(0, n, span)))
        finally:
            os.close(fd)
        return time.perf_counter() - t0

    def copy_in_order(self, dst: torch.Tensor, src: torch.Tensor, groups: list[list[tuple[int, int]]]) -> Landing:
        """Start dst[a:b] = src[a:b] for every (a, b) of every group, in group order, and
        return at once: the Landing says when each group's bytes are in (the forward waits
        per layer, engine/models/llama.py). The groups must cover all of dst (weights.py
        landing_groups). cpu only: on cuda/npu the forward would wait on copy-stream events
        per layer instead, which is not built (restore_model copies whole there)."""
        if dst.numel() != src.numel() or dst.dtype != torch.uint8 or src.dtype != torch.uint8:
            raise EngineError(f"copy of {src.numel()} bytes into {dst.numel()}: sizes or dtypes differ")
        if dst.device.type != "cpu" or src.device.type != "cpu":
            raise EngineError("an overlapped restore runs on cpu devices only")
        landing = Landing([len(_cut(g, LANDING_SPAN)) for g in groups])
        pool = self._landing_executor()
        for i, g in enumerate(groups):
            for a, b in _cut(g, LANDING_SPAN):
                pool.submit(landing.run, i, lambda a=a, b=b: dst[a:b].copy_(src[a:b]))
        return landing

    def close(self) -> None:
        with self._lock:
            for pool in (self._pool, self._landing_pool):
                if pool is not None:
                    pool.shutdown(wait=False)
            self._pool = self._landing_pool = None


def _cut(ranges: list[tuple[int, int]], most: int) -> list[tuple[int, int]]:
    """(a, b) byte ranges cut into pieces of at most `most` bytes."""
    return [(x, min(x + most, b)) for a, b in ranges for x in range(a, b, most)]


class Landing:
    """A weight segment filling group by group (Copier.copy_in_order): `wait(i)` returns
    once group i's bytes are all in, `wait_all()` once every group's are. A copy that
    failed makes every wait raise EngineError (the model cannot run on half its weights).
    Why: a request that wakes a Warm model starts its prefill while the later layers are
    still copied (a 9-token prefill of SmolLM2 takes about as long as its 0.5 GB copy),
    instead of after the whole copy."""

    def __init__(self, pieces: list[int]) -> None:
        self._left = list(pieces)
        self._events = [threading.Event() for _ in pieces]
        self._lock = threading.Lock()
        self._error: str | None = None
        self._t0 = time.perf_counter()
        self.seconds: float | None = None  # from the start to the last byte in (None: not yet)
        for i, n in enumerate(pieces):
            if n == 0:
                self._events[i].set()
        self._finish_if_done()

    def run(self, group: int, move: Any) -> None:
        """Move one piece of `group` (on a copy thread) and count it in."""
        try:
            move()
        except BaseException as e:  # noqa: BLE001 - the waiters raise it (wait), never this copy thread
            with self._lock:
                self._error = self._error or f"{type(e).__name__}: {e}"
        with self._lock:  # a failed piece counts as finished too: nothing writes the segment after wait_all
            self._left[group] -= 1
            landed = self._left[group] == 0
        if landed:
            self._events[group].set()
            self._finish_if_done()

    def _finish_if_done(self) -> None:
        with self._lock:
            if self.seconds is None and not any(self._left):
                self.seconds = time.perf_counter() - self._t0

    @property
    def done(self) -> bool:
        return all(ev.is_set() for ev in self._events)

    def wait(self, group: int) -> None:
        """Until group i's pieces have all finished; EngineError if any piece failed."""
        self._events[group].wait()
        if self._error is not None:
            raise EngineError(f"restoring the weights failed: {self._error}")

    def wait_all(self, check: bool = True) -> None:
        """Until no piece is being written any more; `check`: raise if one failed."""
        for ev in self._events:
            ev.wait()
        if check and self._error is not None:
            raise EngineError(f"restoring the weights failed: {self._error}")


def wait_landed(model: Any) -> None:
    """Return once no copy writes `model`'s segment any more (a LlamaModel, or None):
    before anything but the forward reads or frees the segment (copying it out, freeing
    it). A failed copy is not raised here: the segment is being freed or its bytes are
    checked by the reader (a fork verifies checksums)."""
    landing = getattr(model, "landing", None)
    if landing is not None:
        landing.wait_all(check=False)


def trim_heap() -> None:
    """Hand the C heap's free memory back to the OS (glibc malloc_trim): what a checkpoint
    read or a host copy left in the allocator's free lists would otherwise stay in RSS."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def plain_view(buf: torch.Tensor) -> Any:
    """A `view(offset, shape, dtype)` function over a host byte buffer (a host copy)."""
    import math

    def view(offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        elt = torch.empty((), dtype=dtype).element_size()
        return buf[offset: offset + math.prod(shape) * elt].view(dtype).view(shape)

    return view


def sync_device(device: torch.device) -> None:
    """Wait until no kernel of this process still runs on the device (before its memory
    is freed): cuda/npu synchronise; cpu steps run on the caller's thread, already done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        with contextlib.suppress(AttributeError):
            torch.npu.synchronize(device)  # type: ignore[attr-defined]

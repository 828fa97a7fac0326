"""The worker's lifecycle half: SetState (Active / Warm / Cold) and PublishWeights (a
fork's source), beside the engine loop of engine/worker.py (PAPER.md §8).

The main thread only does what must not race a step: it detaches a model that leaves
Active (no step touches it after that), registers one that arrives, and swaps host
copies. Everything that moves bytes (the D2H copy into a host copy, the H2D restore, the
checkpoint read, the D2D pull over Mooncake, freeing pages) runs on a lifecycle thread
and comes back through the inbox as `Done`, so co-located models keep stepping while a
neighbour changes state (tests/test_lifecycle_daemon.py measures that).

Activation picks its source in the order the daemon planned it: a D2D fork when the
SetState names a source (falling back on its own, to the host copy or the checkpoint,
when the pull fails or does not verify), else the host copy (H2D), else the checkpoint.
Cold starts read the converted image (engine/host_image.py) straight into the segment.
Before answering it runs one greedy token through the new instance (the `first_token`
phase): an instance reported Active has produced a token.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from janusd.wire import worker_msgs as wm


def _log(msg: str) -> None:
    print(f"janusd-worker[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


# a restored model's host copy is freed when the worker idles this long after the activation (its
# waking request has arrived and stepped by then), at the latest after FREE_DEFER_S
FREE_GRACE_S = 0.25
FREE_DEFER_S = 2.0


class Done(msgspec.Struct):
    """A lifecycle thread's result, applied on the main thread."""

    msg: Any  # the SetState
    engine: Any = None  # a model to register (activation)
    host: Any = None  # a host copy to keep (warm)
    error: str = ""
    path: str = "none"
    fallback: str = ""
    nbytes: int = 0
    phases: dict[str, float] = {}


def _drop(box: list[Any], trim: bool = True) -> None:
    """Free what `box` holds on this thread (its last reference), then (trim) trim the heap.
    No trim after an activation: a host copy is one mapping, unmapped as it is freed, and
    malloc_trim holds the allocator's lock for ~0.1 s, so the main thread's first step of
    the model just restored waited for it (measured: Generate handled 107 ms late)."""
    from janusd.engine.restore import trim_heap

    box.clear()
    if trim:
        trim_heap()


def layout_signature(plan: Any) -> str:
    """The weight plan's identity: every tensor's offset and shape, the dtype and the
    size. A fork copies bytes, so source and target must lay them out identically."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{plan.dtype}|{plan.total_bytes}".encode())
    for name in sorted(plan.slots):
        s = plan.slots[name]
        h.update(f"|{name}:{s.offset}:{s.shape}:{s.parent}:{s.row0}".encode())
    return h.hexdigest()


def sample_blocks(nbytes: int, count: int, block: int) -> list[tuple[int, int]]:
    """`count` blocks of `block` bytes spread evenly over [0, nbytes), first and last included."""
    if nbytes <= 0 or count <= 0:
        return []
    block = min(block, nbytes)
    if count == 1:
        return [(0, block)]
    span = nbytes - block
    starts = sorted({span * i // (count - 1) for i in range(count)})
    return [(s, block) for s in starts]


def checksums(buf: Any, blocks: list[tuple[int, int]]) -> list[tuple[int, int, str]]:
    out = []
    for off, n in blocks:
        out.append((off, n, hashlib.blake2b(buf[off: off + n].cpu().numpy().tobytes(), digest_size=16).hexdigest()))
    return out


def first_token(me: Any) -> float:
    """Seconds for one greedy token of a short prompt on a built (unregistered) model."""
    from janusd.engine.types import SamplingParams

    t0 = time.perf_counter()
    rid = "__first_token"
    me.add_request(rid, [1, 2, 3, 4], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    errors = []
    while me.has_work():
        errors += [o.error for o in me.step() if o.error]
    me.abort(rid)
    if errors:
        from janusd.engine.types import EngineError

        raise EngineError(f"the restored model cannot produce a token: {errors[0]}")
    return time.perf_counter() - t0


class Lifecycle:
    def __init__(self, de: Any, inbox: Any, pd: Any, send: Callable[[Any], None],
                 drop_requests: Callable[[str, str], None]) -> None:
        """`drop_requests(model, why)`: the worker fails the requests it relays for a model
        that leaves Active here (the daemon drained it first; what is left was aborted)."""
        from janusd.engine.restore import Copier

        self.de = de
        self.inbox = inbox
        self.pd = pd
        self.send = send
        self.drop_requests = drop_requests
        self.copier = Copier()
        self.busy: set[str] = set()  # models with a SetState in progress
        # Cold models' tokenizers, by model: (image dir, Tokenizer); see _keep_tokenizer
        self.tokenizers: dict[str, tuple[Path, Any]] = {}
        self._freeing: list[tuple[float, Any]] = []  # (activated at, host copy) of models now Active

    # ---- main thread ----
    def set_state(self, msg: wm.SetState) -> None:
        from janusd.engine.restore import Copier

        name = msg.model.name
        if name in self.busy:
            self.send(wm.ErrorReply(msg.seq, f"model {name!r} is already changing state on this worker", "bad_request"))
            return
        lc = msg.lifecycle
        if (self.copier.streams, self.copier.chunk_bytes) != (lc.copy_streams, lc.copy_chunk_mib << 20):
            self.copier.close()
            self.copier = Copier(lc.copy_streams, lc.copy_chunk_mib << 20)
        active = name in self.de.models
        if msg.target == "active":
            if active:
                self.send(wm.StateSet(msg.seq, name, "active"))
                return
            self._spawn(self._activate, msg)
        elif active:  # Active -> Warm / Cold: no step may touch it from here on
            self.drop_requests(name, f"model {name!r} left Active on this worker")
            me = self.de.detach(name)
            self._spawn(self._leave, msg, me)
        elif msg.target == "warm":
            if name in self.de.host:
                self.send(wm.StateSet(msg.seq, name, "warm"))
            else:
                self._spawn(self._stage, msg)
        else:  # cold: drop the host copy, if any (off this thread: co-located models keep stepping)
            host = self.de.host.pop(name, None)
            self.send(wm.StateSet(msg.seq, name, "cold"))
            if host is not None:
                self._keep_tokenizer(msg, host.checkpoint)
                threading.Thread(target=_drop, args=([host],), name="janusd-free-host-copy", daemon=True).start()
                del host
            self.prefetch_image(msg)

    def done(self, d: Done) -> None:
        name = d.msg.model.name
        self.busy.discard(name)
        if d.error:
            self.send(wm.ErrorReply(d.msg.seq, d.error, "internal"))
            return
        if d.engine is not None:
            me = self.de.register(d.engine)
            self.send(wm.StateSet(d.msg.seq, name, "active", d.path, d.nbytes, d.phases, d.fallback,
                                  int(me.max_model_len), [int(t) for t in me.eos_token_ids]))
            host = self.de.host.pop(name, None)  # Active holds device memory only
            if host is not None:  # once the first requests ran (see reap)
                self._freeing.append((time.monotonic(), host))
                del host
            return
        if d.host is not None:
            self.de.host[name] = d.host
        else:
            self.de.host.pop(name, None)
        self.send(wm.StateSet(d.msg.seq, name, d.msg.target, d.path, d.nbytes, d.phases))

    def reap(self, idle: bool) -> None:
        """Free the host copies of models that went Active, on a thread, once this worker
        idles FREE_GRACE_S after the activation, at the latest FREE_DEFER_S after it.
        Freeing 0.5 GB (munmap) took 0.1-0.15 s of CPU and stalls; right after the answer
        it ran during the restored model's first step, the very request that woke it
        (measured: its first token 0.12-0.15 s later). Call from the main loop."""
        if not self._freeing:
            return
        now = time.monotonic()
        due = lambda t: now - t >= (FREE_GRACE_S if idle else FREE_DEFER_S)  # noqa: E731
        free = [h for t, h in self._freeing if due(t)]
        if free:
            self._freeing = [(t, h) for t, h in self._freeing if not due(t)]
            threading.Thread(target=_drop, args=(free, False), name="janusd-free-host-copy", daemon=True).start()

    def reap_wait(self) -> float:
        """Seconds until an idle worker should call reap() again (0.5 when nothing waits)."""
        if not self._freeing:
            return 0.5
        return max(0.0, min(t for t, _ in self._freeing) + FREE_GRACE_S - time.monotonic())

    def publish(self, msg: wm.PublishWeights) -> Any:
        """A fork's source: where our weight segment is, with sampled-block checksums."""
        me = self.de.models.get(msg.name)
        if me is None:
            return wm.ErrorReply(msg.seq, f"model {msg.name!r} is not active on this worker", "bad_request")
        try:
            self.pd.ensure()  # the global region registered with Mooncake (once per worker)
        except Exception as e:
            return wm.ErrorReply(msg.seq, f"cannot serve a fork: the transfer engine failed: {e}", "internal")
        landing = me.model.landing  # restored overlapped and still landing: publish whole bytes only
        if landing is not None:
            try:
                landing.wait_all()
            except Exception as e:
                return wm.ErrorReply(msg.seq, f"cannot serve a fork: {e}", "internal")
        pl = me.placement
        n = pl.plan.total_bytes
        blocks = sample_blocks(n, msg.verify_blocks, msg.verify_block_bytes)
        src = wm.ForkSource(self.pd.transport.session, int(self.de.pool.global_base), pl.segment.global_pieces(n), n,
                            layout_signature(pl.plan), checksums(pl.segment.tensor(), blocks))
        return wm.WeightsPublished(msg.seq, msg.name, src)

    def _spawn(self, fn: Callable[..., Done], *args: Any) -> None:
        msg = args[0]
        self.busy.add(msg.model.name)

        def run() -> None:
            try:
                d = fn(*args)
            except Exception as e:
                _log(f"{msg.target} of {msg.model.name} failed:\n" + traceback.format_exc())
                d = Done(msg, error=f"cannot make {msg.model.name!r} {msg.target}: {e}")
            self.inbox.put(d)

        threading.Thread(target=run, name=f"janusd-{msg.target}-{msg.model.name}", daemon=True).start()

    # ---- lifecycle threads ----
    def _image_root(self, msg: wm.SetState | wm.LoadModel) -> Path | None:
        """Where the converted host image of the model's checkpoint lives (None: not kept)."""
        if not msg.lifecycle.host_image or not msg.cache_dir:
            return None
        from janusd.engine.host_image import image_dir
        from janusd.engine.loader import checkpoint_path

        cache = Path(msg.cache_dir)
        return image_dir(cache, checkpoint_path(msg.model.checkpoint, cache), msg.model.dtype)

    def _keep_image(self, msg: wm.SetState, ck: Any, plan: Any, data: Any) -> None:
        root = self._image_root(msg)
        if root is not None and not (root / "meta.msgpack").exists():
            from janusd.engine.host_image import write_image

            if write_image(root, ck, plan, layout_signature(plan), msg.model.dtype, data):
                _log(f"wrote the host image of {msg.model.name} ({plan.total_bytes} bytes) to {root}")

    def _keep_tokenizer(self, msg: wm.SetState, ck: Any) -> None:
        """A model going Cold here keeps its tokenizer (`lifecycle.cold_keeps_tokenizer`):
        building it again from the image's JSON holds the GIL for 0.2-0.4 s for SmolLM2's
        BPE (the weights read and every co-located model's steps wait), most of a Cold
        start; it costs ~40 MB of host memory, none of it weights."""
        root = self._image_root(msg)
        built = getattr(ck, "built_tokenizer", None)  # an image's may still be building: never wait for it
        tok = built() if built is not None else ck.tokenizer
        if msg.lifecycle.cold_keeps_tokenizer and root is not None and tok is not None:
            self.tokenizers[msg.model.name] = (root, tok)
        else:
            self.tokenizers.pop(msg.model.name, None)

    def prefetch_image(self, msg: wm.SetState | wm.LoadModel) -> None:
        """A model loaded here, or going Cold here (`lifecycle.cold_prefetch_image`): have
        the kernel read its host image, if there is one, into the page cache now, so that a
        Cold start reads memory. An image written in an earlier run, or evicted since, was
        read from the disk by the first Cold start: 0.09-0.74 s for SmolLM2 on this VM
        against 0.02-0.03 s cached; the reads take as long, so starting them only as the
        model goes Cold left a Cold start 0.5 s later waiting for the disk (0.1-0.14 s of
        its read). On a thread of its own, niced (queuing the reads is ~50 ms of kernel time)."""
        if not msg.lifecycle.cold_prefetch_image:
            return

        def run() -> None:
            from janusd.engine.host_image import prefetch
            from janusd.lifecycle.transfer import lower_priority

            lower_priority([threading.get_native_id()], 10)
            root = self._image_root(msg)
            if root is not None and (root / "meta.msgpack").exists():
                prefetch(root)

        threading.Thread(target=run, name="janusd-prefetch-image", daemon=True).start()

    def forget(self, name: str) -> None:
        """The model is unloaded or removed here: nothing of it stays."""
        self.tokenizers.pop(name, None)

    def _from_image(self, msg: wm.SetState) -> Any:
        """A HostCopy that reads the image's weights file (None when there is no image)."""
        root = self._image_root(msg)
        if root is None:
            return None
        from janusd.engine.host_image import open_image
        from janusd.engine.models.weights import plan_weights
        from janusd.engine.restore import HostCopy
        from janusd.engine.runner import torch_dtype

        kept_root, kept = self.tokenizers.get(msg.model.name, (None, None))
        # the kept tokenizer (same image: same checkpoint and dtype), else built while the weights are read
        ck = open_image(root, background=True, tokenizer=kept if kept_root == root else None)
        if ck is None:
            return None
        plan = plan_weights(ck.arch, ck.tensor_specs(), torch_dtype(msg.model.dtype))
        if layout_signature(plan) != ck.meta.layout:
            return None
        return HostCopy(msg.model.name, msg.model, msg.engine, ck, plan, None, file=ck.root / "weights.bin")

    def _leave(self, msg: wm.SetState, me: Any) -> Done:
        from janusd.engine.restore import wait_landed

        t0 = time.perf_counter()
        wait_landed(me.model)  # restored overlapped: every byte in before any is copied out
        keep = msg.target == "warm"
        if not keep:  # the last chance to keep a converted image of what leaves the device
            pl = me.placement
            self._keep_image(msg, me.checkpoint, pl.plan, pl.segment.tensor())
            self._keep_tokenizer(msg, me.checkpoint)
            self.prefetch_image(msg)
        try:
            host, copy_s = self.de.release(me, self.copier, keep_host=keep)
        except Exception:  # e.g. no host memory for the copy: free the device side anyway (nothing half-held)
            with contextlib.suppress(Exception):
                self.de.release(me, None, keep_host=False)
            raise
        if host is not None:
            self._keep_image(msg, host.checkpoint, host.plan, host.buf)
        total = time.perf_counter() - t0
        return Done(msg, host=host, path="d2h" if keep else "none", nbytes=host.nbytes if host else 0,
                    phases={"transfer": copy_s, "restore": max(0.0, total - copy_s)})

    def _stage(self, msg: wm.SetState) -> Done:
        """Cold -> Warm: the host copy from the image (a file copy) or the checkpoint."""
        from janusd.engine.restore import HostCopy, host_buffer

        t0 = time.perf_counter()
        mapped = self._from_image(msg)
        if mapped is not None:
            buf, pinned = host_buffer(mapped.nbytes, self.de.kind)
            assert mapped.file is not None
            self.copier.read_file(buf, mapped.file)
            host = HostCopy(mapped.name, msg.model, msg.engine, mapped.checkpoint, mapped.plan, buf, pinned)
            del mapped
            path = "image"
        else:
            host = self.de.stage_host_copy(msg.model, msg.engine, Path(msg.cache_dir) if msg.cache_dir else None)
            self._keep_image(msg, host.checkpoint, host.plan, host.buf)
            path = "checkpoint"
        return Done(msg, host=host, path=path, nbytes=host.nbytes, phases={"transfer": time.perf_counter() - t0})

    def _activate(self, msg: wm.SetState) -> Done:
        name = msg.model.name
        if msg.model.prefill_devices:  # a P/D instance moves KV over the transfer engine, as a load's does
            self.pd.ensure()
        phases: dict[str, float] = {}
        host = self.de.host.get(name)
        me = None
        path = fallback = ""
        if msg.fork is not None:
            if self.pd.thread_nice:  # this thread's pull, checksums and probe yield to the worker's steps
                from janusd.lifecycle.transfer import lower_priority

                lower_priority([threading.get_native_id()], self.pd.thread_nice)
            try:
                me = self._pull(msg, host, phases)
                path = "d2d"
            except Exception as e:  # a dead or frozen source, a bad checksum: fall back on our own
                fallback = f"{type(e).__name__}: {e}"
                _log(f"fork of {name} failed, falling back to {'H2D' if host else 'a cold start'}: {fallback}")
                phases.clear()
        if me is None and host is not None:  # SetState's role; a waking request (no probe) may start while the bytes land
            me = self.de.restore_model(host, self.copier, phases, msg.model, msg.engine,
                                       overlap=msg.lifecycle.overlap_restore and not msg.probe)
            path = "h2d"
        if me is None:  # Cold: the converted image, else the checkpoint read into a host copy; then H2D
            from janusd.engine.checkpoint.base import CheckpointError

            t0 = time.perf_counter()
            src = self._from_image(msg)
            path = "image"
            opened = time.perf_counter() - t0
            if src is not None:
                try:
                    me = self.de.restore_model(src, self.copier, phases)
                except CheckpointError as e:  # its tokenizer did not build: drop it, convert the checkpoint again
                    _log(f"the host image of {name} is unusable, reading the checkpoint: {e}")
                    shutil.rmtree(src.checkpoint.root, ignore_errors=True)
                    phases.clear()
                    t0 = time.perf_counter()
            if me is None:
                src = self.de.stage_host_copy(msg.model, msg.engine, Path(msg.cache_dir) if msg.cache_dir else None)
                self._keep_image(msg, src.checkpoint, src.plan, src.buf)
                path = "checkpoint"
                opened = time.perf_counter() - t0
                me = self.de.restore_model(src, self.copier, phases)
            phases["prepare"] = phases.get("prepare", 0.0) + opened
            del src  # a temporary host copy, if any: a Cold start keeps no host memory
        try:
            if msg.probe:  # a request waiting for this instance is its own first token
                phases["first_token"] = first_token(me)
        except Exception:
            self.de.release(me, None, keep_host=False)
            with self.de._lock:
                self.de._building.discard(name)
            raise
        return Done(msg, engine=me, path=path, fallback=fallback, nbytes=int(me.weight_bytes), phases=phases)

    def _pull(self, msg: wm.SetState, host: Any, phases: dict[str, float]) -> Any:
        """D2D: reserve our segment, read the source's bytes into it over Mooncake (many
        pieces in one batch: several transfers in flight), verify sizes and the sampled
        checksums, rebuild the views."""
        from janusd.engine.loader import open_checkpoint
        from janusd.engine.models.weights import materialize, plan_weights
        from janusd.engine.runner import torch_dtype
        from janusd.engine.types import EngineError
        src = msg.fork
        assert src is not None
        t0 = time.perf_counter()
        if host is None:  # the tensor table and tokenizer from the image when there is one
            host = self._from_image(msg)
        if host is not None:
            ck, plan = host.checkpoint, host.plan
        else:
            ck = open_checkpoint(msg.model.checkpoint, Path(msg.cache_dir) if msg.cache_dir else None)
            plan = plan_weights(ck.arch, ck.tensor_specs(), torch_dtype(msg.model.dtype))
        if layout_signature(plan) != src.layout or plan.total_bytes != src.nbytes:
            raise EngineError(f"the source lays out {src.nbytes} bytes differently from this worker's "
                              f"{plan.total_bytes} (another dtype or checkpoint?)")
        self.pd.ensure()
        chunk = msg.lifecycle.copy_chunk_mib << 20
        marks: dict[str, float] = {}

        def fill(seg: Any) -> Any:
            t1 = time.perf_counter()
            marks["prepare"] = t1 - t0
            pull_segment(self.pd.transport, src, seg, chunk, msg.lifecycle.fork_bandwidth_mib_s * float(1 << 20))
            marks["transfer"] = time.perf_counter() - t1
            marks["after"] = time.perf_counter()
            return materialize(plan, seg.view)

        with self.de._lock:
            if name_taken(self.de, msg.model.name):
                raise EngineError(f"model {msg.model.name!r} is already loaded on this device")
            self.de._building.add(msg.model.name)
        try:
            me = self.de._on_device(msg.model, msg.engine, ck, plan, fill)
        except BaseException:
            with self.de._lock:
                self.de._building.discard(msg.model.name)
            raise
        phases.update(prepare=marks.get("prepare", 0.0), transfer=marks.get("transfer", 0.0),
                      restore=time.perf_counter() - marks.get("after", t0))
        return me


def pull_segment(transport: Any, src: wm.ForkSource, seg: Any, chunk_bytes: int, max_bytes_per_s: float = 0.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> int:
    """Read the source's segment bytes into `seg` (ours, reserved) over the transport:
    the pieces paired by lifecycle/transfer.match_pieces, cut into `chunk_bytes` so one
    batch keeps several transfers in flight; then check the byte count and the sampled
    checksums. Raises EngineError (or TransferError) when either does not match.

    `max_bytes_per_s` > 0 paces the pull (lifecycle.fork_bandwidth_mib_s while the source
    serves): batches of at most a 20th of a second's worth, each started no earlier than
    the cap allows, so the source's own work gets the CPU (and, on a shared link, the
    bandwidth) between them."""
    from janusd.engine.types import EngineError
    from janusd.lifecycle.transfer import Piece, match_pieces

    if max_bytes_per_s > 0:
        chunk_bytes = max(1 << 20, min(chunk_bytes, int(max_bytes_per_s / 20)))
    pieces = []
    for p in match_pieces([(int(a), int(n)) for a, n in src.pieces], seg.global_pieces(src.nbytes)):
        for a in range(0, p.nbytes, chunk_bytes):
            pieces.append(Piece(p.src_offset + a, p.dst_offset + a, min(chunk_bytes, p.nbytes - a)))
    if max_bytes_per_s > 0:
        moved = 0
        t0 = clock()
        for p in pieces:
            wait = t0 + moved / max_bytes_per_s - clock()
            if wait > 0:
                sleep(wait)
            moved += transport.read(src.session, src.global_base, [p])
    else:
        moved = transport.read(src.session, src.global_base, pieces)
    if moved != src.nbytes:
        raise EngineError(f"fork moved {moved} bytes, expected {src.nbytes}")
    got = checksums(seg.tensor(), [(o, n) for o, n, _ in src.checksums])
    bad = [o for (o, _, h), (_, _, g) in zip(src.checksums, got) if h != g]
    if bad:
        raise EngineError(f"fork verification failed: {len(bad)} of {len(got)} sampled blocks differ "
                          f"(first at offset {bad[0]})")
    return moved


def name_taken(de: Any, name: str) -> bool:
    return name in de.models or name in de._building

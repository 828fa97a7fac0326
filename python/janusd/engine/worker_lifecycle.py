"""The worker's lifecycle half: SetState (Active / Warm / Cold) and PublishWeights (a
fork's source), beside the engine loop of engine/worker_proc.py (PAPER.md §8). The
fork's two ends are engine/worker_fork.py's, the host images engine/worker_images.py's.

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
import shutil
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from janusd.engine.worker_fork import publish, pull_model
from janusd.engine.worker_images import HostImages
from janusd.engine.worker_log import log
from janusd.wire import worker_msgs as wm

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
        self.images = HostImages(getattr(de, "kind", "cpu"))
        self._freeing: list[tuple[float, Any]] = []  # (activated at, host copy) of models now Active
        self.registered: Callable[[Any], None] = lambda me: None  # WorkerProc's: a tp follower follows it

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
                self.images.keep_tokenizer(msg, host.checkpoint)
                threading.Thread(target=_drop, args=([host],), name="janusd-free-host-copy", daemon=True).start()
                del host
            self.images.prefetch(msg)

    def done(self, d: Done) -> None:
        name = d.msg.model.name
        self.busy.discard(name)
        if d.error:
            self.send(wm.ErrorReply(d.msg.seq, d.error, "internal"))
            return
        if d.engine is not None:
            me = self.de.register(d.engine)
            self.registered(me)  # before the answer: the daemon activates a tp group's lead after its followers
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
        """A fork's source: where our weight segment is (engine/worker_fork.py)."""
        return publish(self.de, self.pd, msg)

    def _spawn(self, fn: Callable[..., Done], *args: Any) -> None:
        msg = args[0]
        self.busy.add(msg.model.name)

        def run() -> None:
            try:
                d = fn(*args)
            except Exception as e:
                log(f"{msg.target} of {msg.model.name} failed:\n" + traceback.format_exc())
                d = Done(msg, error=f"cannot make {msg.model.name!r} {msg.target}: {e}")
            self.inbox.put(d)

        threading.Thread(target=run, name=f"janusd-{msg.target}-{msg.model.name}", daemon=True).start()

    # ---- lifecycle threads ----
    def _leave(self, msg: wm.SetState, me: Any) -> Done:
        from janusd.engine.restore import wait_landed

        t0 = time.perf_counter()
        wait_landed(me.model)  # restored overlapped: every byte in before any is copied out
        keep = msg.target == "warm"
        whole = getattr(me.model, "shard", None) is None  # a tp shard's bytes are not the model's image
        if not keep and whole:  # the last chance to keep a converted image of what leaves the device
            pl = me.placement
            self.images.keep(msg, me.checkpoint, pl.plan, pl.segment.tensor())
            self.images.keep_tokenizer(msg, me.checkpoint)
            self.images.prefetch(msg)
        try:
            host, copy_s = self.de.release(me, self.copier, keep_host=keep)
        except Exception:  # e.g. no host memory for the copy: free the device side anyway (nothing half-held)
            with contextlib.suppress(Exception):
                self.de.release(me, None, keep_host=False)
            raise
        if host is not None and whole:
            self.images.keep(msg, host.checkpoint, host.plan, host.buf)
        total = time.perf_counter() - t0
        return Done(msg, host=host, path="d2h" if keep else "none", nbytes=host.nbytes if host else 0,
                    phases={"transfer": copy_s, "restore": max(0.0, total - copy_s)})

    def _stage(self, msg: wm.SetState) -> Done:
        """Cold -> Warm: the host copy from the image (a file copy) or the checkpoint."""
        from janusd.engine.restore import HostCopy, host_buffer

        if msg.model.tp > 1:
            from janusd.engine.types import EngineError

            raise EngineError(f"{msg.model.name!r} is a tp {msg.model.tp} shard: a host copy of a shard is made "
                              "only by leaving Active (Cold -> Warm shard by shard is not built)")
        t0 = time.perf_counter()
        mapped = self.images.open(msg)
        if mapped is not None:
            buf, pinned = host_buffer(mapped.nbytes, self.de.kind)
            assert mapped.file is not None
            self.copier.read_file(buf, mapped.file)
            host = HostCopy(mapped.name, msg.model, msg.engine, mapped.checkpoint, mapped.plan, buf, pinned)
            del mapped
            path = "image"
        else:
            host = self.de.stage_host_copy(msg.model, msg.engine, Path(msg.cache_dir) if msg.cache_dir else None)
            self.images.keep(msg, host.checkpoint, host.plan, host.buf)
            path = "checkpoint"
        return Done(msg, host=host, path=path, nbytes=host.nbytes, phases={"transfer": time.perf_counter() - t0})

    def _activate(self, msg: wm.SetState) -> Done:
        name = msg.model.name
        if msg.model.prefill_devices:  # a P/D instance moves KV over the transfer engine, as a load's does
            self.pd.ensure()
        phases: dict[str, float] = {}
        host = self.de.host.get(name)
        if msg.model.tp > 1:  # a tp shard: H2D from its own host copy, into its group (engine/worker_tp.py)
            return self._activate_shard(msg, host, phases)
        me = None
        path = fallback = ""
        if msg.fork is not None:
            if self.pd.thread_nice:  # this thread's pull, checksums and probe yield to the worker's steps
                from janusd.lifecycle.transfer import lower_priority

                lower_priority([threading.get_native_id()], self.pd.thread_nice)
            try:
                me = pull_model(self.de, self.pd, msg, host, phases, self.images.open)
                path = "d2d"
            except Exception as e:  # a dead or frozen source, a bad checksum: fall back on our own
                fallback = f"{type(e).__name__}: {e}"
                log(f"fork of {name} failed, falling back to {'H2D' if host else 'a cold start'}: {fallback}")
                phases.clear()
        if me is None and host is not None:  # SetState's role; a waking request (no probe) may start while the bytes land
            me = self.de.restore_model(host, self.copier, phases, msg.model, msg.engine,
                                       overlap=msg.lifecycle.overlap_restore and not msg.probe)
            path = "h2d"
        if me is None:  # Cold: the converted image, else the checkpoint read into a host copy; then H2D
            from janusd.engine.checkpoint.base import CheckpointError

            t0 = time.perf_counter()
            src = self.images.open(msg)
            path = "image"
            opened = time.perf_counter() - t0
            if src is not None:
                try:
                    me = self.de.restore_model(src, self.copier, phases)
                except CheckpointError as e:  # its tokenizer did not build: drop it, convert the checkpoint again
                    log(f"the host image of {name} is unusable, reading the checkpoint: {e}")
                    shutil.rmtree(src.checkpoint.root, ignore_errors=True)
                    phases.clear()
                    t0 = time.perf_counter()
            if me is None:
                src = self.de.stage_host_copy(msg.model, msg.engine, Path(msg.cache_dir) if msg.cache_dir else None)
                self.images.keep(msg, src.checkpoint, src.plan, src.buf)
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

    def _activate_shard(self, msg: wm.SetState, host: Any, phases: dict[str, float]) -> Done:
        """Warm -> Active of one shard of a tp group: its host copy back into this device's
        pool, in the group it left (the daemon restores the followers first, then the lead,
        whose probe steps the whole group). A Cold group is loaded again whole by the daemon."""
        from janusd.engine.types import EngineError

        name = msg.model.name
        if msg.fork is not None or host is None or host.shard is None:
            raise EngineError(f"{name!r} is a tp {msg.model.tp} shard: it comes back only from its own host copy "
                              "(Warm); a Cold group is loaded whole, and a group's D2D fork is a load whose shards "
                              "pull their source shards (LoadModel.fork)")
        me = self.de.restore_model(host, self.copier, phases, msg.model, msg.engine)
        comm = host.shard.comm
        me.tp_comm = comm
        if comm.rank == 0:
            from janusd.engine.tp.shard import LeaderLink, attach_leader

            attach_leader(me, LeaderLink(comm, 0))
        try:
            if msg.probe and comm.rank == 0:
                phases["first_token"] = first_token(me)
        except Exception:
            self.de.drop_built(me)
            raise
        return Done(msg, engine=me, path="h2d", nbytes=int(me.weight_bytes), phases=phases)

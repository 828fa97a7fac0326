"""Loading a model on a worker without stalling the models already serving there.

A LoadModel is built on a loader thread of its own (checkpoint read, weights copied into
its xTensor segment, a few timed prefills) while the main thread keeps stepping the models
already here; the result comes back through the inbox as `Built` and the main thread
registers it between steps (tests/test_worker_background_load.py measures that).
"""

from __future__ import annotations

import contextlib
import queue
import shutil
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from janusd.engine.worker_lifecycle import Lifecycle
from janusd.engine.worker_log import log
from janusd.engine.worker_pd import PDLink
from janusd.wire import worker_msgs as wm

# Prompt lengths the loader thread times on a new model before it serves (the first run
# only warms up). Short and long, so the daemon's a + b * tokens fit has both ends.
PROBE_TOKENS = (16, 16, 256)


class Built(msgspec.Struct):
    """A loader thread's result, handed to the main thread through the inbox."""

    msg: wm.LoadModel
    engine: Any
    error: str
    seconds: float
    probe: list[tuple[int, float]] = []


def prefill_probe(me: Any) -> list[tuple[int, float]]:
    """Time a few prefills of the built, not yet registered model on this thread: the
    daemon seeds its prefill estimate with them, so the first long prompt after a load is
    not judged by a guess (which rejected long prompts on an idle daemon)."""
    from janusd.engine.types import SamplingParams

    out: list[tuple[int, float]] = []
    limit = max(2, int(me.max_model_len) - 2)
    for k, n in enumerate(PROBE_TOKENS):
        n = min(n, limit)
        rid = f"__probe{k}"
        me.add_request(rid, [(7 * i + 3) % 97 + 1 for i in range(n)], SamplingParams(max_tokens=1, ignore_eos=True))
        seen = None
        while me.has_work():
            for o in me.step():
                if o.req_id == rid and o.prefill_s is not None:
                    seen = o.prefill_s
        me.abort(rid)
        if k > 0 and seen is not None:
            out.append((n, float(seen)))
    return out


class Loading:
    """WorkerProc's LoadModel part (a mixin). What it uses of WorkerProc, made in its
    constructor: the device engine, the inbox, the P/D link, the lifecycle half, _send."""

    de: Any
    inbox: queue.Queue[Any]
    pd: PDLink
    life: Lifecycle

    if TYPE_CHECKING:
        def _send(self, msg: Any) -> None: ...

        def build_shard(self, msg: wm.LoadModel) -> Any: ...

        def follow(self, name: str, me: Any) -> None: ...

    def _load(self, msg: wm.LoadModel) -> None:
        """Build the model on a loader thread so the models already here keep stepping;
        the main thread registers it when the build is done (a Built in the inbox)."""
        threading.Thread(target=self._build, args=(msg,), name=f"janusd-load-{msg.model.name}", daemon=True).start()

    def _build(self, msg: wm.LoadModel) -> None:
        t0 = time.perf_counter()
        try:
            if msg.tp is not None:  # a shard of a tp group (engine/worker_tp.py)
                me = self.build_shard(msg)
            else:
                me = self._from_image(msg)
                if me is None:
                    me = self.de.build_model(msg.model, msg.engine, Path(msg.cache_dir) if msg.cache_dir else None)
                    # the next start of this model (and its first Cold start) reads this instead
                    self.life.images.keep(msg, me.checkpoint, me.placement.plan, me.placement.segment.tensor())
        except Exception as e:
            log(f"loading {msg.model.name} failed:\n" + traceback.format_exc())
            self.inbox.put(Built(msg, None, f"cannot load {msg.model.name!r}: {e}", 0.0))
            return
        seconds = time.perf_counter() - t0
        if msg.tp is not None and msg.tp.rank > 0:  # a follower: registered for the record, then it follows
            self.inbox.put(Built(msg, me, "", seconds))
            self.follow(msg.model.name, me)
            return
        try:
            probe = prefill_probe(me)
        except Exception as e:  # a probe that fails must not fail the load; the daemon keeps its prior
            log(f"prefill probe of {msg.model.name} failed: {e}")
            probe = []
        self.inbox.put(Built(msg, me, "", seconds, probe))
        self.life.images.prefetch(msg)  # its image, if one exists, into the page cache for a later Cold start

    def _from_image(self, msg: wm.LoadModel) -> Any:
        """The model from its converted host image (engine/host_image.py) when one exists:
        the weights read straight into the segment, the tokenizer built from the image's
        JSON meanwhile, no checkpoint parsed (SmolLM2's GGUF metadata alone is ~3 s of
        Python and ~100 MB of the reader's objects); None without a usable image."""
        from janusd.engine.checkpoint.base import CheckpointError

        src = self.life.images.open(msg)
        if src is None:
            return None
        try:
            return self.de.restore_model(src, self.life.copier, {})
        except CheckpointError as e:  # its tokenizer did not build: drop it, convert the checkpoint again
            log(f"the host image of {msg.model.name} is unusable, reading the checkpoint: {e}")
            shutil.rmtree(src.checkpoint.root, ignore_errors=True)
            return None

    def _registered(self, built: Built) -> None:
        if built.engine is None:
            self._send(wm.ErrorReply(built.msg.seq, built.error, "bad_request"))
            return
        if built.msg.model.prefill_devices:  # a P/D model's instance (not a plain role=decode one)
            try:
                self.pd.ensure()  # P/D instances move KV through this worker's transfer engine
            except Exception as e:
                log(f"starting the transfer engine failed: {e}")
                with contextlib.suppress(Exception):
                    built.engine.close()
                self._send(wm.ErrorReply(built.msg.seq, f"cannot load {built.msg.model.name!r} as a "
                                         f"{built.msg.model.role} instance: {e}", "internal"))
                return
        me = self.de.register(built.engine)
        eos = [int(t) for t in getattr(me, "eos_token_ids", [])]
        self._send(wm.ModelLoaded(built.msg.seq, me.name, int(me.max_model_len), built.seconds, eos,
                                  built.probe, getattr(me, "arrival", ("checkpoint", "", 0, 0.0))))  # a tp shard's

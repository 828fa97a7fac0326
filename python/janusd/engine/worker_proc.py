"""The worker's engine loop: WorkerProc talks to the daemon for one DeviceEngine.

It wraps the in-process DeviceEngine (engine/device_engine.py) with a socket loop, as
vLLM's EngineCoreProc wraps EngineCore: the engine steps, this file talks. Threads:
- the reader thread decodes frames from the daemon. Tokenize requests are answered
  right there (engine/worker_tokenize.py), Pings too; everything else is queued;
- the main thread owns the engine: it applies queued commands between steps, steps
  while there is work, and sends every step's outputs as one StepBatch frame;
- a loader thread per LoadModel (engine/worker_load.py) and a lifecycle thread per
  state change (engine/worker_lifecycle.py) move bytes off the main thread;
- a follower thread per tp shard this worker holds for another device's lead: it runs
  the forward of every step the lead announces (engine/worker_tp.py).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from typing import Any

import msgspec

from janusd.engine.types import STALL_WAIT_S
from janusd.engine.worker_lifecycle import Done, Lifecycle
from janusd.engine.worker_load import Built, Loading
from janusd.engine.worker_log import Caught, log
from janusd.engine.worker_pd import Imported, PDLink
from janusd.engine.worker_tokenize import tokenize
from janusd.engine.worker_tp import ReleaseShard, TPWorker
from janusd.wire import worker_msgs as wm
from janusd.wire.framing import BlockingFramedSocket, FrameError


class WorkerProc(Loading, TPWorker):
    def __init__(self, conn: BlockingFramedSocket, engine: Any, device_index: int, kind: str,
                 transfer_protocol: str = "auto", transfer_nice: int = 0, transfer_host: str = "127.0.0.1") -> None:
        self.conn = conn
        self.de = engine
        self.device_index = device_index
        self.kind = kind
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.req_model: dict[int, str] = {}
        self.running = True
        self.busy_since: float | None = None  # the main thread is in a step or command since (monotonic)
        self.caught = Caught()  # errors served past, reported in Stats.errors
        self.pd = PDLink(engine.pool, kind, self.inbox, transfer_protocol, transfer_nice, transfer_host)
        self.life = Lifecycle(engine, self.inbox, self.pd, self._send, self._drop_requests)
        self.tp_stores: dict[str, Any] = {}  # tp instances this worker leads: their rendezvous stores
        self.followers: dict[str, Any] = {}
        self.life.registered = self.tp_registered

    # ---- reader thread ----
    def reader(self) -> None:
        dec = wm.to_worker_decoder()
        while True:
            try:
                body = self.conn.recv()
            except FrameError as e:
                log(f"bad frame from daemon, closing: {e}")
                body = None
            if body is None:
                self.inbox.put(wm.Shutdown())
                return
            try:
                msg = dec.decode(body)
            except msgspec.DecodeError as e:
                log(f"undecodable message from daemon ignored: {e}")
                continue
            if isinstance(msg, wm.Tokenize):
                self._send(tokenize(self.de.models, msg, self.caught))
            elif isinstance(msg, wm.Ping):
                since = self.busy_since
                self._send(wm.Pong(msg.seq, time.monotonic() - since if since is not None else 0.0))
            else:
                self.inbox.put(msg)

    def _send(self, msg: Any) -> None:
        try:
            self.conn.send(msg)
        except OSError:
            self.running = False  # daemon gone; the reader sees EOF and queues Shutdown

    # ---- main thread ----
    def serve(self) -> None:
        threading.Thread(target=self.reader, name="janusd-worker-reader", daemon=True).start()
        self._send(wm.Ready(os.getpid(), self.device_index, self.kind, measure_memcpy()))
        while self.running:
            busy = self.de.has_work()
            self.life.reap(idle=not busy)
            # requests waiting for KV pages other owners hold: a step now would do nothing,
            # so wait briefly on the inbox (a message still wakes us at once), never spin
            wait = (STALL_WAIT_S if self.de.waiting_for_pages() else 0.0) if busy else max(0.001, self.life.reap_wait())
            if self.pd.parked:  # imports waiting for blocks: retry soon, as steps or messages free pages
                wait = min(wait, STALL_WAIT_S) if wait else 0.0
            try:
                msg = self.inbox.get(timeout=wait) if wait else self.inbox.get_nowait()
            except queue.Empty:
                msg = None
            while msg is not None:
                self.busy_since = time.monotonic()
                self._handle(msg)
                self.busy_since = None
                if not self.running:
                    return
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    msg = None
            if self.pd.parked:
                self._retry_parked()
            if self.de.has_work():
                self._step()

    def _step(self) -> None:
        self.busy_since = time.monotonic()  # the reader thread's Pong reports how long a step runs
        try:
            outs = self.de.step()
        except Exception:
            log("engine step failed:\n" + traceback.format_exc())
            self.exit_if_group_broke()  # a tp group's collective failed: the daemon restarts the group
            self._fail_all("the engine failed during a step (see the worker log)")
            return
        finally:
            self.busy_since = None
        batch = []
        failed = []
        ready = []
        for o in outs:
            rid = int(o.req_id)
            if o.finished:
                self.req_model.pop(rid, None)
            if o.error:
                failed.append(wm.RequestFailed(rid, o.error, "unavailable"))
                continue
            if o.kv_ready:
                ready.append((rid, o.model))
            lp = [t.logprob for t in o.logprobs] if o.logprobs else None
            batch.append(
                wm.TokenDelta(
                    rid, list(o.token_ids), o.text, o.finished, o.finish_reason,
                    o.num_prompt_tokens, o.num_output_tokens, o.prefill_s, lp,
                )
            )
        if batch:
            self._send(wm.StepBatch(batch))
        for f in failed:
            self._send(f)
        for rid, model in ready:  # after the batch: the daemon sees the first token first
            self._send(self._kv_ready(rid, model))

    def _kv_ready(self, rid: int, model: str) -> Any:
        try:
            return self.pd.kv_ready(self.de.models[model], rid)
        except Exception as e:
            log("exporting KV failed:\n" + traceback.format_exc())
            self.req_model.pop(rid, None)
            if (me := self.de.models.get(model)) is not None:
                self._abort(me, rid)
            return wm.RequestFailed(rid, f"cannot hand the KV to a decode instance: {e}", "internal")

    def _fail_all(self, message: str) -> None:
        for rid, model in list(self.req_model.items()):
            me = self.de.models.get(model)
            if me is not None and not self.pd.defer_abort(rid):  # bytes still arriving: abort after
                self._abort(me, rid)
            self._send(wm.RequestFailed(rid, message, "internal"))
        self.req_model.clear()

    def _abort(self, me: Any, rid: int) -> None:
        """Abort `rid` on its model engine. An abort that raises (after a failed step the
        engine may be in any state) must not stop the requests after it from being failed
        and freed, nor pass unseen: the request's KV pages may stay held, so it is logged
        with its traceback and counted (Stats.errors["abort"], janusd_worker_errors)."""
        try:
            me.abort(str(rid))
        except Exception:
            self.caught("abort", f"aborting request {rid} of {getattr(me, 'name', '?')} failed; "
                                 "its KV pages may stay held")

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, wm.Generate):
            self._generate(msg)
        elif isinstance(msg, wm.Abort):
            model = self.req_model.pop(msg.req_id, None)
            me = self.de.models.get(model) if model else None
            if me is not None and not self.pd.defer_abort(msg.req_id):
                self._abort(me, msg.req_id)
        elif isinstance(msg, wm.ImportKV):
            self._import(msg)
        elif isinstance(msg, Imported):
            reply = self.pd.finish(msg, self.de.models.get(msg.model))
            if isinstance(reply, wm.RequestFailed):
                self.req_model.pop(msg.req_id, None)
            if reply is not None:
                self._send(reply)
        elif isinstance(msg, wm.LoadModel):
            self._load(msg)
        elif isinstance(msg, Built):
            self._registered(msg)
        elif isinstance(msg, wm.UnloadModel):
            self._unload(msg)
        elif isinstance(msg, wm.SetState):
            self.life.set_state(msg)
        elif isinstance(msg, Done):
            self.life.done(msg)
        elif isinstance(msg, wm.PublishWeights):
            self._send(self.life.publish(msg))
        elif isinstance(msg, wm.GetStats):
            self._send(self._stats(msg.seq))
        elif isinstance(msg, wm.OpenGroup):
            self._open_group(msg)
        elif isinstance(msg, ReleaseShard):
            self._release_shard(msg)
        elif isinstance(msg, wm.Shutdown):
            self.running = False

    def _stats(self, seq: int) -> wm.Stats:
        de = self.de
        held = sum(me.num_requests() for me in de.models.values())
        usage = {name: _kv_usage(me) for name, me in de.models.items()}
        return wm.Stats(seq, _int_dict(de.pool.stats()), sorted(de.models), len(self.req_model), held, usage,
                        {n: h.nbytes for n, h in de.host.items()},
                        {n: (me.stats.steps, me.stats.decode_tokens, me.stats.forward_s)
                         for n, me in de.models.items()}, self.caught.counts())

    def _model_for(self, msg: wm.Generate | wm.ImportKV) -> Any:
        """The request's model engine, or None after telling the daemon it is not here."""
        me = self.de.models.get(msg.model)
        if me is None:
            self._send(wm.RequestFailed(msg.req_id, f"model {msg.model!r} is not loaded on this worker", "internal"))
        return me

    def _generate(self, msg: wm.Generate) -> None:
        from janusd.engine.types import RequestError, SamplingParams

        me = self._model_for(msg)
        if me is None:
            return
        try:
            params = SamplingParams(**msgspec.structs.asdict(msg.sampling))
            me.add_request(str(msg.req_id), msg.prompt_token_ids, params)
        except (RequestError, ValueError, TypeError) as e:
            self._send(wm.RequestFailed(msg.req_id, str(e), "bad_request"))
            return
        except Exception as e:
            log("add_request failed:\n" + traceback.format_exc())
            self._send(wm.RequestFailed(msg.req_id, f"engine error: {e}", "internal"))
            return
        self.req_model[msg.req_id] = msg.model

    def _import(self, msg: wm.ImportKV) -> None:
        from janusd.engine.types import SamplingParams

        me = self._model_for(msg)
        if me is None:
            return
        try:
            params = SamplingParams(**msgspec.structs.asdict(msg.sampling))
        except (ValueError, TypeError) as e:
            self._send(wm.RequestFailed(msg.req_id, f"cannot take over the request's KV: {e}", "internal"))
            return
        self.req_model[msg.req_id] = msg.model
        self.pd.park(msg, params, float(me.scheduler.kv_wait_timeout_s), time.monotonic())
        self._retry_parked()  # in arrival order: an older import of its model that waits goes first

    def _retry_parked(self) -> None:
        live = lambda rid, model: self.req_model.get(rid) == model  # noqa: E731
        for failed in self.pd.retry_parked(self.de.models, live, time.monotonic()):
            self.req_model.pop(failed.req_id, None)
            self._send(failed)

    def _drop_requests(self, name: str, why: str) -> None:
        """Abort and fail every request this worker relays for model `name`."""
        for rid, model in list(self.req_model.items()):
            if model == name:
                self.pd.forget(rid)
                me = self.de.models.get(model)
                if me is not None:
                    self._abort(me, rid)
                self._send(wm.RequestFailed(rid, why, "internal"))
                del self.req_model[rid]

    def _unload(self, msg: wm.UnloadModel) -> None:
        if self.pd.defer_unload(msg):
            return  # a KV transfer still writes into its blocks: the transfer thread re-queues this
        if msg.name in self.life.busy:
            self._send(wm.ErrorReply(msg.seq, f"model {msg.name!r} is changing state; unload it after", "bad_request"))
            return
        self._drop_requests(msg.name, f"model {msg.name!r} was unloaded")
        self.life.images.forget(msg.name)
        self.stop_followers(msg.name)  # a tp group's lead: its followers free their shards first
        try:
            self.de.unload_model(msg.name)
        except Exception as e:
            self._send(wm.ErrorReply(msg.seq, f"cannot unload {msg.name!r}: {e}", "bad_request"))
            return
        self._send(wm.ModelUnloaded(msg.seq, msg.name))


def measure_memcpy(nbytes: int = 32 << 20) -> float:
    """Bytes per second of one warm host copy: the start value of the daemon's restore
    path estimates (refined by every transfer since)."""
    import torch

    a = torch.ones(nbytes, dtype=torch.uint8)
    b = torch.empty_like(a)
    b.copy_(a)
    t0 = time.perf_counter()
    b.copy_(a)
    return nbytes / max(time.perf_counter() - t0, 1e-9)


def _kv_usage(me: Any) -> float:
    """Fraction of the model's KV region (its most blocks) that requests hold now."""
    kv = getattr(me, "kv", None)
    if kv is None or not kv.max_blocks:
        return 0.0
    return round(kv.alloc.num_used / kv.max_blocks, 6)


def _int_dict(d: Any) -> dict[str, int]:
    if not isinstance(d, dict):
        d = msgspec.structs.asdict(d) if isinstance(d, msgspec.Struct) else vars(d)
    return {str(k): int(v) for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

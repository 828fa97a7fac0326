"""The worker PROCESS: one per device, started by the daemon as
`python -m janusd.engine.worker --fd N --device-index I ...` (spawn/exec, never fork).

It wraps the in-process DeviceEngine (engine/device_engine.py) with a socket loop, as
vLLM's EngineCoreProc wraps EngineCore: the engine steps, this file talks. Two threads:
- the reader thread decodes frames from the daemon. Tokenize requests are answered
  right there (tokenizers release the GIL; a prompt is tokenized while the main thread
  is inside a step, so tokenization never waits for a step), everything else is queued;
- the main thread owns the engine: it applies queued commands between steps, steps
  while there is work, and sends every step's outputs as one StepBatch frame;
- a loader thread per LoadModel builds the new model (checkpoint read, weights copied
  into its xTensor segment) while the main thread keeps stepping the models already
  here; the main thread registers it when the build is done, so a load never stalls
  its neighbours (tests/test_worker_background_load.py).
The daemon tokenizes through us so that it never imports engine/ or torch (DESIGN.md).
A clean EOF from the daemon (it died or closed) ends the worker: no orphans.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

import msgspec

from janusd.engine.types import STALL_WAIT_S
from janusd.engine.worker_lifecycle import Done, Lifecycle
from janusd.engine.worker_pd import Imported, PDLink
from janusd.wire import worker_msgs as wm
from janusd.wire.framing import BlockingFramedSocket, FrameError


def _log(msg: str) -> None:
    print(f"janusd-worker[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


class _Built(msgspec.Struct):
    """A loader thread's result, handed to the main thread through the inbox."""

    msg: wm.LoadModel
    engine: Any
    error: str
    seconds: float
    probe: list[tuple[int, float]] = []


# Prompt lengths the loader thread times on a new model before it serves (the first run
# only warms up). Short and long, so the daemon's a + b * tokens fit has both ends.
PROBE_TOKENS = (16, 16, 256)


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


class WorkerProc:
    def __init__(self, conn: BlockingFramedSocket, engine: Any, device_index: int, kind: str,
                 transfer_protocol: str = "auto", transfer_nice: int = 0) -> None:
        self.conn = conn
        self.de = engine
        self.device_index = device_index
        self.kind = kind
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.req_model: dict[int, str] = {}
        self.running = True
        self.busy_since: float | None = None  # the main thread is in a step or command since (monotonic)
        self.pd = PDLink(engine.pool, kind, self.inbox, transfer_protocol, transfer_nice)
        self.life = Lifecycle(engine, self.inbox, self.pd, self._send, self._drop_requests)

    # ---- reader thread ----
    def reader(self) -> None:
        dec = wm.to_worker_decoder()
        while True:
            try:
                body = self.conn.recv()
            except FrameError as e:
                _log(f"bad frame from daemon, closing: {e}")
                body = None
            if body is None:
                self.inbox.put(wm.Shutdown())
                return
            try:
                msg = dec.decode(body)
            except msgspec.DecodeError as e:
                _log(f"undecodable message from daemon ignored: {e}")
                continue
            if isinstance(msg, wm.Tokenize):
                self._send(self._tokenize(msg))
            elif isinstance(msg, wm.Ping):
                since = self.busy_since
                self._send(wm.Pong(msg.seq, time.monotonic() - since if since is not None else 0.0))
            else:
                self.inbox.put(msg)

    def _tokenize(self, msg: wm.Tokenize) -> Any:
        me = self.de.models.get(msg.model)
        if me is None:
            return wm.ErrorReply(msg.seq, f"model {msg.model!r} is not loaded on this worker", "bad_request")
        try:
            return wm.Tokenized(msg.seq, tokenize_prompt(me.tokenizer, msg.prompt, msg.messages))
        except Exception as e:  # a template or tokenizer error is the client's input
            return wm.ErrorReply(msg.seq, f"cannot tokenize the prompt: {e}", "bad_request")

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
            _log("engine step failed:\n" + traceback.format_exc())
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
            _log("exporting KV failed:\n" + traceback.format_exc())
            self.req_model.pop(rid, None)
            with contextlib.suppress(Exception):
                self.de.models[model].abort(str(rid))
            return wm.RequestFailed(rid, f"cannot hand the KV to a decode instance: {e}", "internal")

    def _fail_all(self, message: str) -> None:
        for rid, model in list(self.req_model.items()):
            me = self.de.models.get(model)
            if me is not None and not self.pd.defer_abort(rid):  # bytes still arriving: abort after
                try:
                    me.abort(str(rid))
                except Exception:
                    pass
            self._send(wm.RequestFailed(rid, message, "internal"))
        self.req_model.clear()

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, wm.Generate):
            self._generate(msg)
        elif isinstance(msg, wm.Abort):
            model = self.req_model.pop(msg.req_id, None)
            me = self.de.models.get(model) if model else None
            if me is not None and not self.pd.defer_abort(msg.req_id):
                me.abort(str(msg.req_id))
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
        elif isinstance(msg, _Built):
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
            held = sum(me.num_requests() for me in self.de.models.values())
            usage = {name: _kv_usage(me) for name, me in self.de.models.items()}
            self._send(wm.Stats(msg.seq, _int_dict(self.de.pool.stats()), sorted(self.de.models), len(self.req_model),
                                held, usage, {n: h.nbytes for n, h in self.de.host.items()},
                                {n: (me.stats.steps, me.stats.decode_tokens, me.stats.forward_s)
                                 for n, me in self.de.models.items()}))
        elif isinstance(msg, wm.Shutdown):
            self.running = False

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
            _log("add_request failed:\n" + traceback.format_exc())
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

    def _load(self, msg: wm.LoadModel) -> None:
        """Build the model on a loader thread so the models already here keep stepping;
        the main thread registers it when the build is done (a _Built in the inbox)."""
        threading.Thread(target=self._build, args=(msg,), name=f"janusd-load-{msg.model.name}", daemon=True).start()

    def _build(self, msg: wm.LoadModel) -> None:
        from pathlib import Path

        t0 = time.perf_counter()
        try:
            me = self.de.build_model(msg.model, msg.engine, Path(msg.cache_dir) if msg.cache_dir else None)
        except Exception as e:
            _log(f"loading {msg.model.name} failed:\n" + traceback.format_exc())
            self.inbox.put(_Built(msg, None, f"cannot load {msg.model.name!r}: {e}", 0.0))
            return
        seconds = time.perf_counter() - t0
        try:
            probe = prefill_probe(me)
        except Exception as e:  # a probe that fails must not fail the load; the daemon keeps its prior
            _log(f"prefill probe of {msg.model.name} failed: {e}")
            probe = []
        self.inbox.put(_Built(msg, me, "", seconds, probe))
        self.life.prefetch_image(msg)  # its image, if one exists, into the page cache for a later Cold start

    def _registered(self, built: _Built) -> None:
        if built.engine is None:
            self._send(wm.ErrorReply(built.msg.seq, built.error, "bad_request"))
            return
        if built.msg.model.prefill_devices:  # a P/D model's instance (not a plain role=decode one)
            try:
                self.pd.ensure()  # P/D instances move KV through this worker's transfer engine
            except Exception as e:
                _log(f"starting the transfer engine failed: {e}")
                with contextlib.suppress(Exception):
                    built.engine.close()
                self._send(wm.ErrorReply(built.msg.seq, f"cannot load {built.msg.model.name!r} as a "
                                         f"{built.msg.model.role} instance: {e}", "internal"))
                return
        me = self.de.register(built.engine)
        eos = [int(t) for t in getattr(me, "eos_token_ids", [])]
        self._send(wm.ModelLoaded(built.msg.seq, me.name, int(me.max_model_len), built.seconds, eos,
                                  built.probe))

    def _drop_requests(self, name: str, why: str) -> None:
        """Abort and fail every request this worker relays for model `name`."""
        for rid, model in list(self.req_model.items()):
            if model == name:
                self.pd.forget(rid)
                me = self.de.models.get(model)
                if me is not None:
                    me.abort(str(rid))
                self._send(wm.RequestFailed(rid, why, "internal"))
                del self.req_model[rid]

    def _unload(self, msg: wm.UnloadModel) -> None:
        if self.pd.defer_unload(msg):
            return  # a KV transfer still writes into its blocks: the transfer thread re-queues this
        if msg.name in self.life.busy:
            self._send(wm.ErrorReply(msg.seq, f"model {msg.name!r} is changing state; unload it after", "bad_request"))
            return
        self._drop_requests(msg.name, f"model {msg.name!r} was unloaded")
        self.life.forget(msg.name)
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


def tokenize_prompt(tokenizer: Any, prompt: str | None, messages: list[wm.ChatMessage] | None) -> list[int]:
    """Chat messages go through the checkpoint's chat template (whose text already holds
    any BOS), a plain prompt is encoded with the tokenizer's special tokens."""
    if messages is not None:
        text = tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True
        )
        return list(tokenizer.encode(text, add_special_tokens=False))
    if prompt is None:
        raise ValueError("neither a prompt nor messages were given")
    return list(tokenizer.encode(prompt, add_special_tokens=True))


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


def _pin(spec: str) -> None:
    """Run on the given host cores (devices.cpu_cores), before torch starts its threads so
    they inherit the set; ValueError naming the cores when the host has no such core."""
    try:
        cores = {int(c) for c in spec.split(",") if c.strip()}
    except ValueError:
        raise ValueError(f"--cpu-cores {spec!r}: not a comma-separated list of core numbers") from None
    try:
        os.sched_setaffinity(0, cores)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot pin to host cores {sorted(cores)} (devices.cpu_cores; this host lets this "
                         f"process use {sorted(os.sched_getaffinity(0))}): {e}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m janusd.engine.worker", description=__doc__)
    p.add_argument("--fd", type=int, required=True, help="inherited socket fd connected to the daemon")
    p.add_argument("--device-index", type=int, required=True)
    p.add_argument("--kind", default="cpu")
    p.add_argument("--memory-bytes", type=int, required=True)
    p.add_argument("--page-size", type=int, default=2 << 20)
    p.add_argument("--resident-bytes", type=int, default=0, help="top of the pool kept backed (cpu)")
    p.add_argument("--torch-threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--cpu-cores", default="", help="host cores to run on, comma-separated (empty: any)")
    p.add_argument("--transfer-protocol", default="auto", help="Mooncake protocol (auto: by device kind)")
    p.add_argument("--transfer-nice", type=int, default=0,
                   help="how much nicer the transfer engine's threads run (0-19)")
    args = p.parse_args(argv)
    # The daemon owns our life: SIGINT from a terminal's Ctrl-C or SIGTERM sent to the whole
    # process group must not kill a worker mid-drain; we exit on Shutdown or on EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    conn = BlockingFramedSocket(sock)
    try:
        if args.cpu_cores:
            _pin(args.cpu_cores)
        import torch

        if args.torch_threads > 0:
            torch.set_num_threads(args.torch_threads)
        from janusd.engine.device_engine import DeviceEngine

        de = DeviceEngine(
            kind=args.kind, device_index=args.device_index, memory_bytes=args.memory_bytes, page_size=args.page_size,
            resident_bytes=args.resident_bytes,
        )
    except Exception as e:
        from janusd.engine.types import EngineError

        # A missing runtime or a bad setting is the operator's to fix: one line, no traceback.
        expected = isinstance(e, (EngineError, ValueError))
        _log(f"cannot start the device engine: {e}" if expected
             else "cannot start the device engine:\n" + traceback.format_exc())
        try:
            conn.send(wm.ErrorReply(0, f"device {args.kind}:{args.device_index}: {e}", "internal"))
        except OSError:
            pass
        return 1
    from janusd.lifecycle.transfer import preload_engine

    preload_engine()  # before serving: its first use may be a fork whose source is serving
    WorkerProc(conn, de, args.device_index, args.kind, args.transfer_protocol, args.transfer_nice).serve()
    # Nothing a worker holds outlives it (device memory, pinned host memory, transfer
    # registrations all belong to the process), so skip the interpreter's teardown: freeing
    # every pool page, torch's and the transfer engine's destructors took ~0.7 s of an idle
    # daemon's SIGTERM (measured), and on a device runtime can take longer.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())

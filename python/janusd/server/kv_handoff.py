"""The daemon's P/D step: move a prefilled request from its prefill instance to a decode
instance (PAPER.md §2 elastic instances with P/D, §6 decode routing, §7 base + offset).

A P/D model's prefill instance streams the first token, then says KVReady (where its KV
blocks lie in its pool's global region, and its Mooncake session). We pick the model's
ready decode instance with the least decode backlog (Scheduler.decode_target) and send
it ImportKV; the decode worker reads the bytes over Mooncake itself and answers
KVImported, after which the prefill worker is told to free its blocks. From the
handoff on, the request belongs to the decode worker (a prefill worker's later death no
longer fails it); until KVImported the prefill side's blocks are released whenever the
request ends, so no path leaks them. This file decides nothing about devices: the
workers move the bytes, the policy picks the instance.
"""

from __future__ import annotations

import sys
from typing import Any

from janusd.server.requests import Failure, Request, RequestTable
from janusd.server.scheduling import Scheduler
from janusd.wire import worker_msgs as wm


def _log(msg: str) -> None:
    print(f"janusd: {msg}", file=sys.stderr, flush=True)


class KVHandoff:
    def __init__(self, sched: Scheduler, requests: RequestTable, workers: list[Any], metrics: Any) -> None:
        self.sched = sched
        self.requests = requests
        self.workers = workers
        self.metrics = metrics

    def on_message(self, w: Any, msg: wm.KVReady | wm.KVImported) -> None:
        if isinstance(msg, wm.KVReady):
            self._ready(w, msg)
        else:
            self._imported(msg)

    def _ready(self, prefill_w: Any, msg: wm.KVReady) -> None:
        req = self.requests.by_id.get(msg.req_id)
        if req is None or req.done:
            prefill_w.send(wm.Abort(msg.req_id))  # it ended meanwhile: free the held blocks
            return
        inst = self.sched.decode_target(req.model)
        if inst is None:
            prefill_w.send(wm.Abort(msg.req_id))
            self.metrics.kv_transfer(req.model, "no_decode_instance")
            self.requests.fail(req.rid, Failure(503, f"no decode instance of model {req.model!r} is ready to "
                                                     "continue this request", code="no_decode_instance"))
            return
        decode_w = self.workers[inst.device]
        req.kv_source, req.worker, req.decode_inst = prefill_w, decode_w, inst
        inst.decoding[req.rid] = max(0, req.sampling.max_tokens - req.num_output_tokens)
        try:
            sent = decode_w.send(wm.ImportKV(req.rid, req.model, req.sampling, msg.kv, msg.session, msg.global_base))
        except Exception as e:  # e.g. a frame over the size limit: this request fails, nothing else
            _log(f"request {req.rid}: cannot send its KV handoff to device {inst.device}: {e}")
            sent = False
        if not sent:  # on_finished counts the failed transfer and frees the prefill side
            self.requests.fail(req.rid, Failure(503, f"the decode worker for device {inst.device} is not running"))

    def _imported(self, msg: wm.KVImported) -> None:
        req = self.requests.by_id.get(msg.req_id)
        if req is None:
            return  # ended meanwhile; on_finished already released the prefill side
        self.metrics.kv_transfer(req.model, "ok", msg.nbytes, msg.seconds)
        if req.kv_source is not None:
            req.kv_source.send(wm.Abort(req.rid))  # the decode side holds its own copy now
            req.kv_source = None

    def accept_failure(self, w: Any, rid: int) -> bool:
        """Whether a RequestFailed from worker `w` ends request `rid`. After the handoff the
        prefill worker may still report it (its engine failed before our Abort reached it):
        stale once KVImported came, the request decodes elsewhere. Before that its KV is
        gone, so the request fails and the decode side, perhaps mid-read, is told too."""
        req = self.requests.by_id.get(rid)
        if req is None or req.worker is None or req.worker is w:
            return True
        if req.kv_source is not w:
            return False
        req.worker.send(wm.Abort(rid))
        return True

    def on_finished(self, req: Request) -> None:
        if req.kv_source is not None:
            req.kv_source.send(wm.Abort(req.rid))
            req.kv_source = None
            if req.failed:  # ended before KVImported: the transfer did not complete
                cancelled = req.failure is not None and req.failure.status == 499
                self.metrics.kv_transfer(req.model, "cancelled" if cancelled else "failed")
        if req.decode_inst is not None:
            req.decode_inst.decoding.pop(req.rid, None)

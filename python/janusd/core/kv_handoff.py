"""The P/D step: move a prefilled request from its prefill instance to a decode instance
(PAPER.md §2 elastic instances with P/D, §6 decode routing, §7 base + offset).

A P/D model's prefill instance streams the first token, then says KVReady (where its KV
blocks lie in its pool's global region, and its Mooncake session). We pick the model's
Active decode instance with the least decode backlog and send it ImportKV; the decode
worker reads the bytes over Mooncake itself and answers KVImported, after which the
prefill worker is told to free its blocks. From the handoff on, the request belongs to
the decode worker (a prefill worker's later death no longer fails it); until KVImported
the prefill side's blocks are released whenever the request ends, so no path leaks them.
Workers are named by device index; this file decides nothing about devices.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from janusd.core.registry import Instance
from janusd.core.requests import Failure, Request, RequestTable
from janusd.core.worker_edge import Worker
from janusd.log import log
from janusd.wire import worker_msgs as wm


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


class KVHandoff:
    def __init__(self, requests: RequestTable, workers: Mapping[int, Worker],
                 decode_target: Callable[[str], Instance | None],
                 on_transfer: Callable[[str, str, int, float | None], None]) -> None:
        self.requests = requests
        self.workers = workers
        self.decode_target = decode_target
        self.on_transfer = on_transfer  # (model, outcome, bytes, seconds): metrics

    def _send(self, device: int, msg: Any) -> bool:
        w = self.workers.get(device)
        return w is not None and w.send(msg)

    def on_message(self, device: int, msg: wm.KVReady | wm.KVImported) -> None:
        if isinstance(msg, wm.KVReady):
            self._ready(device, msg)
        else:
            self._imported(msg)

    def _ready(self, prefill_dev: int, msg: wm.KVReady) -> None:
        req = self.requests.by_id.get(msg.req_id)
        if req is None or req.done:
            self._send(prefill_dev, wm.Abort(msg.req_id))  # it ended meanwhile: free the held blocks
            return
        inst = self.decode_target(req.model)
        if inst is None:
            self._send(prefill_dev, wm.Abort(msg.req_id))
            self.on_transfer(req.model, "no_decode_instance", 0, None)
            self.requests.fail(req.rid, Failure(503, f"no decode instance of model {req.model!r} is ready to "
                                                     "continue this request", code="no_decode_instance"))
            return
        req.kv_source, req.device, req.decode_inst = prefill_dev, inst.device, inst
        inst.decoding[req.rid] = max(0, req.sampling.max_tokens - req.num_output_tokens)
        try:
            sent = self._send(inst.device, wm.ImportKV(req.rid, req.model, req.sampling, msg.kv, msg.session,
                                                       msg.global_base))
        except Exception as e:  # e.g. a frame over the size limit: this request fails, nothing else
            _log(f"request {req.rid}: cannot send its KV handoff to device {inst.device}: {e}")
            sent = False
        if not sent:  # on_finished counts the failed transfer and frees the prefill side
            self.requests.fail(req.rid, Failure(503, f"the decode worker for device {inst.device} is not running"))

    def _imported(self, msg: wm.KVImported) -> None:
        req = self.requests.by_id.get(msg.req_id)
        if req is None:
            return  # ended meanwhile; on_finished already released the prefill side
        self.on_transfer(req.model, "ok", msg.nbytes, msg.seconds)
        if req.kv_source is not None:
            self._send(req.kv_source, wm.Abort(req.rid))  # the decode side holds its own copy now
            req.kv_source = None

    def accept_failure(self, device: int, rid: int) -> bool:
        """Whether a RequestFailed from the worker of `device` ends request `rid`. After the
        handoff the prefill worker may still report it (its engine failed before our Abort
        reached it): stale once KVImported came, the request decodes elsewhere. Before that
        its KV is gone, so the request fails and the decode side, perhaps mid-read, is told too."""
        req = self.requests.by_id.get(rid)
        if req is None or req.device is None or req.device == device:
            return True
        if req.kv_source != device:
            return False
        self._send(req.device, wm.Abort(rid))
        return True

    def on_finished(self, req: Request) -> None:
        if req.kv_source is not None:
            self._send(req.kv_source, wm.Abort(req.rid))
            req.kv_source = None
            if req.failed:  # ended before KVImported: the transfer did not complete
                cancelled = req.failure is not None and req.failure.status == 499
                self.on_transfer(req.model, "cancelled" if cancelled else "failed", 0, None)
        if req.decode_inst is not None:
            req.decode_inst.decoding.pop(req.rid, None)

"""Worker events in the core: tokens (StepBatch: first token, decode pace, delivery;
a prompt's tokens arrive through core/intake.py's on_tokenized),
a request's failure on its worker, and P/D KV handoff messages. Apart from admission and
instance moves because it is the only way back from a worker: every request's progress
after its Generate arrives here, with the time the shell heard it."""

from __future__ import annotations

from janusd.core.core_state import CoreState
from janusd.core.requests import Failure
from janusd.wire import worker_msgs as wm


class WorkerEvents(CoreState):
    """ServingCore's worker-event part (see core/core_state.py)."""

    def on_batch(self, device: int, batch: wm.StepBatch, now: float) -> None:
        self._at(now)
        for d in batch.outputs:
            req = self.requests.by_id.get(d.req_id)
            if req is None:
                continue
            if not req.prefill_seen and d.token_ids:
                # before deliver(): a request whose first token is also its last ends inside
                # deliver(), and its prefill time must still reach the estimator and EPDT
                req.prefill_seen = True
                if req.device is not None:
                    req.decode_device = req.device
                    self.guard.count(req.device, +1, req.tpot_slo_s)
                self.telemetry.on_first_token(req.rid, now)
                if req.instance is not None:
                    self.dispatch.prefill_done(req.rid, req.instance, now, len(req.prompt_ids), d.prefill_s,
                                               req.est_prefill_s)
            elif d.token_ids and req.token_times and req.decode_device == device:
                # a later token: the gap since the last one is the device's decode pace
                self.guard.observe_gap(device, (now - req.token_times[-1]) / len(d.token_ids))
            if d.token_ids:
                self.telemetry.on_tokens(req.rid, now, len(d.token_ids))
            self.requests.deliver(d, now)

    def on_failed(self, device: int, f: wm.RequestFailed, now: float) -> None:
        self._at(now)
        tokenizing = self.tokenizing.finish(f.req_id)
        if tokenizing is not None:
            self._tokenize_failed(tokenizing, device, f, now)
            return
        if not self.handoff.accept_failure(device, f.req_id):
            return  # P/D: a stale report from the prefill worker after the handoff
        status = {"bad_request": 400, "unavailable": 503}.get(f.kind, 500)
        self.requests.fail(f.req_id, Failure(status, f.message, "invalid_request_error" if status == 400
                                             else "server_error"))

    def on_kv(self, device: int, msg: wm.KVReady | wm.KVImported, now: float) -> None:
        self._at(now)
        self.handoff.on_message(device, msg)
        req = self.requests.by_id.get(msg.req_id) if isinstance(msg, wm.KVReady) else None
        if req is not None and req.decode_device is not None and req.device is not None \
                and req.device != req.decode_device:
            # handed off: it decodes on the decode instance's device from now on (the decode
            # guard's count and gap samples, and the controller's per-token decode cost)
            self.guard.count(req.decode_device, -1, req.tpot_slo_s)
            self.guard.count(req.device, +1, req.tpot_slo_s)
            req.decode_device = req.device

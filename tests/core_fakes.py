"""Fakes at the worker edge for driving core/serving.py without asyncio or sockets: a
worker that records what the core sends and a clock the test moves by hand."""

from __future__ import annotations

from typing import Any

from janusd.config import DispatchConfig, ModelConfig
from janusd.core.serving import Limits, ServingCore, Submission
from janusd.lifecycle.states import InstanceState
from janusd.wire import worker_msgs as wm


class FakeWorker:
    def __init__(self, device: int) -> None:
        self.device_index = device
        self.up = True
        self.sent: list[Any] = []

    def send(self, msg: Any) -> bool:
        if not self.up:
            return False
        self.sent.append(msg)
        return True

    def generates(self) -> list[int]:
        return [m.req_id for m in self.sent if isinstance(m, wm.Generate)]

    def tokenizes(self) -> list[int]:
        return [m.req_id for m in self.sent if isinstance(m, wm.Tokenize)]

    def aborts(self) -> list[int]:
        return [m.req_id for m in self.sent if isinstance(m, wm.Abort)]


class Rig:
    """A core with fake workers, a hand clock and event sinks per request."""

    def __init__(self, devices: int = 2, dispatch: DispatchConfig | None = None, limits: Limits = Limits()) -> None:
        self.now = 100.0
        self.workers = {d: FakeWorker(d) for d in range(devices)}
        self.core = ServingCore(dispatch or DispatchConfig(), self.workers, limits)
        self.events: dict[int, list[Any]] = {}

    def model(self, name: str, devices: list[int], **kw: Any) -> None:
        self.core.add_model(ModelConfig(name=name, checkpoint="demo:llama-tiny", devices=devices, **kw))
        for d in devices:
            self.core.instance(name, d)

    def activate(self, name: str, device: int) -> None:
        inst = self.core.instance(name, device)
        if inst.state is InstanceState.UNLOADED:
            self.core.set_state(inst, InstanceState.LOADING, self.now)
        self.core.loaded(inst, self.now, self.core.registry.models[name].cfg.max_model_len, 0.1)

    def submit(self, name: str, tokens: int = 10, max_tokens: int = 4, ttft_ms: float | None = None) -> int:
        """A request given as token ids (the simulator's; a client's `prompt` of ids)."""
        return self._submit(Submission(name, wm.SamplingSpec(max_tokens=max_tokens), self.now,
                                       prompt_ids=list(range(tokens)), ttft_ms=ttft_ms))

    def submit_text(self, name: str, prompt: str, max_tokens: int = 4, ttft_ms: float | None = None,
                    max_tokens_given: bool = True) -> int:
        """A request given as text: the core has a worker tokenize it (answer with `tokens`)."""
        return self._submit(Submission(name, wm.SamplingSpec(max_tokens=max_tokens), self.now, max_tokens_given,
                                       prompt=prompt, ttft_ms=ttft_ms))

    def _submit(self, s: Submission) -> int:
        sink: list[Any] = []
        req = self.core.submit(s, self.now, sink.append)
        self.events[req.rid] = sink
        self.core.check_integrity()
        return req.rid

    def tokenized(self, device: int, rid: int, n: int = 10) -> None:
        """The worker of `device` answers a Tokenize of `rid` with `n` token ids."""
        self.core.on_tokenized(device, wm.Tokenized(rid, list(range(n))), self.now)
        self.core.check_integrity()

    def tick(self) -> float | None:
        wake = self.core.tick(self.now)
        self.core.check_integrity()
        return wake

    def token(self, device: int, rid: int, finished: bool = False, prefill_s: float | None = 0.01) -> None:
        req = self.core.requests.by_id[rid]
        n = req.num_output_tokens + 1
        d = wm.TokenDelta(rid, [7], "x", finished=finished, finish_reason="length" if finished else None,
                          num_prompt_tokens=len(req.prompt_ids), num_output_tokens=n,
                          prefill_s=prefill_s if n == 1 else None)
        self.core.on_batch(device, wm.StepBatch([d]), self.now)
        self.core.check_integrity()

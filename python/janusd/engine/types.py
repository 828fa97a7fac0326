"""Messages of the engine's Python face: request parameters, per-step outputs, KV export.

These are msgspec Structs because they cross the worker socket unchanged (wire/ wraps
them); nothing here touches tensors. `RequestError` is what a caller can cause (bad
prompt, bad parameters, duplicate id): a ValueError subclass so servers map it to 4xx.
"""

from __future__ import annotations

from typing import Literal

import msgspec

# KVExport is defined on the wire (the P/D messages carry it); the engine fills it
from janusd.wire.worker_msgs import KVExport, SamplingSpec  # noqa: F401

FinishReason = Literal["stop", "length", "abort"]


# How long a stalled engine's caller waits before stepping again (worker: on its inbox,
# so a new message still wakes it at once): short next to a step, long next to a spin.
STALL_WAIT_S = 0.005


class RequestError(ValueError):
    """A request the engine refuses; the message names the offending field."""


class KVCapacityError(RequestError):
    """No KV blocks can be had right now (other requests hold them): worth waiting for."""


class EngineError(RuntimeError):
    """The engine cannot run as configured (missing device runtime, unsupported model)."""


class SamplingParams(SamplingSpec, kw_only=True):
    """Per-request sampling: the wire's SamplingSpec (one definition of the fields, so the
    daemon and the engine cannot drift apart) plus the engine's validation.

    temperature 0 (anything below 1e-5) means greedy; top_k 0 and top_p 1 are off.
    `logprobs=n` returns the sampled token's log-probability under the model's raw
    distribution (before temperature/top-k/top-p) and the n most likely alternatives.
    Stop strings and EOS are not checked before `min_tokens` tokens were produced.
    """

    def validate(self, vocab_size: int) -> None:
        """Raise RequestError naming the first bad field."""
        if self.max_tokens < 1:
            raise RequestError(f"max_tokens: must be >= 1, got {self.max_tokens}")
        if not (self.temperature >= 0.0) or self.temperature != self.temperature or self.temperature > 1e4:
            raise RequestError(f"temperature: must be in [0, 1e4], got {self.temperature}")
        if self.top_k < 0:
            raise RequestError(f"top_k: must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise RequestError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not (-(2**63) <= self.seed < 2**64):
            raise RequestError(f"seed: must fit in 64 bits, got {self.seed}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise RequestError("stop: stop strings must be non-empty")
        if any(not (0 <= t < vocab_size) for t in self.stop_token_ids):
            raise RequestError(f"stop_token_ids: ids must be in [0, {vocab_size})")
        if self.logprobs is not None and not (0 <= self.logprobs <= 20):
            raise RequestError(f"logprobs: must be in [0, 20], got {self.logprobs}")
        if not (0 <= self.min_tokens <= self.max_tokens):
            raise RequestError(f"min_tokens: must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")


class TokenLogprob(msgspec.Struct, array_like=True):
    """Log-probability of one sampled token and the `n` most likely tokens at that step."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


class StepOutput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What one engine step produced for one request.

    `text` is the new detokenized text: never a broken UTF-8 sequence, and never any
    part of a stop string or what follows it. `kv_ready` is set (prefill role) when the
    prompt's KV is complete and can be exported; the request then holds its blocks until
    `release_kv`/`abort`.
    """

    req_id: str
    model: str
    token_ids: list[int] = []
    text: str = ""
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    prefill_s: float | None = None
    kv_ready: bool = False
    error: str | None = None


class KVImport(msgspec.Struct, kw_only=True):
    """Destination blocks reserved for an incoming KV transfer (see ModelEngine.begin_import)."""

    req_id: str
    block_ids: list[int]
    global_offsets: list[list[tuple[int, int]]]

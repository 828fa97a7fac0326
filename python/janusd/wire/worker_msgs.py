"""Messages between the daemon and a device worker (one Unix socketpair per worker).

The daemon owns every decision; the worker owns its device. So the daemon sends
commands (load, tokenize, generate, abort, stats, shutdown) and the worker answers with
replies keyed by a sequence number, plus a stream of token batches keyed by request id.
Shaped like vLLM v1's engine messages: `array_like=True` (positional, small frames),
`omit_defaults=True`, `gc=False` (no cycles; cheap to allocate at token rate), and a
closed tagged union per direction so an unknown message is a decode error, never code.

Config sections (ModelConfig, EngineConfig) travel as the config Structs themselves:
config.py sits below wire/ in the import order and is shared by both processes.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from janusd.config import EngineConfig, ModelConfig

_OPTS = dict(array_like=True, omit_defaults=True, gc=False, tag=True)


class SamplingSpec(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Per-request sampling parameters, defined once here: the engine's SamplingParams
    subclasses this and adds validation (wire/ cannot import engine/; engine/ may import
    wire/). temperature 0 = greedy; top_k 0 and top_p 1 = off."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None
    min_tokens: int = 0


class ChatMessage(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    role: str
    content: str


# ---- daemon -> worker ----


class LoadModel(msgspec.Struct, **_OPTS):
    seq: int
    model: ModelConfig
    engine: EngineConfig
    cache_dir: str


class UnloadModel(msgspec.Struct, **_OPTS):
    seq: int
    name: str


class Tokenize(msgspec.Struct, **_OPTS):
    """Text or chat messages to prompt token ids with the model's own tokenizer."""

    seq: int
    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None


class Generate(msgspec.Struct, **_OPTS):
    req_id: int
    model: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec


class Abort(msgspec.Struct, **_OPTS):
    req_id: int


class GetStats(msgspec.Struct, **_OPTS):
    seq: int


class Shutdown(msgspec.Struct, **_OPTS):
    pass


ToWorker = LoadModel | UnloadModel | Tokenize | Generate | Abort | GetStats | Shutdown


# ---- worker -> daemon ----


class Ready(msgspec.Struct, **_OPTS):
    """Sent once, after the device engine exists: the daemon's start-up handshake."""

    pid: int
    device_index: int
    kind: str


class ModelLoaded(msgspec.Struct, **_OPTS):
    seq: int
    name: str
    max_model_len: int
    load_s: float
    eos_token_ids: list[int] = []


class ModelUnloaded(msgspec.Struct, **_OPTS):
    seq: int
    name: str


class Tokenized(msgspec.Struct, **_OPTS):
    seq: int
    token_ids: list[int]


class Stats(msgspec.Struct, **_OPTS):
    seq: int
    pool: dict[str, int]
    models: list[str]
    running: int  # requests this worker relays
    engine_requests: int = 0  # sequences the engines hold (KV allocated or waiting)


class ErrorReply(msgspec.Struct, **_OPTS):
    """A command failed; `message` says why (shown to the operator or the client)."""

    seq: int
    message: str
    kind: Literal["bad_request", "internal"] = "internal"


class TokenDelta(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    req_id: int
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    prefill_s: float | None = None
    logprobs: list[float] | None = None


class StepBatch(msgspec.Struct, **_OPTS):
    """Every request's new tokens from one engine step, in one frame."""

    outputs: list[TokenDelta]


class RequestFailed(msgspec.Struct, **_OPTS):
    """A Generate the engine refused (bad params, prompt too long), could not finish for
    lack of capacity (KV exhausted: "unavailable") or that crashed ("internal")."""

    req_id: int
    message: str
    kind: Literal["bad_request", "unavailable", "internal"] = "bad_request"


FromWorker = Ready | ModelLoaded | ModelUnloaded | Tokenized | Stats | ErrorReply | StepBatch | RequestFailed

Reply = ModelLoaded | ModelUnloaded | Tokenized | Stats | ErrorReply


def to_worker_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(ToWorker)


def from_worker_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(FromWorker)

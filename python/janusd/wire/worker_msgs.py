"""Messages between the daemon and a device worker (one Unix socketpair per worker).

The daemon owns every decision; the worker owns its device. So the daemon sends
commands (load, tokenize, generate, abort, stats, shutdown) and the worker answers with
replies keyed by a sequence number, plus a stream of token batches keyed by request id.
Shaped like vLLM v1's engine messages: `array_like=True` (positional, small frames),
`omit_defaults=True`, `gc=False` (no cycles; cheap to allocate at token rate), and a
closed tagged union per direction so an unknown message is a decode error, never code.

What a worker needs of the daemon's configuration travels in this module's own Structs
(WorkerModel, WorkerEngine, WorkerLifecycle), filled at the sender from the config
sections by field name (`WorkerModel.of(model_config)`): config/ keeps the defaults and
the checks, wire/ names what crosses the process edge and imports nothing of config/.
"""

from __future__ import annotations

from typing import Literal, Self

import msgspec

from janusd.lifecycle.states import TargetWord

_OPTS = dict(array_like=True, omit_defaults=True, gc=False, tag=True)


class _Carried(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A config section's part that travels to a worker. No defaults: the sender's config
    section has them (one owner), and `of` copies every field, so a field added here and
    missing there fails at the sender, not on the worker."""

    @classmethod
    def of(cls, section: object) -> Self:
        """This Struct's fields read by name from `section` (the sender's config Struct)."""
        return cls(**{f: getattr(section, f) for f in cls.__struct_fields__})


class WorkerModel(_Carried):
    """What a worker builds a model from (config.ModelConfig's fields of the same names;
    `prefill_devices` non-empty marks an instance of a P/D model)."""

    name: str
    checkpoint: str
    dtype: str
    max_model_len: int
    kv_cache_mib: int
    role: str
    prefill_devices: list[int]
    tp: int  # > 1: a shard of a tp group (engine/worker_tp.py)


class WorkerEngine(_Carried):
    """A model's engine limits on the worker (config.EngineConfig)."""

    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_wait_timeout_s: float


class WorkerLifecycle(_Carried):
    """How a worker moves a model's weights (config.LifecycleConfig's worker half: copies
    in flight, a fork's pace, the host image and what a Cold model keeps)."""

    copy_streams: int
    copy_chunk_mib: int
    fork_bandwidth_mib_s: int
    host_image: bool
    cold_keeps_tokenizer: bool
    cold_prefetch_image: bool
    overlap_restore: bool


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


class KVExport(msgspec.Struct, kw_only=True):
    """A finished prefill's KV, described by blocks of the source model's KV region.

    `global_offsets[i]` lists the (offset, length) pieces of block `block_ids[i]` in the
    source pool's global xTensor range, so a transfer engine can read them directly.
    `token_ids` are prompt + outputs so far; the first `num_cached_tokens` have KV.
    """

    req_id: str
    model: str
    block_size: int
    block_bytes: int
    dtype: str
    block_ids: list[int]
    global_offsets: list[list[tuple[int, int]]]
    num_cached_tokens: int
    prompt_len: int
    token_ids: list[int]
    page_ids: list[int] = []  # the source pool's physical pages holding these blocks (sorted)
    # the request's sampling RNG state after the tokens already produced, so a seeded
    # request decodes the same tokens after a P/D split as it would have in one engine
    rng_state: bytes | None = None


# ---- daemon -> worker ----


class TPPlace(msgspec.Struct, array_like=True, gc=False):
    """A tp shard here: rank of size, joined via its lead's store (OpenGroup); timeout_s bounds every collective."""

    rank: int
    size: int
    host: str
    port: int
    timeout_s: float


class LoadModel(msgspec.Struct, **_OPTS):
    seq: int
    model: WorkerModel
    engine: WorkerEngine
    cache_dir: str
    lifecycle: WorkerLifecycle  # host_image / cold_prefetch_image
    tp: TPPlace | None = None  # a shard of a tp > 1 instance (rank 0: the lead, which serves it)
    fork: ForkSource | None = None  # a tp shard's fork: source shard `tp.rank`, pulled (else its slices read)


class OpenGroup(msgspec.Struct, **_OPTS):
    """To a tp group's lead worker: host the rendezvous store of `name` (GroupOpened: its port)."""

    seq: int
    name: str


class UnloadModel(msgspec.Struct, **_OPTS):
    seq: int
    name: str


class Tokenize(msgspec.Struct, **_OPTS):
    """A request's text or chat messages to prompt token ids with the model's own
    tokenizer; answered by Tokenized, or RequestFailed (the client's input: bad_request;
    a tokenizer bug: internal; the model is not here: unavailable)."""

    req_id: int
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


class Ping(msgspec.Struct, **_OPTS):
    """Liveness: answered by the worker's reader thread, even while the main thread steps."""

    seq: int


class ImportKV(msgspec.Struct, **_OPTS):
    """P/D: continue request `req_id` on this (decode-role) worker. It reserves blocks,
    reads the prefill worker's KV bytes from `peer` (its transfer session) at
    `peer_base` + the offsets in `kv` over Mooncake, then decodes; it answers
    KVImported (the daemon then releases the prefill side) or RequestFailed."""

    req_id: int
    model: str
    sampling: SamplingSpec
    kv: KVExport
    peer: str
    peer_base: int


class ForkSource(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Where a serving peer's weight segment is (PAPER.md §8 D2D fork): its Mooncake `session`, its
    global region's `global_base`, the segment's (global offset, length) pieces in segment order, the
    total `nbytes`, the plan's `layout` signature (the target refuses a source laid out differently)
    and (segment offset, length, blake2b hex) checksums of sampled blocks, checked after the pull."""

    session: str
    global_base: int
    pieces: list[tuple[int, int]]
    nbytes: int
    layout: str
    checksums: list[tuple[int, int, str]] = []


class SetState(msgspec.Struct, **_OPTS):
    """Move model `model.name` on this worker to `target` (lifecycle/states.py):
    active (from a host copy by H2D, from `fork` by D2D, else from the checkpoint),
    warm (keep or make a host copy; free the device), cold (free everything). The worker
    answers StateSet, or ErrorReply with the state unchanged (an out-of-memory restore
    rolls back)."""

    seq: int
    model: WorkerModel
    engine: WorkerEngine
    cache_dir: str
    target: TargetWord
    lifecycle: WorkerLifecycle
    fork: ForkSource | None = None
    probe: bool = True  # activation: run one greedy token before answering (first_token phase)


class PublishWeights(msgspec.Struct, **_OPTS):
    """A fork's source: say where the model's weight segment is (answered WeightsPublished)."""

    seq: int
    name: str
    verify_blocks: int = 16
    verify_block_bytes: int = 64 << 10


ToWorker = (LoadModel | UnloadModel | Tokenize | Generate | Abort | GetStats | Shutdown | ImportKV | Ping | SetState
            | PublishWeights | OpenGroup)

# ---- worker -> daemon ----

class Ready(msgspec.Struct, **_OPTS):
    """Sent once, after the device engine exists: the daemon's start-up handshake."""

    pid: int
    device_index: int
    kind: str
    memcpy_bps: float = 0.0  # host copy bandwidth measured at start (lifecycle/restore_path.py)


class ModelLoaded(msgspec.Struct, **_OPTS):
    seq: int
    name: str
    max_model_len: int
    load_s: float
    eos_token_ids: list[int] = []
    # (prompt tokens, prefill seconds) measured on the new instance before it serves: the
    # daemon's prefill estimate starts from the device's real speed, not a guess
    prefill_probe: list[tuple[int, float]] = []
    # a tp shard's (path: d2d | checkpoint, why a planned fork was not used, bytes, seconds of its pull or read)
    arrival: tuple[str, str, int, float] = ("checkpoint", "", 0, 0.0)


class StateSet(msgspec.Struct, **_OPTS):
    """A SetState done. `path`: how the weights came (h2d, d2d, checkpoint; none when
    leaving Active or already there); `fallback`: why a planned D2D fork was not used.
    `phases`: seconds of prepare, transfer, restore, first_token (what applies)."""

    seq: int
    name: str
    state: str
    path: str = "none"
    nbytes: int = 0
    phases: dict[str, float] = {}
    fallback: str = ""
    max_model_len: int = 0
    eos_token_ids: list[int] = []


class WeightsPublished(msgspec.Struct, **_OPTS):
    seq: int
    name: str
    source: ForkSource


class GroupOpened(msgspec.Struct, **_OPTS):
    seq: int
    port: int

class ModelUnloaded(msgspec.Struct, **_OPTS):
    seq: int
    name: str


class Tokenized(msgspec.Struct, **_OPTS):
    req_id: int
    token_ids: list[int]


class Stats(msgspec.Struct, **_OPTS):
    seq: int
    pool: dict[str, int]
    models: list[str]
    running: int  # requests this worker relays
    engine_requests: int = 0  # sequences the engines hold (KV allocated or waiting)
    kv_usage: dict[str, float] = {}  # model -> fraction of its KV region's blocks in use
    host_copies: dict[str, int] = {}  # Warm models here -> bytes of their host copies
    # model -> its engine's counters since it was loaded: steps (each reads the weights once),
    # decode tokens, seconds in the forward pass; the server's own count of the work done
    engine: dict[str, tuple[int, int, float]] = {}
    # where -> errors the worker caught on the request path and went on after, since it
    # started (engine/worker_log.py Caught: abort, tokenize); the daemon counts the growth
    errors: dict[str, int] = {}


class Pong(msgspec.Struct, **_OPTS):
    """`busy_s`: how long the main thread has been inside one step or command (0 when it
    waits for work): a reader thread that answers while a step never ends is a hung worker."""

    seq: int
    busy_s: float = 0.0


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


class KVReady(msgspec.Struct, **_OPTS):
    """P/D: a prefill-role engine finished `req_id`'s prefill (its first token went out
    in the StepBatch before this frame) and holds the KV for a decode worker to read
    from `session` (this worker's Mooncake session) at `global_base` + offsets."""

    req_id: int
    kv: KVExport
    session: str
    global_base: int


class KVImported(msgspec.Struct, **_OPTS):
    """P/D: the decode worker holds `req_id`'s KV and is decoding it; the prefill side's
    blocks may be freed. `nbytes` moved in `seconds` (for the transfer metrics)."""

    req_id: int
    nbytes: int
    seconds: float


FromWorker = (
    Ready | ModelLoaded | ModelUnloaded | Tokenized | Stats | ErrorReply | StepBatch | RequestFailed | KVReady | KVImported
    | Pong | StateSet | WeightsPublished | GroupOpened
)

Reply = ModelLoaded | ModelUnloaded | Stats | ErrorReply | Pong | StateSet | WeightsPublished | GroupOpened


def to_worker_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(ToWorker)


def from_worker_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(FromWorker)

"""What a local tensor-parallel group's driver (engine/tp/group.py) and its leader shard
(rank 0, engine/tp/proc.py) say to each other: msgspec Structs in length-prefixed
msgpack frames (wire/framing.py), no pickle. The followers hear from the leader only
(its process group)."""

from __future__ import annotations

from typing import Literal

import msgspec

from janusd.engine.types import SamplingParams


class Load(msgspec.Struct, tag=True, kw_only=True):
    """Load a model on every shard of the group (each into its own device's pool); a group
    holds several models under their names, as a device does."""

    spec: str
    name: str = "m"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_model_len: int = 512
    kv_cache_mib: int = 16
    block_size: int = 16
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    cache_dir: str = ""


class Generate(msgspec.Struct, tag=True, kw_only=True):
    """Run the prompts to completion. `logits`: send back every sampled row's float32
    logits (the first is the prefill's last row); `stream`: an Out frame per token."""

    prompts: dict[str, list[int]]
    params: SamplingParams
    model: str = "m"
    logits: bool = False
    stream: bool = False


class Bench(msgspec.Struct, tag=True, kw_only=True):
    """Time prefill and decode steps of `batch` sequences on the loaded model, and a bare
    all-reduce of one step's hidden rows (engine/tp/proc.py Leader.bench)."""

    model: str = "m"
    batch: int = 1
    prompt_len: int = 32
    decode_steps: int = 16
    prefill_reps: int = 3
    allreduce_reps: int = 200


class Stop(msgspec.Struct, tag=True):
    pass


class Unload(msgspec.Struct, tag=True):
    name: str


class ShardInfo(msgspec.Struct, kw_only=True):
    """What one shard loaded: its weight segment's bytes, the checkpoint bytes it read,
    the shapes it holds (HF names) and its KV bytes per token."""

    rank: int
    device: str
    weight_bytes: int = 0
    bytes_read: int = 0
    kv_bytes_per_token: int = 0
    shapes: dict[str, list[int]] = {}
    error: str | None = None


class Loaded(msgspec.Struct, tag=True, kw_only=True):
    name: str
    shards: list[ShardInfo]
    vocab_size: int
    eos_token_ids: list[int]


class Out(msgspec.Struct, tag=True, kw_only=True):
    req_id: str
    token_ids: list[int]
    text: str = ""


class Generated(msgspec.Struct, tag=True, kw_only=True):
    token_ids: dict[str, list[int]]
    text: dict[str, str]
    finish_reason: dict[str, str | None]
    logits: dict[str, bytes] = {}  # float32 [rows, vocab], row-major
    errors: dict[str, str] = {}


class BenchResult(msgspec.Struct, tag=True, kw_only=True):
    figures: dict[str, float]


class Error(msgspec.Struct, tag=True):
    message: str


class Stopped(msgspec.Struct, tag=True):
    pass


class Unloaded(msgspec.Struct, tag=True):
    name: str


ToLeader = Load | Unload | Generate | Bench | Stop
FromLeader = Loaded | Unloaded | Out | Generated | BenchResult | Error | Stopped

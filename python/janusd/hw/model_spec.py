"""What a model costs: parameters, weight and KV bytes, FLOPs and bytes per prefill token
and per decode step, counted from its config (a llama-family decoder: GQA attention,
gated MLP).

Built from a mapping with HF config.json keys (hidden_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, head_dim, intermediate_size, vocab_size,
tie_word_embeddings, torch_dtype/dtype). The engine's ModelArch uses the same names, so
`ModelSpec.from_config(msgspec.to_builtins(arch))` and an HF config.json give the same
spec. The dtype the engine actually runs in (config `dtype`) overrides the file's.

Counting rules (the usual transformer-inference arithmetic, e.g. Kaplan et al. 2020 and
the roofline notes of "LLM Inference Unveiled", Yuan et al. 2024):
- a token through a linear layer of n parameters costs 2n FLOPs; every linear layer and
  the LM head run for every token (the embedding is a lookup: no FLOPs);
- attention at context c costs 4 * layers * heads * head_dim * c FLOPs per token
  (QK^T and AV); a prefill of L new tokens after c cached ones sums that over positions;
- a step reads every weight once (whatever the batch) and the KV of every context token
  of every sequence in it, and writes the new tokens' KV. Norms, RoPE, softmax and
  activations are left out: they are a few percent of either figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

import msgspec

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8": 1, "int8": 1}


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    """A model's shape; the derived sizes are computed once per spec (cached_property on
    the struct's __dict__: the oracle's prior asks for them millions of times a run)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    dtype_bytes: int

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], dtype: str | None = None) -> ModelSpec:
        """From HF config.json keys (see module doc); ValueError naming a missing or bad key."""
        def num(key: str, default: int | None = None) -> int:
            v = cfg.get(key, default)
            if v is None:
                raise ValueError(f"model config: missing key {key!r}")
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"model config: {key} must be a positive integer, got {v!r}")
            return v

        heads = num("num_attention_heads")
        hidden = num("hidden_size")
        name = dtype or cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
        if name == "auto":  # packed Q4 weights are counted as float32 here (not yet their own bytes)
            name = cfg.get("torch_dtype") or "float32"
        if name not in DTYPE_BYTES:
            raise ValueError(f"model config: unknown dtype {name!r} (known: {', '.join(DTYPE_BYTES)})")
        return cls(
            layers=num("num_hidden_layers"), hidden=hidden, heads=heads,
            kv_heads=num("num_key_value_heads", heads), head_dim=num("head_dim", cfg.get("head_dim") or hidden // heads),
            intermediate=num("intermediate_size"), vocab=num("vocab_size"),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), dtype_bytes=DTYPE_BYTES[name],
        )  # fmt: skip

    # ---- sizes
    @cached_property
    def layer_linear_params(self) -> int:
        h, d = self.hidden, self.head_dim
        attn = h * self.heads * d * 2 + h * self.kv_heads * d * 2  # q, o; k, v
        return attn + 3 * h * self.intermediate

    @cached_property
    def params(self) -> int:
        """Stored parameters (norm weights included, biases left out)."""
        embed = self.vocab * self.hidden
        norms = self.layers * 2 * self.hidden + self.hidden
        return embed * (1 if self.tied_embeddings else 2) + self.layers * self.layer_linear_params + norms

    @cached_property
    def matmul_params(self) -> int:
        """Parameters every token multiplies by: all linear layers and the LM head."""
        return self.layers * self.layer_linear_params + self.vocab * self.hidden

    @cached_property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @cached_property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @cached_property
    def allreduce_bytes_per_token(self) -> int:
        """Bytes a tensor-parallel instance all-reduces per token: two all-reduces per layer
        (after attention, after the MLP: Megatron-style, engine/tp/) of one hidden vector
        in the serving dtype (hw/spec.py allreduce_s turns them into seconds)."""
        return 2 * self.layers * self.hidden * self.dtype_bytes

    @cached_property
    def tp_collectives_per_step(self) -> int:
        """Collectives a tensor-parallel instance's engine step runs (engine/tp/shard.py,
        `janus bench tp`'s count plus the announcement): the embedding's all-reduce, two per
        layer, the logits' all-gather and the leader's step announcement (a broadcast).
        Each pays the link's latency (hw/spec.py tp_comm_s) whatever its bytes."""
        return 2 * self.layers + 3

    @cached_property
    def _attn_flops_per_ctx(self) -> int:
        return 4 * self.layers * self.heads * self.head_dim

    # ---- work
    def prefill_flops(self, tokens: float, context: float = 0.0) -> float:
        """FLOPs of prefilling `tokens` new tokens after `context` cached ones. The LM head
        runs on the one row that samples, not on every prompt token (engine/runner.py takes
        the logits of the sampling rows only): for SmolLM2-135M's 49152 x 576 head that is
        a fifth of a long prompt's matmul FLOPs that are never done."""
        pairs = tokens * context + tokens * (tokens + 1) / 2.0
        head = self.vocab * self.hidden
        return 2.0 * ((self.matmul_params - head) * tokens + head * min(tokens, 1.0)) + self._attn_flops_per_ctx * pairs

    def prefill_bytes(self, tokens: float, context: float = 0.0) -> float:
        """Bytes one prefill step moves: the weights, the cached KV read, the new KV written."""
        return float(self.weight_bytes) + self.kv_bytes_per_token * (context + tokens)

    def decode_step_flops(self, batch: float, total_context: float) -> float:
        """FLOPs of one decode step of `batch` sequences holding `total_context` tokens in all."""
        return 2.0 * self.matmul_params * batch + self._attn_flops_per_ctx * total_context

    def decode_step_bytes(self, batch: float, total_context: float) -> float:
        """Bytes of one decode step: the weights once, every sequence's KV, one new KV each."""
        return float(self.weight_bytes) + self.kv_bytes_per_token * (total_context + batch)

    def identity(self) -> dict[str, Any]:
        """The fields plus the derived sizes (stored in profiles: which model was measured)."""
        return {**msgspec.to_builtins(self), "params": self.params, "weight_bytes": self.weight_bytes,
                "kv_bytes_per_token": self.kv_bytes_per_token}

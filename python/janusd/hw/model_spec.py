"""What a model costs: parameters, weight and KV bytes, FLOPs and bytes per prefill token
and per decode step, counted from its config (a llama-family decoder: GQA attention,
gated MLP; or a DeepSeek-style one: multi-head latent attention, mixture-of-experts MLPs).

Built from a mapping with HF config.json keys (hidden_size, num_hidden_layers,
num_attention_heads, num_key_value_heads, head_dim, intermediate_size, vocab_size,
tie_word_embeddings, torch_dtype/dtype; for MLA q_lora_rank, kv_lora_rank, qk_nope_head_dim,
qk_rope_head_dim, v_head_dim; for experts n_routed_experts / num_experts / num_local_experts,
num_experts_per_tok, n_shared_experts, moe_intermediate_size, first_k_dense_replace). The
engine's ModelArch uses the same names, so
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
- a mixture of experts stores every expert and multiplies each token by its routed ones and
  the shared ones (plus the router); a step is still charged every stored weight once, as the
  simulator's performance model charges it (at a serving batch most experts are touched);
- multi-head latent attention (DeepSeek-V2/V3) caches kv_lora_rank + qk_rope_head_dim values
  per layer per token, and its attention costs 2 * heads * (qk dim + v dim) FLOPs per pair.
KV and the all-reduced activations are `activation_bytes` wide (a float8 checkpoint runs
its activations and KV in bfloat16); 0 means the weights' width.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

import msgspec

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8": 1, "int8": 1}


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True, dict=True, omit_defaults=True):
    """A model's shape; the derived sizes are computed once per spec (cached_property on
    the struct's __dict__: the oracle's prior asks for them millions of times a run). The
    MLA and expert fields default to 0 (a dense GQA model) and are left out of the builtins
    form then, so a dense model's stored identity is what it was before they existed."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int  # q/k dim per head (MLA: qk_nope_head_dim + qk_rope_head_dim)
    intermediate: int
    vocab: int
    tied_embeddings: bool
    dtype_bytes: int
    activation_bytes: int = 0  # KV and all-reduce width; 0: dtype_bytes
    q_lora_rank: int = 0  # MLA: 0 with kv_lora_rank > 0 means q is projected at full rank
    kv_lora_rank: int = 0  # > 0: multi-head latent attention
    rope_head_dim: int = 0
    v_head_dim: int = 0  # 0: head_dim
    experts: int = 0  # routed experts per MoE layer; 0: a dense MLP everywhere
    experts_per_token: int = 0
    shared_experts: int = 0
    expert_intermediate: int = 0
    dense_layers: int = 0  # the first layers keep a dense MLP (first_k_dense_replace)
    stored_bytes: int = 0  # the weights' resident bytes when they are kept quantized; 0: params * dtype_bytes

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
        if name == "auto":  # the float width; kept-quantized weights: `stored_bytes` (with_stored_bytes)
            name = cfg.get("torch_dtype") or "float32"
        if name not in DTYPE_BYTES:
            raise ValueError(f"model config: unknown dtype {name!r} (known: {', '.join(DTYPE_BYTES)})")
        return cls(
            layers=num("num_hidden_layers"), hidden=hidden, heads=heads,
            kv_heads=num("num_key_value_heads", heads), head_dim=_qk_dim(cfg, num, hidden // heads),
            intermediate=num("intermediate_size"), vocab=num("vocab_size"),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), dtype_bytes=DTYPE_BYTES[name],
            **_mla_and_experts(cfg, num),
        )  # fmt: skip

    # ---- sizes
    @cached_property
    def _act_bytes(self) -> int:
        return self.activation_bytes or self.dtype_bytes

    @cached_property
    def _v_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @cached_property
    def attention_params(self) -> int:
        """One layer's attention projections (q, k, v, o; MLA's down and up projections)."""
        h, d, n = self.hidden, self.head_dim, self.heads
        if not self.kv_lora_rank:
            return h * n * d * 2 + h * self.kv_heads * d * 2  # q, o; k, v
        q = h * self.q_lora_rank + self.q_lora_rank * n * d if self.q_lora_rank else h * n * d
        kv = h * (self.kv_lora_rank + self.rope_head_dim) + self.kv_lora_rank * n * (d - self.rope_head_dim + self._v_dim)
        return q + kv + n * self._v_dim * h

    @cached_property
    def _moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    def _expert_mlp_params(self, experts: int) -> int:
        """An MoE layer's MLP params over `experts` routed experts (shared ones and the router added)."""
        return (experts + self.shared_experts) * 3 * self.hidden * self.expert_intermediate + self.hidden * self.experts

    @cached_property
    def params(self) -> int:
        """Stored parameters (norm weights included, biases left out)."""
        embed = self.vocab * self.hidden
        norms = self.layers * 2 * self.hidden + self.hidden
        dense = self.layers - self._moe_layers
        mlp = dense * 3 * self.hidden * self.intermediate + self._moe_layers * self._expert_mlp_params(self.experts)
        return embed * (1 if self.tied_embeddings else 2) + self.layers * self.attention_params + mlp + norms

    @cached_property
    def matmul_params(self) -> int:
        """Parameters every token multiplies by: all linear layers (routed experts: the
        token's own) and the LM head."""
        dense = self.layers - self._moe_layers
        mlp = (dense * 3 * self.hidden * self.intermediate
               + self._moe_layers * self._expert_mlp_params(self.experts_per_token))
        return self.layers * self.attention_params + mlp + self.vocab * self.hidden

    @cached_property
    def weight_bytes(self) -> int:
        """What a step reads of the weights and a copy moves: the kept-quantized bytes
        (Q4 nibbles and scales, Q8_0 blocks: the engine's weight plan) when the checkpoint
        is served quantized, else every parameter at the float width."""
        return self.stored_bytes or self.params * self.dtype_bytes

    @cached_property
    def kv_bytes_per_token(self) -> int:
        if self.kv_lora_rank:
            return self.layers * (self.kv_lora_rank + self.rope_head_dim) * self._act_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * self._act_bytes

    @cached_property
    def allreduce_bytes_per_token(self) -> int:
        """Bytes a tensor-parallel instance all-reduces per token: two all-reduces per layer
        (after attention, after the MLP: Megatron-style, engine/tp/) of one hidden vector
        in the activations' dtype (hw/spec.py allreduce_s turns them into seconds)."""
        return 2 * self.layers * self.hidden * self._act_bytes

    @cached_property
    def tp_collectives_per_step(self) -> int:
        """Collectives a tensor-parallel instance's engine step runs (engine/tp/shard.py,
        `janus bench tp`'s count plus the announcement): the embedding's all-reduce, two per
        layer, the logits' all-gather and the leader's step announcement (a broadcast).
        Each pays the link's latency (hw/spec.py tp_comm_s) whatever its bytes."""
        return 2 * self.layers + 3

    @cached_property
    def attn_flops_per_ctx(self) -> int:
        """Attention FLOPs per (new token, context token) pair: QK^T and AV in every layer."""
        return 2 * self.layers * self.heads * (self.head_dim + self._v_dim)

    # ---- work
    def prefill_flops(self, tokens: float, context: float = 0.0) -> float:
        """FLOPs of prefilling `tokens` new tokens after `context` cached ones. The LM head
        runs on the one row that samples, not on every prompt token (engine/runner.py takes
        the logits of the sampling rows only): for SmolLM2-135M's 49152 x 576 head that is
        a fifth of a long prompt's matmul FLOPs that are never done."""
        pairs = tokens * context + tokens * (tokens + 1) / 2.0
        head = self.vocab * self.hidden
        return 2.0 * ((self.matmul_params - head) * tokens + head * min(tokens, 1.0)) + self.attn_flops_per_ctx * pairs

    def prefill_bytes(self, tokens: float, context: float = 0.0) -> float:
        """Bytes one prefill step moves: the weights, the cached KV read, the new KV written."""
        return float(self.weight_bytes) + self.kv_bytes_per_token * (context + tokens)

    def decode_step_flops(self, batch: float, total_context: float) -> float:
        """FLOPs of one decode step of `batch` sequences holding `total_context` tokens in all."""
        return 2.0 * self.matmul_params * batch + self.attn_flops_per_ctx * total_context

    def decode_step_bytes(self, batch: float, total_context: float) -> float:
        """Bytes of one decode step: the weights once, every sequence's KV, one new KV each."""
        return float(self.weight_bytes) + self.kv_bytes_per_token * (total_context + batch)

    def identity(self) -> dict[str, Any]:
        """The fields plus the derived sizes (stored in profiles: which model was measured)."""
        return {**msgspec.to_builtins(self), "params": self.params, "weight_bytes": self.weight_bytes,
                "kv_bytes_per_token": self.kv_bytes_per_token}


def _qk_dim(cfg: Mapping[str, Any], num: Any, default: int) -> int:
    """q/k dim per head: MLA's nope + rope parts, else head_dim (default hidden / heads)."""
    if cfg.get("kv_lora_rank"):
        return int(num("qk_nope_head_dim")) + int(num("qk_rope_head_dim"))
    return int(num("head_dim", cfg.get("head_dim") or default))


def _mla_and_experts(cfg: Mapping[str, Any], num: Any) -> dict[str, int]:
    """The MLA and expert fields of an HF config (none for a dense GQA model)."""
    out: dict[str, int] = {}
    if cfg.get("kv_lora_rank"):
        out.update(kv_lora_rank=num("kv_lora_rank"), rope_head_dim=num("qk_rope_head_dim"),
                   v_head_dim=num("v_head_dim"), q_lora_rank=int(cfg.get("q_lora_rank") or 0))
    experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts")
    if experts:
        key = next(k for k in ("n_routed_experts", "num_experts", "num_local_experts") if cfg.get(k))
        out.update(experts=num(key), experts_per_token=num("num_experts_per_tok"),
                   shared_experts=int(cfg.get("n_shared_experts") or 0),
                   expert_intermediate=num("moe_intermediate_size", cfg.get("intermediate_size")),
                   dense_layers=int(cfg.get("first_k_dense_replace") or 0))
        if out["experts_per_token"] > out["experts"]:
            raise ValueError(f"model config: num_experts_per_tok {out['experts_per_token']} exceeds the "
                             f"{out['experts']} experts")
        if out["dense_layers"] >= num("num_hidden_layers"):
            raise ValueError(f"model config: first_k_dense_replace {out['dense_layers']} leaves no expert layer "
                             f"of {num('num_hidden_layers')}")
    return out

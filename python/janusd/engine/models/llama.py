"""The Llama family forward: Llama 2/3 (incl. llama3 RoPE scaling), Mistral, Qwen2
(q/k/v bias) and Qwen3 (per-head q/k RMSNorm) differ only in flags of one module.

Weights are not owned here: they are zero-copy views into the model's xTensor weight
segment (see weights.py), so the model is a plain object holding tensors rather than an
nn.Module of Parameters. The forward takes a packed batch of rows (tokens of several
sequences, see attention.py) and the per-layer KV cache views, and returns hidden
states; `logits` applies the final norm and the LM head to the rows that sample.
Numerics follow HF: RMSNorm in float32, RoPE tables in float32 cast to the model dtype.

Tensor parallelism (engine/tp/): with a `shard` the weights are that shard's slices
(engine/tp/layout.py) and the forward is Megatron's: the shard's own query and KV heads
and its part of the MLP, the products of o and down are partial sums completed by one
all-reduce each, the embedding is vocab-parallel (a masked lookup summed over shards) and
the LM head's logits are gathered. `shard` is duck-typed (engine/tp/shard.py TPShard:
`layout`, `all_reduce`, `gather_vocab`) so this module never imports torch.distributed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from janusd.engine.models import qkernel
from janusd.engine.models.attention import AttnBatch, paged_attention
from janusd.engine.models.linear import linear
from janusd.engine.models.native_step import NativeDecode
from janusd.engine.models.qlinear import nbytes
from janusd.engine.models.rope import RotaryTable, apply_rotary
from janusd.engine.types import EngineError

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, add: torch.Tensor | None = None) -> torch.Tensor:
    """HF's RMSNorm of x (after x += add, in place, when given). Contiguous float32 rows on cpu
    take one native call (qkernel.add_rms_norm: torch 2.15's fused rms_norm is six ops there,
    ~50 us a row); other float32 ones torch's fused kernel (the same arithmetic; sums in
    another order); in a half dtype HF rounds the normalized row before the weight
    multiplies it, which the fused kernel does not."""
    if qkernel.native_norm_fits(x, weight) and (add is None or add.is_contiguous()):
        return qkernel.add_rms_norm(x, add, weight, eps)
    if add is not None:
        x.add_(add)
    dtype = x.dtype
    if dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


class _Layer:
    __slots__ = ("ln1", "ln2", "qkv_w", "qkv_b", "o_w", "q_norm", "k_norm", "gate_up_w", "down_w")

    def __init__(self, w: Mapping[str, torch.Tensor], p: str) -> None:
        self.ln1 = w[p + "input_layernorm.weight"]
        self.ln2 = w[p + "post_attention_layernorm.weight"]
        self.qkv_w = w[p + "self_attn.qkv_proj.weight"]
        self.qkv_b = w.get(p + "self_attn.qkv_proj.bias")
        self.o_w = w[p + "self_attn.o_proj.weight"]
        self.q_norm = w.get(p + "self_attn.q_norm.weight")
        self.k_norm = w.get(p + "self_attn.k_norm.weight")
        self.gate_up_w = w[p + "mlp.gate_up_proj.weight"]
        self.down_w = w[p + "mlp.down_proj.weight"]


class LlamaModel:
    """One module for the whole family; `arch` is a ModelArch (janusd.engine.loader)."""

    def __init__(self, arch: Any, weights: Mapping[str, torch.Tensor], max_positions: int | None = None,
                 shard: Any = None) -> None:
        """`arch`: the whole model's ModelArch; `shard`: None on one device, else this
        shard's TPShard (its weights are the shard's slices)."""
        if arch.architecture not in SUPPORTED_ARCHS:
            raise EngineError(f"architecture {arch.architecture!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
        if arch.num_attention_heads % arch.num_key_value_heads:
            raise EngineError("num_attention_heads must be a multiple of num_key_value_heads")
        self.arch = arch
        self.embed = weights["model.embed_tokens.weight"]
        self.lm_head = weights["lm_head.weight"]
        self.norm = weights["model.norm.weight"]
        self.dtype = self.norm.dtype  # the activations' (a packed plan's embedding may be float16)
        self.device = self.embed.device
        self.layers = [_Layer(weights, f"model.layers.{i}.") for i in range(arch.num_hidden_layers)]
        self.shard = shard
        local = shard.layout.local if shard is not None else arch  # this device's part of the model
        self.nq, self.nkv, self.hd = local.num_attention_heads, local.num_key_value_heads, arch.head_dim
        self.q_size, self.kv_size = self.nq * self.hd, self.nkv * self.hd
        self.inter = local.intermediate_size
        self.eps = float(arch.rms_norm_eps)
        n_pos = min(max_positions or arch.max_position_embeddings, arch.max_position_embeddings)
        self.rope = RotaryTable(self.hd, float(arch.rope_theta), arch.rope_scaling, n_pos, self.dtype, self.device)
        # weights still being copied in (an overlapped restore, engine/restore.py Landing): the
        # forward waits for each layer's group before it uses it; None once all are in
        self.landing: Any = None
        # batch-1 decode steps in one native call when the weights fit (native_step.py)
        self.native = NativeDecode.bind(self)

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights a decode step reads (all matrices, packed ones as packed, the LM
        head; one embedding row)."""
        total = nbytes(self.lm_head) + nbytes(self.norm)
        for layer in self.layers:
            for t in (layer.ln1, layer.ln2, layer.qkv_w, layer.qkv_b, layer.o_w, layer.q_norm, layer.k_norm,
                      layer.gate_up_w, layer.down_w):
                if t is not None:
                    total += nbytes(t)
        return total + nbytes(self.embed) // self.embed.shape[0]  # one embedding row

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnBatch,
                kv: Sequence[tuple[torch.Tensor, torch.Tensor]] | None) -> torch.Tensor:
        """input_ids, positions: [T] long. kv[l] = (k_cache, v_cache) views of layer l, or
        None for a cache-less forward (prefills only). Returns hidden states [T, hidden]."""
        if int(positions.max()) >= self.rope.max_positions:
            raise EngineError(f"position {int(positions.max())} exceeds the model's {self.rope.max_positions} positions")
        if self.native is not None:
            out = self.native.run(input_ids, positions, meta, kv)
            if out is not None:
                return out
        landing = self.landing
        if landing is not None:
            landing.wait(0)
        shard = self.shard
        h = self._embed_shard(input_ids) if shard is not None else self.embed_rows(input_ids)
        cos, sin = self.rope.lookup(positions)
        t = input_ids.shape[0]
        nqk = self.nq + self.nkv
        m: torch.Tensor | None = None  # the last layer's MLP output, added to h by the next norm
        for i, layer in enumerate(self.layers):
            if landing is not None:
                landing.wait(1 + i)
            x = rms_norm(h, layer.ln1, self.eps, add=m)
            qkv = linear(x, layer.qkv_w, layer.qkv_b)
            qk = qkv[:, : self.q_size + self.kv_size].view(t, nqk, self.hd)
            v = qkv[:, self.q_size + self.kv_size :].reshape(t, self.nkv, self.hd)
            if layer.q_norm is not None and layer.k_norm is not None:
                qk = torch.cat([rms_norm(qk[:, : self.nq], layer.q_norm, self.eps),
                                rms_norm(qk[:, self.nq :], layer.k_norm, self.eps)], dim=1)
            qk = apply_rotary(qk, cos, sin)  # q's and k's heads in one pass
            kc, vc = kv[i] if kv is not None else (None, None)
            a = paged_attention(qk[:, : self.nq], qk[:, self.nq :], v, kc, vc, meta)
            o = linear(a.view(t, self.q_size), layer.o_w)
            if shard is not None:
                shard.all_reduce(o)  # row-parallel o: each shard's heads give a partial sum
            # h is this forward's own tensor (the embedding lookup's output): o added in place
            x = rms_norm(h, layer.ln2, self.eps, add=o)
            gu = linear(x, layer.gate_up_w)
            g = F.silu(gu[:, : self.inter])
            m = linear(g.mul_(gu[:, self.inter :]), layer.down_w)
            if shard is not None:
                shard.all_reduce(m)  # row-parallel down
        if m is not None:
            h.add_(m)
        return h

    def embed_rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T, hidden] in the activations' dtype, a new tensor (the forward adds to it in place)."""
        if isinstance(self.embed, torch.Tensor):
            return F.embedding(input_ids, self.embed).to(self.dtype)
        return self.embed.rows(input_ids).to(self.dtype)  # a quantized embedding (q8.Q8Matrix): its rows dequantized

    def _embed_shard(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel lookup: this shard's rows for the ids it holds, zeros for the rest,
        summed over the shards (exact: one shard contributes each row)."""
        lay = self.shard.layout
        local = input_ids - lay.vocab_start
        mine = (local >= 0) & (local < lay.vocab_rows)
        h = F.embedding(torch.where(mine, local, 0), self.embed).masked_fill_(~mine.unsqueeze(1), 0)
        self.shard.all_reduce(h)
        return h

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [n, vocab] for the given rows of hidden states."""
        if self.landing is not None:
            self.landing.wait(len(self.layers) + 1)
            if self.landing.done:
                self.landing = None
        out = linear(rms_norm(hidden, self.norm, self.eps), self.lm_head).float()
        if self.shard is not None:  # vocab-parallel LM head: every shard's columns, padding cut
            out = self.shard.gather_vocab(out)
        return out

"""Which slice of every tensor shard `rank` of `tp` holds (Megatron-style), pure: no torch.

- q/k/v and gate/up are column-parallel (their output rows are split): shard r holds the
  q rows of heads [r * nq/tp, (r+1) * nq/tp), the k/v rows of its KV heads, and rows
  [r * I/tp, (r+1) * I/tp) of gate and up (the biases of q/k/v the same way);
- o and down are row-parallel (their input columns are split the same way), so each
  shard's product is a partial sum: one all-reduce after attention, one after the MLP;
- KV heads: nkv/tp per shard when tp divides nkv; when nkv < tp (tp a multiple of nkv)
  every shard holds one KV head, replicated on the tp/nkv shards whose query heads use it
  (query head j uses KV head j // (nq/nkv), so shard r's KV head is r // (tp/nkv));
- the embedding and the LM head are vocab-parallel: shard r holds rows [r * P, (r+1) * P)
  of the vocabulary, P = ceil(vocab/tp); the last shard's rows past the vocabulary are
  zero padding (so every shard's plan has the same shape, and the logits gather is of
  equal pieces). The embedding lookup sums over shards (one all-reduce per step), the
  LM head's logits are gathered;
- norms (and Qwen3's per-head q/k norms) are replicated.

A model whose head counts do not divide is refused (TPError naming the numbers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

# Slice = (dim, start, stop): the HF tensor's rows (dim 0) or columns (dim 1) [start, stop)
from janusd.engine.checkpoint.base import Slice, sliced_shape

__all__ = ["ShardLayout", "Slice", "TPError", "check_tp", "sliced_shape"]


class TPError(ValueError):
    """A model cannot be split `tp` ways; the message names the numbers that do not divide."""


def check_tp(arch: Any, tp: int, where: str = "model") -> None:
    """Raise TPError unless `arch` can be split into `tp` shards."""
    if not isinstance(tp, int) or tp < 1:
        raise TPError(f"{where}: tp must be a positive integer, got {tp!r}")
    if tp == 1:
        return
    nq, nkv, inter = arch.num_attention_heads, arch.num_key_value_heads, arch.intermediate_size
    if nq % tp:
        raise TPError(f"{where}: num_attention_heads {nq} is not divisible by tp {tp} "
                      f"(tp must divide the attention heads: one of {_divisors(nq)})")
    if nkv % tp and tp % nkv:
        raise TPError(f"{where}: num_key_value_heads {nkv} and tp {tp}: neither divides the other (KV heads "
                      f"are split when tp divides them and replicated when they divide tp)")
    if inter % tp:
        raise TPError(f"{where}: intermediate_size {inter} is not divisible by tp {tp}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class ShardLayout:
    """Shard `rank` of `tp` for `arch` (a ModelArch). `local` is the shard's own ModelArch
    (its head counts, intermediate size and padded vocabulary slice): the weight plan, the
    KV cache and the forward of a shard are built from it."""

    arch: Any
    tp: int
    rank: int

    def __post_init__(self) -> None:
        check_tp(self.arch, self.tp)
        if not 0 <= self.rank < self.tp:
            raise TPError(f"rank {self.rank} is outside [0, {self.tp})")

    # ---- counts ----
    @property
    def q_heads(self) -> int:
        return self.arch.num_attention_heads // self.tp

    @property
    def kv_heads(self) -> int:
        return max(1, self.arch.num_key_value_heads // self.tp)

    @property
    def kv_head0(self) -> int:
        """The first KV head (of the model's) this shard holds."""
        nkv = self.arch.num_key_value_heads
        if nkv >= self.tp:
            return self.rank * self.kv_heads
        return self.rank // (self.tp // nkv)

    @property
    def kv_replicas(self) -> int:
        """How many shards hold each KV head (1: split, tp/nkv: replicated)."""
        return max(1, self.tp // self.arch.num_key_value_heads)

    @property
    def inter(self) -> int:
        return self.arch.intermediate_size // self.tp

    @property
    def vocab_per(self) -> int:
        return -(-self.arch.vocab_size // self.tp)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_per

    @property
    def vocab_rows(self) -> int:
        """Real vocabulary rows on this shard (< vocab_per on the last shard: padding)."""
        return max(0, min(self.arch.vocab_size, self.vocab_start + self.vocab_per) - self.vocab_start)

    @property
    def local(self) -> Any:
        return msgspec.structs.replace(self.arch, num_attention_heads=self.q_heads, num_key_value_heads=self.kv_heads,
                                       intermediate_size=self.inter, vocab_size=self.vocab_per)

    # ---- slices ----
    def slices(self, names: Any) -> dict[str, Slice | None]:
        """name -> the slice of the HF tensor this shard reads (None: the whole tensor)."""
        return {n: self.slice_of(n) for n in names}

    def slice_of(self, name: str) -> Slice | None:
        d = self.arch.head_dim
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return (0, self.vocab_start, self.vocab_start + self.vocab_rows)
        if not name.startswith("model.layers."):
            return None  # model.norm
        kind = name.split(".", 3)[3]
        if kind.startswith("self_attn.q_proj."):
            return (0, self.rank * self.q_heads * d, (self.rank + 1) * self.q_heads * d)
        if kind.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
            return (0, self.kv_head0 * d, (self.kv_head0 + self.kv_heads) * d)
        if kind == "self_attn.o_proj.weight":
            return (1, self.rank * self.q_heads * d, (self.rank + 1) * self.q_heads * d)
        if kind in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
            return (0, self.rank * self.inter, (self.rank + 1) * self.inter)
        if kind == "mlp.down_proj.weight":
            return (1, self.rank * self.inter, (self.rank + 1) * self.inter)
        return None  # norms, q_norm / k_norm

    def local_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of `name` on this shard (the vocabulary slice padded to vocab_per)."""
        sl = self.slice_of(name)
        if sl is None:
            return tuple(shape)
        dim, a, b = sl
        n = self.vocab_per if name in ("model.embed_tokens.weight", "lm_head.weight") else b - a
        return tuple(n if i == dim else s for i, s in enumerate(shape))

    def local_specs(self, specs: dict[str, tuple[tuple[int, ...], str]]) -> dict[str, tuple[tuple[int, ...], str]]:
        """A checkpoint's tensor_specs() as this shard sees them."""
        return {n: (self.local_shape(n, tuple(s)), dt) for n, (s, dt) in specs.items()}


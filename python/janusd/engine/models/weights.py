"""Where each weight lives inside a model's single weight segment.

The engine allocates ONE xTensor weight segment per model and every parameter is a
zero-copy view into it. The plan below places tensors at 64-byte aligned offsets and
lays q/k/v (and gate/up) of a layer back to back, so that the fused [q;k;v] and
[gate;up] matrices are themselves plain views: one matmul instead of three, without a
copy. Tied embeddings get one tensor that serves as both `embed_tokens` and `lm_head`.

A quantized plan (`quantized=True`, engine/models/qlinear.py) keeps each GGUF Q4_0/Q4_1
linear in 4 bits: the (fused) matrix NAME gets two slots of its own dtype, `NAME:packed`
(uint8 nibbles) and `NAME:scales` (float16 d, m), and `materialize` hands the forward a
Q4Linear over them under NAME. `plan.quant` says which HF tensor is packed into which
matrix at which row, for the loader (load_quantized). Q8_0 matrices of a quantized plan
(a Q8_0 file's linears, fused like the Q4 ones when all parts are Q8_0, and SmolLM2's
Q8_0 embedding / LM head) keep the file's blocks (`NAME:q8`, `NAME:q8scales`, a
q8.Q8Matrix under NAME; `plan.q8`, same form as `plan.quant`). An embedding / LM head
stored otherwise quantized or in half is float16 (qlinear.HEAD_DTYPE). Everything else
stays `plan.dtype`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from janusd.engine.types import EngineError

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Slot:
    """One tensor in the segment: `parent` names a fused view it is a row slice of."""

    offset: int
    shape: tuple[int, ...]
    parent: str | None = None
    row0: int = 0
    dtype: torch.dtype | None = None  # None: the plan's dtype

    def nbytes(self, plan_dtype: torch.dtype) -> int:
        return math.prod(self.shape) * _elt(self.dtype or plan_dtype)


def _elt(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class WeightPlan:
    total_bytes: int
    dtype: torch.dtype
    slots: dict[str, Slot] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)  # tied lm_head -> embed_tokens
    # packed Q4 tensors: HF name -> (the matrix it is packed into, its first row there)
    quant: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Q8_0 matrices kept as the file's blocks (q8.py): HF name -> (the matrix, its first row);
    # the matrix's slots are MATRIX:q8 and MATRIX:q8scales
    q8: dict[str, tuple[str, int]] = field(default_factory=dict)


def expected_shapes(arch: Any) -> dict[str, tuple[int, ...]]:
    """HF names and shapes the llama family needs for `arch` (a ModelArch)."""
    h, inter, d = arch.hidden_size, arch.intermediate_size, arch.head_dim
    nq, nkv = arch.num_attention_heads, arch.num_key_value_heads
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, h), "model.norm.weight": (h,)}
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = (arch.vocab_size, h)
    for i in range(arch.num_hidden_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"] = (nq * d, h)
        out[p + "self_attn.k_proj.weight"] = (nkv * d, h)
        out[p + "self_attn.v_proj.weight"] = (nkv * d, h)
        out[p + "self_attn.o_proj.weight"] = (h, nq * d)
        if arch.attention_bias:
            out[p + "self_attn.q_proj.bias"] = (nq * d,)
            out[p + "self_attn.k_proj.bias"] = (nkv * d,)
            out[p + "self_attn.v_proj.bias"] = (nkv * d,)
        if arch.qk_norm:
            out[p + "self_attn.q_norm.weight"] = (d,)
            out[p + "self_attn.k_norm.weight"] = (d,)
        out[p + "mlp.gate_proj.weight"] = (inter, h)
        out[p + "mlp.up_proj.weight"] = (inter, h)
        out[p + "mlp.down_proj.weight"] = (h, inter)
    return out


_HEADS = ("model.embed_tokens.weight", "lm_head.weight")  # a quantized plan may keep them in half (qlinear.HEAD_DTYPE)
_FUSED = (
    ("self_attn.qkv_proj.weight", ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")),
    ("self_attn.qkv_proj.bias", ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")),
    ("mlp.gate_up_proj.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
)


def plan_weights(arch: Any, specs: Mapping[str, tuple[Any, Any]], dtype: torch.dtype,
                 quantized: bool = False, quantize_to: str = "auto") -> WeightPlan:
    """Offsets for every tensor the model needs; checks the checkpoint's shapes.

    `specs` is `Checkpoint.tensor_specs()`: {hf_name: (shape, dtype_str)}. A needed tensor
    that is missing, or a shape that disagrees with the architecture, is an EngineError.
    `quantized`: keep the Q4_0/Q4_1 linears packed (module doc); a fused matrix is packed
    only when all its parts are. `quantize_to` (a config dtype: "int8", "int4") also keeps
    the float tensors quantized, in the blocks quantize_float.target names."""
    from janusd.engine.models.q8 import keeps_q8
    from janusd.engine.models.qlinear import head_dtype, packable
    from janusd.engine.models.quantize_float import target

    want = expected_shapes(arch)
    for name, shape in want.items():
        if name not in specs:
            raise EngineError(f"checkpoint lacks tensor {name!r}")
        got = tuple(int(s) for s in specs[name][0])
        if got != shape:
            raise EngineError(f"tensor {name!r}: checkpoint shape {got} != expected {shape} from the config")

    def kept(names: list[str]) -> Callable[..., int] | None:
        """How the matrix of `names` stays quantized (its placer), or None: plan.dtype."""
        if not (quantized and all(n.endswith(".weight") for n in names)):
            return None
        kept_as = [target(quantize_to, str(specs[n][1]), n in _HEADS) for n in names]
        if all(packable(want[n], f) for n, f in zip(names, kept_as)):
            return _place_q4
        if all(keeps_q8(want[n], f) for n, f in zip(names, kept_as)):
            return _place_q8
        return None

    elt = _elt(dtype)
    plan = WeightPlan(total_bytes=0, dtype=dtype)
    if arch.tie_word_embeddings:
        plan.aliases["lm_head.weight"] = "model.embed_tokens.weight"
    offset = 0
    placed: set[str] = set()
    for i in range(arch.num_hidden_layers):
        p = f"model.layers.{i}."
        for fused, parts in _FUSED:
            names = [p + x for x in parts]
            if not all(n in want for n in names):
                continue
            rows = sum(want[n][0] for n in names)
            tail = want[names[0]][1:]
            place = kept(names)
            if place is not None:
                offset = place(plan, offset, p + fused, names, (rows, *tail), want)
                placed.update(names)
                continue
            offset = _align(offset)
            plan.slots[p + fused] = Slot(offset, (rows, *tail))
            r = 0
            for n in names:
                plan.slots[n] = Slot(offset, want[n], parent=p + fused, row0=r)
                r += want[n][0]
                placed.add(n)
            numel = rows * math.prod(tail)
            offset += numel * elt
    for name, shape in want.items():
        if name in placed:
            continue
        place = kept([name]) if name.startswith("model.layers.") or name in _HEADS else None
        if place is not None and (place is _place_q8 or name not in _HEADS):
            offset = place(plan, offset, name, [name], shape, want)
            continue
        offset = _align(offset)
        plan.slots[name] = Slot(offset, shape, dtype=head_dtype(str(specs[name][1])) if quantized and name in _HEADS else None)
        offset += plan.slots[name].nbytes(dtype)
    plan.total_bytes = _align(offset)
    return plan


def _place_q4(plan: WeightPlan, offset: int, matrix: str, parts: list[str], shape: tuple[int, ...],
              want: Mapping[str, tuple[int, ...]]) -> int:
    """Slots `matrix:packed` and `matrix:scales` at `offset`; the parts' rows in plan.quant."""
    from janusd.engine.models.qlinear import SCALE_DTYPE, packed_shapes

    nib, sc = packed_shapes(shape[0], shape[1])
    return _place_blocks(plan, offset, matrix, ((":packed", nib, torch.uint8), (":scales", sc, SCALE_DTYPE)),
                         parts, want, plan.quant)


def _place_q8(plan: WeightPlan, offset: int, matrix: str, parts: list[str], shape: tuple[int, ...],
              want: Mapping[str, tuple[int, ...]]) -> int:
    """Slots `matrix:q8` (int8) and `matrix:q8scales` (float16) at `offset`; the parts' rows in plan.q8."""
    from janusd.engine.models.q8 import shapes

    qs, sc = shapes(shape[0], shape[1])
    return _place_blocks(plan, offset, matrix, ((":q8", qs, torch.int8), (":q8scales", sc, torch.float16)),
                         parts, want, plan.q8)


def _place_blocks(plan: WeightPlan, offset: int, matrix: str, slots: tuple[tuple[str, Any, torch.dtype], ...],
                  parts: list[str], want: Mapping[str, tuple[int, ...]], rows: dict[str, tuple[str, int]]) -> int:
    """A kept-quantized matrix's slots (suffix, shape, dtype), each aligned, from `offset`;
    each part's first row in `rows` (plan.quant or plan.q8). Returns the offset after them."""
    for suffix, sh, dt in slots:
        offset = _align(offset)
        plan.slots[matrix + suffix] = Slot(offset, sh, dtype=dt)
        offset += plan.slots[matrix + suffix].nbytes(plan.dtype)
    r = 0
    for n in parts:
        rows[n] = (matrix, r)
        r += want[n][0]
    return offset


def materialize(plan: WeightPlan, view: Callable[[int, tuple[int, ...], torch.dtype], torch.Tensor]) -> dict[str, Any]:
    """Tensors for every slot: `view(offset, shape, dtype)` gives a zero-copy tensor
    (WeightSegment.view for the real engine, a slice of a plain buffer in tests)."""
    out: dict[str, Any] = {}
    for name, slot in plan.slots.items():
        if slot.parent is None:
            out[name] = view(slot.offset, slot.shape, slot.dtype or plan.dtype)
    for name, slot in plan.slots.items():
        if slot.parent is not None:
            out[name] = out[slot.parent][slot.row0 : slot.row0 + slot.shape[0]]
    if plan.quant:
        from janusd.engine.models.qlinear import Q4Linear

        for matrix in {m for m, _ in plan.quant.values()}:
            out[matrix] = Q4Linear(out[matrix + ":packed"], out[matrix + ":scales"])
    if plan.q8:
        from janusd.engine.models.q8 import Q8Matrix

        for matrix in {m for m, _ in plan.q8.values()}:
            out[matrix] = Q8Matrix(out[matrix + ":q8"], out[matrix + ":q8scales"])
    for alias, target in plan.aliases.items():
        out[alias] = out[target]
    return out


def load_weights(ck: Any, plan: WeightPlan, views: Mapping[str, Any], slices: Mapping[str, Any] | None = None) -> None:
    """Fill `views` (materialize's) from the checkpoint: the float tensors in `plan.dtype`,
    the packed ones (plan.quant) as nibbles and scales (qlinear.load_packed), the Q8_0 ones
    (plan.q8) as the file's blocks (q8.load)."""
    ck.load_into(lambda n: views[n], plan.dtype, slices, skip=set(plan.quant) | set(plan.q8))
    if plan.quant:
        from janusd.engine.models.qlinear import load_packed

        load_packed(ck, plan.quant, dict(views))
    if plan.q8:
        from janusd.engine.models.q8 import load

        load(ck, plan.q8, dict(views))


def plain_buffer_view(total_bytes: int, device: torch.device | str = "cpu") -> Callable[[int, tuple[int, ...], torch.dtype], torch.Tensor]:
    """A `view` function over one ordinary torch byte buffer (tests, no pool)."""
    buf = torch.zeros(total_bytes, dtype=torch.uint8, device=device)

    def view(offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        elt = torch.empty((), dtype=dtype).element_size()
        return buf[offset : offset + math.prod(shape) * elt].view(dtype).view(shape)

    return view


def landing_groups(plan: WeightPlan, num_layers: int) -> list[list[tuple[int, int]]]:
    """The segment's bytes as (start, end) ranges in the order the forward reads them:
    group 0 the embedding, group 1 + i layer i, the last group everything else (the final
    norm, an untied LM head, alignment gaps), so that together they cover [0, total_bytes).
    An overlapped restore copies them in this order and the forward waits for group k
    only before it uses it (restore.Copier.copy_in_order, LlamaModel.forward)."""
    groups: list[list[tuple[int, int]]] = [[] for _ in range(num_layers + 2)]
    for name, slot in plan.slots.items():
        if slot.parent is not None:
            continue  # inside its fused parent's bytes
        if name.split(":")[0] == "model.embed_tokens.weight":  # also its q8 slots
            g = 0
        elif name.startswith("model.layers."):
            g = 1 + int(name.split(".")[2])
        else:
            continue
        groups[g].append((slot.offset, slot.offset + slot.nbytes(plan.dtype)))
    # an alignment gap (< ALIGN bytes) goes with the range before it, not as a piece of its own
    taken = sorted((a, b, g) for g, rs in enumerate(groups) for a, b in rs)
    for rs in groups:
        rs.clear()
    rest: list[tuple[int, int]] = []
    at = 0
    for k, (a, b, g) in enumerate(taken):
        if a > at:
            rest.append((at, a))
        nxt = taken[k + 1][0] if k + 1 < len(taken) else plan.total_bytes
        end = nxt if 0 < nxt - b < ALIGN else b
        groups[g].append((a, end))
        at = max(at, end)
    if at < plan.total_bytes:
        rest.append((at, plan.total_bytes))
    groups[-1] = rest
    return [_merge(g) for g in groups]


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out

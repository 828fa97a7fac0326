"""A batch-1 decode step of the Llama family in one native call (janus_core::decode).

Why: with the products native (qkernel.py), a SmolLM2 decode step still spent ~9 of ~28 ms
on this cpu in Python and torch dispatch around them: ~20 small ops a layer (norms,
rotary, slicing, SiLU, casts, the attention call's checks), 30 layers. Here every layer
runs in Rust with the GIL released; Python binds the layer weights' addresses once per
model (`bind`, checking each tensor) and per step checks only the step's shape and the KV
cache's geometry (once per cache).

Numerics: the Python forward's, op for op (the same product kernels, norm and attention;
rotary as x * cos + roll(x) * sin_rot; the residual added by the next norm): a step differs
from it only in SiLU's exp, libm's instead of torch's vectorized one (~1 ulp), so greedy
outputs equal the dequantized float32 model's as before (tests/test_engine_native_step.py).

Which steps: one sequence decoding alone (batch 1) on cpu, float32 activations and KV,
every layer's four matrices kept quantized (Q4 / Q8_0), no per-head q/k norm (Qwen3), one
device (no tensor-parallel shard), no sliding-window mask, all weights landed. Anything
else takes the Python forward. `JANUS_NATIVE_STEP=0` turns it off (A/B runs, debugging).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from janusd import _native

_PLAN: Any = getattr(_native, "DecodePlan", None)
_FMT = {"q4": 4, "q8": 8}


def enabled() -> bool:
    """The extension has the step and JANUS_NATIVE_STEP is not "0"."""
    return _PLAN is not None and os.environ.get("JANUS_NATIVE_STEP", "1") != "0"


def _vector(t: Any, n: int) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu" and t.dim() == 1
            and t.shape[0] == n and t.is_contiguous())


def _matrix(w: Any, n: int, k: int) -> tuple[int, int, int] | None:
    """(format code, qs address, scales address) of a quantized matrix [n, k], else None."""
    m = getattr(w, "bound", None)
    if m is None or m.fmt not in _FMT or (m.n, m.k) != (n, k):
        return None
    return _FMT[m.fmt], m.qs.data_ptr(), m.scales.data_ptr()


def _layer_addresses(model: Any, layer: Any) -> list[int] | None:
    """DecodePlan's 15 addresses of one layer, or None when it does not fit."""
    hidden, q, kv = model.arch.hidden_size, model.q_size, model.kv_size
    mats = [_matrix(layer.qkv_w, q + 2 * kv, hidden), _matrix(layer.o_w, hidden, q),
            _matrix(layer.gate_up_w, 2 * model.inter, hidden), _matrix(layer.down_w, hidden, model.inter)]
    if (any(m is None for m in mats) or not _vector(layer.ln1, hidden) or not _vector(layer.ln2, hidden)
            or layer.q_norm is not None or layer.k_norm is not None
            or (layer.qkv_b is not None and not _vector(layer.qkv_b, q + 2 * kv))):
        return None
    qkv, o, gu, down = mats
    bias = 0 if layer.qkv_b is None else layer.qkv_b.data_ptr()
    return [layer.ln1.data_ptr(), *qkv, bias, *o, layer.ln2.data_ptr(), *gu, *down]  # type: ignore[misc]


class NativeDecode:
    """One model's bound plan; `fits` / `run` per step. Holds the model's tensors (through
    the model) as long as the plan's addresses are used."""

    def __init__(self, model: Any, plan: Any) -> None:
        self.model, self.plan = model, plan
        self._kv_key: tuple[int, int] | None = None
        self._kv: tuple[list[int], int, int, int] | None = None  # addresses, blocks, block size, stride

    @staticmethod
    def bind(model: Any) -> NativeDecode | None:
        """The plan of `model` (llama.LlamaModel), or None when its weights or settings do not fit."""
        rope = model.rope
        if (not enabled() or model.shard is not None or model.dtype != torch.float32 or model.device.type != "cpu"
                or rope.cos.dtype != torch.float32 or not rope.cos.is_contiguous() or not rope.sin_rot.is_contiguous()
                or tuple(rope.cos.shape) != (rope.max_positions, model.hd)):
            return None
        addrs: list[int] = []
        for layer in model.layers:
            a = _layer_addresses(model, layer)
            if a is None:
                return None
            addrs += a
        plan = _PLAN(model.arch.hidden_size, model.nq, model.nkv, model.hd, model.inter, model.eps, addrs)
        return NativeDecode(model, plan)

    def _cache(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[int], int, int, int] | None:
        """Each layer's (k, v) addresses and the caches' geometry, checked once per cache."""
        key = (id(kv), kv[0][0].data_ptr() if kv else 0)
        if key == self._kv_key:
            return self._kv
        m = self.model
        self._kv_key, self._kv = key, None
        if len(kv) != len(m.layers):
            return None
        k0 = kv[0][0]
        shape, stride = k0.shape, k0.stride()
        for k, v in kv:
            if (k.dtype != torch.float32 or v.dtype != torch.float32 or k.device.type != "cpu" or k.dim() != 4
                    or k.shape != shape or v.shape != shape or k.stride() != stride or v.stride() != stride
                    or not k[0].is_contiguous() or stride[0] < k[0].numel() or tuple(shape[2:]) != (m.nkv, m.hd)):
                return None
        addrs = [t.data_ptr() for pair in kv for t in pair]
        self._kv = (addrs, shape[0], shape[1], stride[0])
        return self._kv

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any,
            kv: Sequence[tuple[torch.Tensor, torch.Tensor]] | None) -> torch.Tensor | None:
        """The step's hidden states [1, hidden], or None when this step does not fit (the
        caller runs the Python forward)."""
        m = self.model
        if (kv is None or input_ids.shape[0] != 1 or meta.num_decode != 1 or meta.prefills or meta.dec_blocks is None
                or meta.dec_mask is not None or m.landing is not None):
            return None
        geo = self._cache(kv)
        blocks = meta.dec_blocks
        if geo is None or blocks.dtype != torch.int64 or blocks.device.type != "cpu" or not blocks.is_contiguous():
            return None
        addrs, num_blocks, bs, stride = geo
        ctx = meta.dec_blk.shape[1]
        if blocks.shape[0] * bs < ctx:
            return None
        h = m.embed_rows(input_ids).contiguous()
        row = int(positions[0]) * m.hd * 4
        self.plan.step(h.data_ptr(), m.rope.cos.data_ptr() + row, m.rope.sin_rot.data_ptr() + row, addrs, blocks.data_ptr(),
                       blocks.shape[0], ctx, bs, stride, num_blocks, torch.get_num_threads())
        return h

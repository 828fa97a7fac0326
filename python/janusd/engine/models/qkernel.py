"""The block-quantized products of janus-core (rust/janus-core/src/quant) over tensors.

Why our own kernel: torch's packed int4 cpu kernel (`_weight_int4pack_mm_for_cpu`) is
vectorized on AVX2 only for bfloat16 activations, which rounds every product (~0.3%), and it
read ~3.5 GB/s of packed weights on one Zen 3 core. janus-core's loops widen each GGUF block's
integers to float32 in registers and multiply the float32 row as it is, so a product equals
the float32 product of the dequantized weights up to summation order (the engine's contract:
greedy outputs equal the dequantized float32 model's), at ~6-7 GB/s per core
(bench/RESULTS.md "engine: own Q4/Q8 kernels").

This module is the one place that hands tensor memory to the native code: it checks each
tensor's dtype, shape, contiguity and device first (the binding trusts the addresses).
Formats: "q4" = qs [N, K/2] uint8 (GGUF's nibble order) + scales [N, K/32, 2] float16
(d, m: w = d q + m); "q8" = qs [N, K] int8 + scales [N, K/32] float16 (w = d q).
"""

from __future__ import annotations

from typing import Any

import torch

from janusd import _native

BLOCK = 32
_MATMUL: Any = getattr(_native, "quant_matmul", None)
_DEQUANT: Any = getattr(_native, "quant_dequantize", None)
_QS_DTYPE = {"q4": torch.uint8, "q8": torch.int8}


def available() -> bool:
    """The native extension here has the kernels (an older build may not)."""
    return _MATMUL is not None and _DEQUANT is not None


def _check(fmt: str, qs: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    """(N, K) of a matrix in `fmt`, or ValueError naming what is wrong."""
    if fmt not in _QS_DTYPE:
        raise ValueError(f"unknown quant format {fmt!r}")
    n = qs.shape[0]
    k = qs.shape[1] * (2 if fmt == "q4" else 1)
    want_sc = (n, k // BLOCK, 2) if fmt == "q4" else (n, k // BLOCK)
    if (qs.dim() != 2 or qs.dtype != _QS_DTYPE[fmt] or scales.dtype != torch.float16 or k % BLOCK
            or tuple(scales.shape) != want_sc or not (qs.is_contiguous() and scales.is_contiguous())
            or qs.device.type != "cpu" or scales.device.type != "cpu"):
        raise ValueError(f"{fmt} weights: qs {qs.dtype} {list(qs.shape)}, scales {scales.dtype} {list(scales.shape)} "
                         f"(want contiguous cpu {_QS_DTYPE[fmt]} [N, {'K/2' if fmt == 'q4' else 'K'}] and float16 {list(want_sc)})")
    return n, k


def matmul(fmt: str, x: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor, threads: int = 1) -> torch.Tensor:
    """float32 [rows, N] = float32 x [rows, K] @ w.T."""
    n, k = _check(fmt, qs, scales)
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != k or x.device.type != "cpu":
        raise ValueError(f"x must be float32 cpu [rows, {k}], got {x.dtype} {list(x.shape)} on {x.device}")
    x = x.contiguous()
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    if x.shape[0]:
        _MATMUL(fmt, x.data_ptr(), x.shape[0], k, qs.data_ptr(), scales.data_ptr(), n, out.data_ptr(), threads)
    return out


class BoundMatrix:
    """A matrix checked once (its tensors are views that live as long as this object, so
    their addresses hold): a decode step's products skip _check's ~10 us of attribute
    reads per call (120 products a step for SmolLM2)."""

    __slots__ = ("fmt", "qs", "scales", "n", "k", "_ptrs")

    def __init__(self, fmt: str, qs: torch.Tensor, scales: torch.Tensor) -> None:
        self.fmt, self.qs, self.scales = fmt, qs, scales
        self.n, self.k = _check(fmt, qs, scales)
        self._ptrs = (qs.data_ptr(), scales.data_ptr())

    def __call__(self, x: torch.Tensor, threads: int) -> torch.Tensor:
        """float32 [rows, N] = float32 cpu x [rows, K] @ w.T."""
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != self.k or x.device.type != "cpu":
            raise ValueError(f"x must be float32 cpu [rows, {self.k}], got {x.dtype} {list(x.shape)} on {x.device}")
        x = x.contiguous()
        out = torch.empty(x.shape[0], self.n, dtype=torch.float32)
        if x.shape[0]:
            _MATMUL(self.fmt, x.data_ptr(), x.shape[0], self.k, self._ptrs[0], self._ptrs[1], self.n, out.data_ptr(), threads)
        return out


def dequantize(fmt: str, qs: torch.Tensor, scales: torch.Tensor, row0: int = 0, rows: int | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [rows, K] of weight rows [row0, row0 + rows): the file's values exactly."""
    n, k = _check(fmt, qs, scales)
    rows = n - row0 if rows is None else rows
    if row0 < 0 or rows < 0 or row0 + rows > n:
        raise ValueError(f"rows [{row0}, {row0 + rows}) of a {n}-row matrix")
    if out is None:
        out = torch.empty(rows, k, dtype=torch.float32)
    elif out.dtype != torch.float32 or tuple(out.shape) != (rows, k) or not out.is_contiguous():
        raise ValueError(f"out must be contiguous float32 [{rows}, {k}]")
    if rows:
        _DEQUANT(fmt, qs.data_ptr(), scales.data_ptr(), n, k, row0, rows, out.data_ptr())
    return out


_NORM: Any = getattr(_native, "add_rms_norm", None)


def native_norm_fits(h: torch.Tensor, w: torch.Tensor) -> bool:
    """add_rms_norm can take these: float32 cpu, h contiguous, w one contiguous row."""
    return (_NORM is not None and h.dtype == torch.float32 and w.dtype == torch.float32 and h.device.type == "cpu"
            and h.is_contiguous() and w.is_contiguous() and w.dim() == 1 and h.shape[-1] == w.shape[0])


def add_rms_norm(h: torch.Tensor, add: torch.Tensor | None, w: torch.Tensor, eps: float) -> torch.Tensor:
    """h += add (in place, when given), then HF's RMSNorm of h times w, in one native call
    (janus_core::cpuops): float32 rows that native_norm_fits."""
    if not native_norm_fits(h, w):
        raise ValueError(f"add_rms_norm takes contiguous float32 cpu rows and weight, got {h.dtype} {list(h.shape)}, {w.dtype}")
    if add is not None and (add.dtype != torch.float32 or add.shape != h.shape or not add.is_contiguous()
                            or add.data_ptr() == h.data_ptr() or add.device.type != "cpu"):
        raise ValueError(f"the residual must be another contiguous float32 cpu tensor of h's shape {list(h.shape)}")
    out = torch.empty_like(h)
    cols = w.shape[0]
    _NORM(h.data_ptr(), 0 if add is None else add.data_ptr(), w.data_ptr(), out.data_ptr(), h.numel() // cols, cols, eps)
    return out


_ATTN: Any = getattr(_native, "decode_attention", None)


def decode_attention_fits(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """decode_attention can take these: float32 cpu caches whose blocks are each contiguous
    (a KV region's layer view: blocks a stride apart, the same for K and V)."""
    return (_ATTN is not None and q.dtype == k_cache.dtype == v_cache.dtype == torch.float32 and q.device.type == "cpu"
            and k_cache.device.type == "cpu" and k_cache.dim() == 4 and k_cache.shape == v_cache.shape
            and k_cache.stride() == v_cache.stride() and k_cache[0].is_contiguous()
            and k_cache.stride(0) >= k_cache[0].numel())


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     blocks: torch.Tensor, ctx: int) -> torch.Tensor:
    """One sequence's decode step: k, v [1, Hkv, D] written at position ctx - 1 of the
    caches [num_blocks, block_size, Hkv, D] (decode_attention_fits) through `blocks` (its table, int64), and the
    attention of q [1, Hq, D] over positions 0 .. ctx - 1 (janus_core::cpuops), [1, Hq, D]."""
    nb, bs, hkv, d = k_cache.shape
    hq = q.shape[1]
    if not decode_attention_fits(q, k_cache, v_cache) or q.shape != (1, hq, d) or k.shape != (1, hkv, d) or v.shape != k.shape:
        raise ValueError(f"decode attention: q {list(q.shape)}, k {list(k.shape)}, cache {list(k_cache.shape)}")
    if blocks.dtype != torch.int64 or blocks.dim() != 1 or blocks.shape[0] * bs < ctx or ctx < 1:
        raise ValueError(f"decode attention: {blocks.shape[0]} blocks of {bs} for {ctx} positions")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if k.dtype != torch.float32 or v.dtype != torch.float32:
        raise ValueError(f"decode attention: k {k.dtype}, v {v.dtype} (float32 expected)")
    out = torch.empty_like(q)
    _ATTN(q.data_ptr(), k.data_ptr(), v.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), nb, k_cache.stride(0), blocks.data_ptr(),
          blocks.shape[0], bs, hq, hkv, d, ctx, out.data_ptr())
    return out

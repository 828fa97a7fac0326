"""The forward's matrix products: which library computes `x @ w.T + b` on cpu.

Why not plain F.linear everywhere: for float32 on cpu torch calls MKL's sgemm, and on the
project's AMD EPYC (Zen 4, AVX-512) MKL 2024.0 runs a product of a few rows (a short
prefill, a small decode batch) far below the machine's speed: 9 rows x 30 gate/up
matrices of SmolLM2 took 43 ms against 33 ms through oneDNN (torch's mkldnn
inner product on the same dense, row-major weights, no reordered copy), 2 rows 26 vs 15
ms; one row (a single sequence's decode, a gemv) is as fast either way, so it keeps MKL
(`janus bench restore` / bench/RESULTS.md "restore", issue 14). oneDNN picks its kernels
by the instruction set, not the vendor. Both read the weights where they are (the
segment's views): oneDNN keeps no copy of them between calls (a weight changed in
place is seen by the next call; tests/test_engine_linear.py).

oneDNN's cost: the first product of each new (rows, weight shape) builds a kernel (~5 ms
here under load, then kept in oneDNN's primitive cache, 1024 entries by default), so a
prompt length a worker has not seen yet pays it once per matrix shape (4 per layer kind
plus the LM head); the ~30 ms a 9-token SmolLM2 prefill saves still outweighs it on that
first prefill.

bfloat16 needs no routing here: torch's F.linear already runs it on oneDNN (brgemm
matmul, avx512_core_bf16 on this Zen 4, for one row and for many: ONEDNN_VERBOSE shows
it), and `_linear_pointwise` on the same bf16 weights was no faster (SmolLM2's 30 layers
plus the LM head, 9 rows: median 40.3 vs 41.1 ms; 1 row 31.0 vs 27.6 ms, min 26.2 vs 26.0,
15 interleaved turns under load ~5; bench/RESULTS.md "restore", third pass).

The two libraries round differently (float32 sums in another order: ~1e-5 relative), so
logits differ in the last bits from MKL's; greedy outputs were identical on the tests'
and SmolLM2's prompts (tests/test_engine_linear.py, test_engine_hf_parity.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


_ONEDNN = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None


def onednn_available() -> bool:
    return _ONEDNN is not None


def linear(x: torch.Tensor, w: Any, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, in] @ w[out, in].T (+ b): a quantized weight (qlinear.Q4Linear, q8.Q8Matrix) by itself,
    a float16 weight under float32 rows by half_weight_linear, oneDNN for 2+ float32 rows on
    cpu, else F.linear."""
    if not isinstance(w, torch.Tensor):  # a quantized matrix multiplies itself (its __call__)
        return w(x) if b is None else w(x) + b
    if w.dtype == torch.float16 and x.dtype == torch.float32 and x.device.type == "cpu":
        y = half_weight_linear(x, w)
        return y if b is None else y + b
    if (_ONEDNN is not None and x.dim() == 2 and x.shape[0] > 1 and x.dtype == torch.float32
            and w.dtype == torch.float32 and x.device.type == "cpu"):
        return _ONEDNN(x, w, b, "none", [], "")
    return F.linear(x, w, b)


HALF_ROWS = 2  # up to this many rows a float16 product is faster than upcasting its weight
UPCAST_ROWS = 1024  # weight rows upcast per product: 2.4 MB of float32 at 576 inputs, cache-sized


def half_weight_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float32 x [rows, in] @ float16 w[out, in].T, float32 out (a packed plan's LM head,
    qlinear.HEAD_DTYPE). Why two ways: torch's float16 product on this AVX2 cpu reads half
    the bytes of a float32 one and for 1-2 rows is ~1.5x faster than it (SmolLM2's 49152 x
    576 head, 1 row: ~9 vs ~13 ms), but it converts the weight per row block, so at 8 rows
    it is slower than float32 and at 32 rows 3x slower. From 3 rows the weight is upcast in
    cache-sized blocks and multiplied in float32 (32 rows: ~60 vs ~100 ms of the float32
    matrix, whose 113 MB come from memory). The float16 path rounds x and the output to
    float16 (2^-11 relative), the upcast path only the weights (bench/RESULTS.md "engine:
    decode step")."""
    if x.dim() == 2 and x.shape[0] <= HALF_ROWS:
        return F.linear(x.to(torch.float16), w).float()
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty(rows.shape[0], w.shape[0], dtype=torch.float32)
    buf = torch.empty(min(UPCAST_ROWS, w.shape[0]), w.shape[1], dtype=torch.float32)
    for i in range(0, w.shape[0], UPCAST_ROWS):
        part = buf[: min(UPCAST_ROWS, w.shape[0] - i)]
        part.copy_(w[i : i + UPCAST_ROWS])
        torch.mm(rows, part.t(), out=out[:, i : i + part.shape[0]])
    return out.view(*x.shape[:-1], w.shape[0])

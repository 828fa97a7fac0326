"""GGUF Q4_0 / Q4_1 linear weights kept in 4 bits on cpu, multiplied by janus-core's kernel.

Why: a dequantized copy of a 4-bit checkpoint is 8x its bytes in float32 (4x in
bfloat16), and batch-1 decode on cpu is bound by how many weight bytes each step reads
and how fast they turn into products.

Layout (qkernel.py "q4"): per weight row the file's blocks split in two, `packed` [N, K/2]
uint8 (GGUF's nibble order: byte j of a 32-block holds element j low, j + 16 high) and
`scales` [N, K/32, 2] float16 (d, m) with w = d q + m: Q4_1's d and m as stored, Q4_0's
w = d (q - 8) as m = -8d (exact in float16). Both are the file's numbers, so the weights
the kernel multiplies by are the dequantized file exactly, and products are float32 sums
of float32 activations (qkernel.py): greedy outputs equal the dequantized float32 model's
(tests/test_engine_qlinear.py). Rows are independent, so a fused [q;k;v] matrix is packed
part by part into row ranges of one buffer. They are plain bytes in the weight segment:
a Warm copy, a fork and a host image move them like any other weights.

A product of up to MATVEC_ROWS rows (decode steps, short prefills) runs the kernel; more
rows (a longer prefill) dequantize the matrix in cache-sized row blocks and multiply in
float32 (MKL / oneDNN), which beats re-widening every block per row.

The previous path, torch's `_weight_int4pack_mm_for_cpu`, needed bfloat16 activations to
be fast on AVX2 (rounding each product by ~0.3%) and was ~1.5x slower per product here
(bench/RESULTS.md "engine: own Q4/Q8 kernels").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from janusd.engine.models import qkernel

GROUP = 32  # GGUF Q4 block size
PACKABLE = ("q4_0", "q4_1")  # stored dtype names (Checkpoint.tensor_specs) this module packs
SCALE_DTYPE = torch.float16  # the file's d and m, exactly
# the embedding / LM head of a plan that keeps Q4 linears packed, when the file stores it
# as float16 or a quant type other than Q8_0 (which q8.py keeps as it is): float16 halves
# the float32 matrix a step reads (linear.py: how it is multiplied)
HEAD_DTYPE = torch.float16
# up to this many rows the kernel (it widens each block once per row: ~0.2 ms a row for a
# 3072 x 576 matrix here); more: dequantized blocks and a float32 product (~3 ms to
# dequantize that matrix plus the product): equal at ~32 rows on this Zen 3 (bench/RESULTS.md)
MATVEC_ROWS = 32
DEQUANT_ROWS = 128  # weight rows dequantized per block of a many-row product (~0.3-0.8 MB of float32: L2)


def q4_available() -> bool:
    """The native extension here has the quantized kernels."""
    return qkernel.available()


def packable(shape: tuple[int, ...], stored: str) -> bool:
    """A [N, K] weight stored as Q4_0/Q4_1 with whole blocks per row (K % 32)."""
    return stored in PACKABLE and len(shape) == 2 and shape[1] % GROUP == 0


def packed_shapes(n: int, k: int) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(packed nibbles [N, K/2] uint8, scales [N, K/32, 2] float16)."""
    return (n, k // 2), (n, k // GROUP, 2)


def decode_blocks(raw: np.ndarray, stored: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """GGUF Q4 blocks, rows x (bytes of blocks) uint8, -> (q [N, K] uint8 0..15, d [N, K/32]
    float32, m [N, K/32] float32 or None for Q4_0). Q4_0 blocks are d (f16) + 16 bytes,
    Q4_1 d, m (f16) + 16 bytes; byte j holds element j (low nibble) and j + 16 (high)."""
    head = 2 if stored == "q4_0" else 4
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, head + 16)
    d = blocks[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    m = blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32) if head == 4 else None
    qs = blocks[:, :, head:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(rows, -1)
    return q, d, m


def pack(q: np.ndarray, d: np.ndarray, m: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed [N, K/2] uint8, scales [N, K/32, 2] float16) from decode_blocks' nibbles and
    GGUF's per-block d (and m for Q4_1); d and m are float16 values, so exact here."""
    n = q.shape[0]
    blocks = q.reshape(n, -1, GROUP).astype(np.uint8)
    packed = (blocks[:, :, :16] | (blocks[:, :, 16:] << 4)).reshape(n, -1)
    zero = -8.0 * d if m is None else m
    sz = np.stack([d, zero], axis=-1).astype(np.float16)
    return torch.from_numpy(np.ascontiguousarray(packed)), torch.from_numpy(sz)


def dequantize_reference(q: np.ndarray, d: np.ndarray, m: np.ndarray | None) -> torch.Tensor:
    """The file's float32 weights, [N, K], as gguf.quants.dequantize gives them."""
    qf = torch.from_numpy(q.astype(np.float32)).view(q.shape[0], -1, GROUP)
    dd = torch.from_numpy(d).unsqueeze(-1)
    w = dd * (qf - 8.0) if m is None else dd * qf + torch.from_numpy(m).unsqueeze(-1)
    return w.reshape(q.shape)


def blockwise_product(fmt: str, x: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 x [rows, K] @ w.T for many rows: DEQUANT_ROWS weight rows at a time
    dequantized into one reused buffer and multiplied in float32 (the same products as the
    dequantized model's, summed by MKL / oneDNN)."""
    from janusd.engine.models.linear import linear

    n, k = qs.shape[0], x.shape[1]
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    buf = torch.empty(min(DEQUANT_ROWS, n), k, dtype=torch.float32)
    for r in range(0, n, DEQUANT_ROWS):
        rows = min(DEQUANT_ROWS, n - r)
        part = qkernel.dequantize(fmt, qs, scales, r, rows, buf[:rows])
        out[:, r : r + rows] = linear(x, part)
    return out


def quant_product(m: qkernel.BoundMatrix, rows: torch.Tensor) -> torch.Tensor:
    """float32 rows [R, K] @ w.T for a Q4 or Q8_0 matrix: the kernel up to MATVEC_ROWS rows
    (a decode step, a short prefill), dequantized blocks and a float32 product above."""
    if rows.shape[0] <= MATVEC_ROWS:
        return m(rows, torch.get_num_threads())
    return blockwise_product(m.fmt, rows, m.qs, m.scales)


class Q4Linear:
    """One linear's weight, packed: `q4(x)` = x @ w.T in the kernel's numerics (module doc),
    computed in the scales' dtype.

    `packed` and `scales` are views (of the weight segment, or any buffer); nothing is
    copied, so bytes written into them later (an overlapped restore) are what the next
    product reads. Duck-types the bits of a tensor the engine asks a weight for."""

    __slots__ = ("packed", "scales", "out_features", "in_features", "_bound")

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor) -> None:
        self.packed, self.scales = packed, scales
        self.out_features, self.in_features = packed.shape[0], packed.shape[1] * 2
        self._bound = qkernel.BoundMatrix("q4", packed, scales)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = quant_product(self._bound, x.reshape(-1, x.shape[-1]).float())
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)

    @property
    def bound(self) -> qkernel.BoundMatrix:
        """The checked matrix (native_step.py binds its addresses)."""
        return self._bound

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales.numel() * self.scales.element_size()

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K] of what the kernel multiplies by (for tests and debugging)."""
        return qkernel.dequantize("q4", self.packed, self.scales)


def nbytes(w: Any) -> int:
    """Bytes a weight occupies: a tensor's or a quantized matrix's (its `nbytes`)."""
    return int(w.nbytes) if not isinstance(w, torch.Tensor) else w.numel() * w.element_size()


def head_dtype(stored: str) -> torch.dtype | None:
    """The dtype a packed plan stores an embedding / LM head in that the file stores as
    `stored` (a quant type other than Q8_0, or float16); None: the plan's own dtype."""
    return HEAD_DTYPE if stored not in ("float32", "bfloat16") else None


KEEPS_QUANTIZED = ("auto", "int8", "int4")  # config dtypes whose weights stay blocks (module doc, quantize_float.py)


def keeps_q4(dtype_name: str, device_kind: str) -> bool:
    """Whether a model configured with `dtype_name` on a `device_kind` device keeps its
    quantized weights as blocks: `auto` (a GGUF's own), `int8` / `int4` (float weights
    quantized at load), on cpu (the kernels are cpu-only)."""
    return dtype_name in KEEPS_QUANTIZED and device_kind == "cpu" and q4_available()


def load_packed(ck: Any, quant: dict[str, tuple[str, int]], views: dict[str, Any]) -> None:
    """Pack each Q4 tensor of `quant` (WeightPlan.quant) from the checkpoint (read_q4) into
    its matrix's `:packed` and `:scales` views, at its rows."""
    for name, (matrix, row0) in quant.items():
        packed, sz = pack(*ck.read_q4(name))
        n = packed.shape[0]
        views[matrix + ":packed"][row0 : row0 + n].copy_(packed)
        views[matrix + ":scales"][row0 : row0 + n].copy_(sz)

"""GGUF Q4_0 / Q4_1 linear weights kept in 4 bits on cpu: torch's packed int4 kernel.

Why: a dequantized copy of a 4-bit checkpoint is 8x its bytes in float32 (4x in
bfloat16), and batch-1 decode on cpu is bound by how many weight bytes each step reads.
SmolLM2-135M's Q4_1 matrices read as float32 cost ~45 ms of matmuls per token on this
2-core Zen 3 VM; packed they cost ~14 ms (bench/RESULTS.md "engine: Q4 packed").

The kernel is `aten._weight_int4pack_mm_for_cpu` (torch's own, no extra dependency:
torchao's cpu int4 path calls the same op on x86). Its convention, checked against a float
reference (tests/test_engine_qlinear.py): weights [N, K] as nibbles 0..15 packed by
`aten._convert_weight_to_int4pack_for_cpu` into [N, K/2] bytes, and per group of 32
inputs and per output row a (scale, zero) pair, w = (q - 8) * scale + zero. GGUF's
blocks map onto it exactly in form: Q4_0 is w = d * (q - 8) (scale d, zero 0), Q4_1 is
w = d * q + m = d * (q - 8) + (m + 8d) (scale d, zero m + 8d).

The numbers are the kernel's, not the file's: on cpus without AVX-512 (this VM is AVX2)
the kernel is vectorized only for bfloat16 activations, whose scales and zeros must then
be bfloat16 too (float32 activations take a scalar loop ~12x slower than the float32
matmul it replaces). So a packed product rounds its input rows, the scales (GGUF's d is
float16: 3 mantissa bits are lost) and its output to bfloat16, and sums in float32: about
0.3% relative error per product against the float32 product of the dequantized file.
Greedy outputs of the tests' models and SmolLM2 agree with the float32 reference where
stated in tests/test_engine_qlinear.py; a model sensitive to that rounding takes an
explicit float dtype (`dtype = "float32"` dequantizes as before).

Layout constraints of the packing: N a multiple of 16, K of 32 (one GGUF block per group).
The packed bytes are a function of the nibbles alone and row-independent (packing rows
[0, a) and [a, N) apart gives the packing of all N), so a fused [q;k;v] matrix is packed
part by part into row ranges of one buffer. They are plain bytes in the weight segment:
a Warm copy, a fork and a host image move them like any other weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

GROUP = 32  # GGUF Q4 block size = the kernel's group size
PACKABLE = ("q4_0", "q4_1")  # stored dtype names (Checkpoint.tensor_specs) this module packs
# what the kernel computes in: bfloat16 is its vectorized path on AVX2 (module doc); float32
# (its scalar path) gives the file's weights exactly, for tests (test_engine_qlinear.py)
SCALE_DTYPE = torch.bfloat16
# the embedding / LM head of a plan that keeps Q4 linears packed, when the file stores it
# quantized or in float16 (SmolLM2's is Q8_0): float16 halves the 113 MB float32 matrix a
# step reads, with 8x less rounding than bfloat16 (linear.py: how it is multiplied); float32
# (the tests) keeps the file's dequantized values exactly
HEAD_DTYPE = torch.float16
_OPS: tuple[Any, Any] = (getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None),
                         getattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", None))


def q4_available() -> bool:
    """torch here has the packed int4 cpu kernels."""
    return all(op is not None for op in _OPS)


def packable(shape: tuple[int, ...], stored: str) -> bool:
    """A [N, K] weight stored as Q4_0/Q4_1 that the kernel can take (N % 16, K % 32)."""
    return stored in PACKABLE and len(shape) == 2 and shape[0] % 16 == 0 and shape[1] % GROUP == 0


def packed_shapes(n: int, k: int) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """(packed nibbles [N, K/2] uint8, scales and zeros [K/32, N, 2])."""
    return (n, k // 2), (k // GROUP, n, 2)


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
    """(packed [N, K/2] uint8, scales and zeros [K/32, N, 2] float32: copied into a view of
    the compute dtype, they round there) for the kernel, from decode_blocks' nibbles and
    GGUF's per-block d (and m for Q4_1)."""
    packed = _OPS[1](torch.from_numpy(q.astype(np.int32)), 1)
    scale = torch.from_numpy(d)
    zero = torch.zeros_like(scale) if m is None else torch.from_numpy(m) + 8.0 * scale
    sz = torch.stack([scale.t(), zero.t()], dim=-1).contiguous()
    return packed, sz


def dequantize_reference(q: np.ndarray, d: np.ndarray, m: np.ndarray | None) -> torch.Tensor:
    """The file's float32 weights, [N, K], as gguf.quants.dequantize gives them."""
    qf = torch.from_numpy(q.astype(np.float32)).view(q.shape[0], -1, GROUP)
    dd = torch.from_numpy(d).unsqueeze(-1)
    w = dd * (qf - 8.0) if m is None else dd * qf + torch.from_numpy(m).unsqueeze(-1)
    return w.reshape(q.shape)


class Q4Linear:
    """One linear's weight, packed: `q4(x)` = x @ w.T in the kernel's numerics (module doc),
    computed in the scales' dtype.

    `packed` and `scales` are views (of the weight segment, or any buffer); nothing is
    copied, so bytes written into them later (an overlapped restore) are what the next
    product reads. Duck-types the bits of a tensor the engine asks a weight for."""

    __slots__ = ("packed", "scales", "out_features", "in_features")

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor) -> None:
        self.packed, self.scales = packed, scales
        self.out_features, self.in_features = packed.shape[0], packed.shape[1] * 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = _OPS[0](x.to(self.scales.dtype), self.packed, GROUP, self.scales)
        return y.to(x.dtype)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales.numel() * self.scales.element_size()

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K] of what the kernel multiplies by (for tests and debugging)."""
        eye = torch.eye(self.in_features, dtype=self.scales.dtype)
        return _OPS[0](eye, self.packed, GROUP, self.scales).float().t().contiguous()


def nbytes(w: Any) -> int:
    """Bytes a weight occupies: a tensor's or a Q4Linear's."""
    return int(w.nbytes) if isinstance(w, Q4Linear) else w.numel() * w.element_size()


def head_dtype(stored: str) -> torch.dtype | None:
    """The dtype a packed plan stores an embedding / LM head in that the file stores as
    `stored` (a quant type or float16); None: the plan's own dtype."""
    return HEAD_DTYPE if stored not in ("float32", "bfloat16") else None


def keeps_q4(dtype_name: str, device_kind: str) -> bool:
    """Whether a model configured with `dtype_name` on a `device_kind` device keeps its
    Q4_0/Q4_1 linears packed: `dtype = "auto"` on cpu (the kernel is cpu-only here)."""
    return dtype_name == "auto" and device_kind == "cpu" and q4_available()


def load_packed(ck: Any, quant: dict[str, tuple[str, int]], views: dict[str, Any]) -> None:
    """Pack each Q4 tensor of `quant` (WeightPlan.quant) from the checkpoint (read_q4) into
    its matrix's `:packed` and `:scales` views, at its rows."""
    for name, (matrix, row0) in quant.items():
        packed, sz = pack(*ck.read_q4(name))
        n = packed.shape[0]
        views[matrix + ":packed"][row0 : row0 + n].copy_(packed)
        views[matrix + ":scales"][:, row0 : row0 + n].copy_(sz)

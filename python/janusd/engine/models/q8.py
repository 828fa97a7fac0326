"""GGUF Q8_0 matrices kept in 8 bits on cpu (a plan that keeps quantized weights): the
embedding / LM head, and the linears of a Q8_0 file (fused by row ranges like qlinear's).

Why: SmolLM2's tied embedding is Q8_0 in the file, 49152 x 576. Dequantized to float32 the
LM head reads 113 MB per decode step (a quarter of a step); float16 halves that but rounds
the logits (~0.05%) and multiplies at ~8 GB/s here. Kept as the file's blocks it is 30 MB,
multiplied by janus-core's kernel (qkernel.py "q8": qs [N, K] int8, scales [N, K/32]
float16, w = d q) in float32, equal to the dequantized head up to summation order. The
embedding lookup dequantizes only the rows it needs (exactly the file's values).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from janusd.engine.models import qkernel
from janusd.engine.models.qlinear import quant_product

BLOCK = 32


def keeps_q8(shape: tuple[int, ...], stored: str) -> bool:
    """A [N, K] Q8_0 matrix with whole blocks per row."""
    return stored == "q8_0" and len(shape) == 2 and shape[1] % BLOCK == 0 and qkernel.available()


def shapes(n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(qs [N, K] int8, scales [N, K/32] float16)."""
    return (n, k), (n, k // BLOCK)


def decode_blocks(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGUF Q8_0 blocks, rows x (bytes of blocks) uint8 (each block d float16 + 32 int8),
    -> (qs [N, K] int8, d [N, K/32] float16)."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 2 + BLOCK)
    d = np.ascontiguousarray(blocks[:, :, 0:2]).view(np.float16)[:, :, 0]
    qs = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(rows, -1)
    return qs, np.ascontiguousarray(d)


class Q8Matrix:
    """One Q8_0 matrix over views of the weight segment (nothing copied): `m(x)` is
    x @ w.T in float32, `m.rows(ids)` the embedding rows of `ids`."""

    __slots__ = ("qs", "scales", "shape", "_bound")

    def __init__(self, qs: torch.Tensor, scales: torch.Tensor) -> None:
        self.qs, self.scales = qs, scales
        self.shape = (qs.shape[0], qs.shape[1])
        self._bound = qkernel.BoundMatrix("q8", qs, scales)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = quant_product(self._bound, x.reshape(-1, x.shape[-1]).float())
        return y.view(*x.shape[:-1], self.shape[0]).to(x.dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [len(ids), K]: the dequantized rows (d * q, exact)."""
        q = self.qs[ids].view(ids.shape[0], -1, BLOCK).float()
        return (q * self.scales[ids].float().unsqueeze(-1)).view(ids.shape[0], self.shape[1])

    @property
    def bound(self) -> qkernel.BoundMatrix:
        """The checked matrix (native_step.py binds its addresses)."""
        return self._bound

    @property
    def nbytes(self) -> int:
        return self.qs.numel() + self.scales.numel() * 2

    @property
    def device(self) -> torch.device:
        return self.qs.device

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K] (for tests and debugging)."""
        return qkernel.dequantize("q8", self.qs, self.scales)


def load(ck: Any, q8: dict[str, tuple[str, int]], views: dict[str, Any]) -> None:
    """Copy each Q8_0 tensor of `q8` (WeightPlan.q8) from the checkpoint's blocks
    (read_q8) into its matrix's `:q8` and `:q8scales` views, at its rows."""
    for name, (matrix, row0) in q8.items():
        qs, d = ck.read_q8(name)
        n = qs.shape[0]
        views[matrix + ":q8"][row0 : row0 + n].copy_(torch.from_numpy(qs))
        views[matrix + ":q8scales"][row0 : row0 + n].copy_(torch.from_numpy(d))

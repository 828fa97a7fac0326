"""Rotary position embeddings (NeoX "rotate half" form, as the HF Llama family uses).

The inverse frequencies follow the checkpoint's `rope_scaling`: none/default, "linear"
(positions divided by factor), "llama3" (Llama 3.1's per-band rescaling) and
"freq_factors" (the same rescaling as GGUF files store it: one divisor per frequency). The cos/sin
table is built once in float32 up to max_position_embeddings and indexed by position,
so a step only gathers rows; it is cast to the model dtype like HF does.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import torch

from janusd.engine.types import EngineError


def inv_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Per-pair inverse frequencies, float32, shape [head_dim // 2]."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "freq_factors":  # GGUF's rope_freqs: one divisor per frequency (Llama 3.1 GGUFs)
        factors = torch.tensor(scaling["factors"], dtype=torch.float32)
        if factors.shape != inv.shape:
            raise EngineError(f"rope_scaling freq_factors: {factors.numel()} factors for {inv.numel()} frequencies")
        return inv / factors
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen = old_len / low
        high_wavelen = old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise EngineError(f"rope_scaling type {kind!r} is not supported (supported: default, linear, llama3, freq_factors)")


@functools.lru_cache(maxsize=8)
def _cos_sin(head_dim: int, theta: float, scaling: Any, max_positions: int, dtype: torch.dtype,
             device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cos, sin, sin with its first half negated: apply_rotary's); `scaling`: the
    rope_scaling settings as JSON (the cache's key), or as a dict (uncached)."""
    inv = inv_frequencies(head_dim, theta, json.loads(scaling) if isinstance(scaling, str) else scaling)
    pos = torch.arange(max_positions, dtype=torch.float32)
    freqs = pos[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)
    half = head_dim // 2
    return cos, sin, torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)


class RotaryTable:
    """cos/sin rows for every position up to `max_positions`, in the model dtype.

    The tables are shared by every model (and every restore of one) with the same rotary
    settings: building them is ~1M sin/cos for 8192 positions, 10-13 ms on one core here,
    which every Warm -> Active paid on its way to the first token. Nothing writes them."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None,
                 max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        try:
            key = json.dumps(scaling or None, sort_keys=True)
        except TypeError:  # settings JSON cannot hold: build this one apart
            key = None
        if key is not None:
            self.cos, self.sin, self.sin_rot = _cos_sin(head_dim, float(theta), key, max_positions, dtype, str(device))
        else:
            self.cos, self.sin, self.sin_rot = _cos_sin.__wrapped__(head_dim, float(theta), scaling, max_positions,
                                                                    dtype, str(device))
        self.max_positions = max_positions

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and apply_rotary's signed sin, [T, 1, head_dim] for broadcasting over heads."""
        return self.cos[positions].unsqueeze(1), self.sin_rot[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_rot: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos, sin_rot: [T, 1, head_dim] (RotaryTable.lookup).

    HF's x * cos + cat(-x2, x1) * sin, as x * cos + cat(x2, x1) * cat(-sin1, sin2): equal bit
    for bit (a negation is exact) in three ops on x instead of five (one roll, no neg)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_rot

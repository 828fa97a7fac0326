"""GGUF files (llama.cpp's format) read through the ``gguf`` package.

The file is memory-mapped by ``gguf.GGUFReader``; each tensor is dequantised on its own
(``gguf.quants.dequantize``) when iterated, so peak extra memory is one float32 tensor.
Three llama.cpp conventions are undone so the engine sees plain HF checkpoints:
tensor names (``blk.N.attn_q`` -> ``model.layers.N.self_attn.q_proj``), shapes (GGUF
lists dimensions innermost first) and, for llama, the row permutation of attn_q/attn_k
that llama.cpp's converter applies for its interleaved RoPE.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from janusd.engine.checkpoint.base import (
    Checkpoint,
    CheckpointError,
    ModelArch,
    Slice,
    check_tensor_set,
    expected_tensor_shapes,
    sliced_shape,
    validate_arch,
)
from janusd.engine.checkpoint.gguf_vocab import tokenizer_from_gguf

if TYPE_CHECKING:
    import torch

GGUF_ARCHS = ("llama", "qwen2", "qwen3")
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_PLAIN = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_SAMPLING = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p", "general.sampling.top_k": "top_k",
             "general.sampling.min_p": "min_p", "general.sampling.penalty_repeat": "repetition_penalty"}


def hf_name(gguf_name: str) -> str | None:
    """GGUF tensor name -> HF parameter name (None if unknown)."""
    if gguf_name in _TOP:
        return _TOP[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK:
        return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}.{m.group(3)}"
    return None


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's q/k permutation: rows (head, 2, half) were stored as (head, half, 2)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _read_metadata(reader: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = field.contents()
        except Exception:  # a field type this gguf version cannot decode: not one we use
            continue
    return meta


class GGUFCheckpoint(Checkpoint):
    format = "gguf"

    def __init__(self, path: Path) -> None:
        import gguf

        path = Path(path)
        try:
            self._reader = gguf.GGUFReader(str(path), "r")
        except FileNotFoundError:
            raise CheckpointError(f"{path}: missing file") from None
        except Exception as e:  # GGUFReader raises ValueError, struct.error, IndexError... on corrupt input
            raise CheckpointError(f"{path}: unreadable or corrupt GGUF file: {type(e).__name__}: {e}") from e
        meta = _read_metadata(self._reader)
        # the reader's fields are ~200k small numpy views of the metadata (SmolLM2's vocabulary
        # and merges: ~100 MB of the worker's heap); `meta` has their values, the tensors are kept
        self._reader.fields.clear()
        self._tensors: dict[str, Any] = {}
        found: dict[str, tuple[int, ...]] = {}
        stored: dict[str, str] = {}
        rope_factors: list[float] | None = None
        for t in self._reader.tensors:
            if t.name == "rope_freqs.weight":
                # Llama 3.1-style GGUFs carry the per-frequency rope divisors as a tensor
                # (llama.cpp computes them from the llama3 scaling when converting)
                rope_factors = _rope_factors(t, path)
                continue
            name = hf_name(t.name)
            if name is None:
                raise CheckpointError(f"{path}: unexpected tensor {t.name!r}")
            qtype = t.tensor_type.name
            if qtype not in _PLAIN and not hasattr(gguf.quants, qtype):
                raise CheckpointError(f"{path}: tensor {t.name!r} has unsupported type {qtype}")
            self._tensors[name] = t
            found[name] = tuple(int(d) for d in reversed(t.shape.tolist()))
            stored[name] = _PLAIN.get(qtype, qtype.lower())
        arch = self._arch(meta, found, path, rope_factors)
        check_tensor_set(expected_tensor_shapes(arch), found, lambda name: str(path))
        specs = {n: (s, stored[n]) for n, s in expected_tensor_shapes(arch).items()}
        tokenizer = tokenizer_from_gguf(meta, str(path))
        defaults: dict[str, Any] = {hf: meta[k] for k, hf in _SAMPLING.items() if k in meta}
        eos = list(tokenizer.eos_token_ids)
        defaults["eos_token_id"] = eos
        super().__init__(path, arch, specs, tokenizer, defaults, eos)

    @staticmethod
    def _arch(meta: dict[str, Any], found: dict[str, tuple[int, ...]], path: Path,
              rope_factors: list[float] | None = None) -> ModelArch:
        name = meta.get("general.architecture")
        if name not in GGUF_ARCHS:
            raise CheckpointError(f"{path}: unsupported architecture {name!r} (supported in GGUF: {', '.join(GGUF_ARCHS)})")

        def key(suffix: str, default: Any = None) -> Any:
            value = meta.get(f"{name}.{suffix}", default)
            if value is None:
                raise CheckpointError(f"{path}: missing GGUF metadata key '{name}.{suffix}'")
            return value

        embd = found.get("model.embed_tokens.weight")
        if embd is None:
            raise CheckpointError(f"{path}: missing tensor 'token_embd.weight'")
        heads = int(key("attention.head_count"))
        hidden = int(key("embedding_length"))
        scaling = None
        stype = meta.get(f"{name}.rope.scaling.type")
        if stype not in (None, "none"):
            scaling = {"rope_type": stype, "factor": float(key("rope.scaling.factor"))}
            if f"{name}.rope.scaling.original_context_length" in meta:
                scaling["original_max_position_embeddings"] = int(meta[f"{name}.rope.scaling.original_context_length"])
        if rope_factors is not None:
            scaling = {"rope_type": "freq_factors", "factors": rope_factors}
        arch = ModelArch(
            architecture=name,
            vocab_size=int(meta.get(f"{name}.vocab_size") or embd[0]),
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_hidden_layers=int(key("block_count")),
            num_attention_heads=heads,
            num_key_value_heads=int(meta.get(f"{name}.attention.head_count_kv") or heads),
            head_dim=int(meta.get(f"{name}.attention.key_length") or hidden // heads),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            rope_theta=float(meta.get(f"{name}.rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=int(meta.get(f"{name}.context_length", 2048)),
            tie_word_embeddings="lm_head.weight" not in found,
            attention_bias="model.layers.0.self_attn.q_proj.bias" in found,
            qk_norm=name == "qwen3",
            sliding_window=int(meta[f"{name}.attention.sliding_window"]) if meta.get(f"{name}.attention.sliding_window") else None,
            torch_dtype="float32",
        )
        validate_arch(arch, str(path))
        return arch

    def _iter_raw(self, dtype: torch.dtype, slices: Mapping[str, Slice | None] | None = None,
                  skip: Collection[str] = ()) -> Iterator[tuple[str, torch.Tensor]]:
        import torch

        d = self.arch.head_dim
        for name, (shape, _) in self._specs.items():
            if name in skip:
                continue
            t = self._tensors[name]
            sl = slices.get(name) if slices else None
            try:
                values = self._read(t, sl)
                tensor = torch.from_numpy(values).reshape(sliced_shape(shape, sl)).to(dtype)
            except Exception as e:  # a truncated file surfaces here as a short buffer
                raise CheckpointError(f"{self.path}: cannot read tensor {t.name!r}: {type(e).__name__}: {e}") from e
            # llama.cpp permutes q/k rows within each head, and a shard's slice is whole heads
            if self._permuted(name):
                tensor = unpermute_rows(tensor, tensor.shape[0] // d)
            yield name, tensor

    def _permuted(self, name: str) -> bool:
        return self.arch.architecture == "llama" and name.endswith(
            ("self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight", "self_attn.k_proj.bias"))

    def drop_pages(self) -> None:
        """MADV_DONTNEED over the file's mapping: the whole file was read through it (~94 MB of
        SmolLM2's resident after a load, beside the weights' own copy in the segment)."""
        import mmap

        m = getattr(self._reader.data, "_mmap", None)  # numpy's memmap keeps its mmap.mmap here
        if m is not None and hasattr(m, "madvise"):
            try:
                m.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # a closed map or a kernel without it: only memory is at stake
                pass

    def read_q4(self, name: str) -> tuple[Any, Any, Any]:
        """A Q4_0/Q4_1 tensor's blocks as they are, in HF layout: (nibbles [N, K] uint8,
        d [N, K/32] float32, m [N, K/32] float32 or None for Q4_0) (engine/models/qlinear.py)."""
        import numpy as np

        from janusd.engine.models.qlinear import decode_blocks
        from janusd.engine.models.quantize_float import FLOAT_STORED

        t = self._tensors[name]
        stored = self._specs[name][1]
        if stored in FLOAT_STORED:  # `int4` on a float tensor of the file: quantized at load
            return super().read_q4(name)
        try:
            raw = np.ascontiguousarray(t.data)
            self.bytes_read += raw.nbytes
            q, d, m = decode_blocks(raw.reshape(self._specs[name][0][0], -1), stored)
        except Exception as e:  # a truncated file surfaces here as a short buffer
            raise CheckpointError(f"{self.path}: cannot read tensor {t.name!r}: {type(e).__name__}: {e}") from e
        if self._permuted(name):
            heads = q.shape[0] // self.arch.head_dim
            q, d = (np.ascontiguousarray(unpermute_rows(a, heads)) for a in (q, d))  # type: ignore[arg-type]
            m = None if m is None else np.ascontiguousarray(unpermute_rows(m, heads))  # type: ignore[arg-type]
        return q, d, m

    def read_q8(self, name: str) -> tuple[Any, Any]:
        """A Q8_0 tensor's blocks as they are, in HF layout: (qs [N, K] int8, d [N, K/32]
        float16) (engine/models/q8.py)."""
        import numpy as np

        from janusd.engine.models.q8 import decode_blocks
        from janusd.engine.models.quantize_float import FLOAT_STORED

        if self._specs[name][1] in FLOAT_STORED:  # `int8` on a float tensor of the file: quantized at load
            return super().read_q8(name)
        t = self._tensors[name]
        try:
            raw = np.ascontiguousarray(t.data)
            self.bytes_read += raw.nbytes
            qs, d = decode_blocks(raw.reshape(self._specs[name][0][0], -1))
        except Exception as e:  # a truncated file surfaces here as a short buffer
            raise CheckpointError(f"{self.path}: cannot read tensor {t.name!r}: {type(e).__name__}: {e}") from e
        if self._permuted(name):
            heads = qs.shape[0] // self.arch.head_dim
            qs, d = (np.ascontiguousarray(unpermute_rows(a, heads)) for a in (qs, d))  # type: ignore[arg-type]
        return qs, d

    def _read(self, t: Any, sl: Slice | None) -> Any:
        """The tensor's values (HF layout, float32 or its plain dtype) as a contiguous numpy
        array; with `sl`, only those rows or columns. Rows of a quantized tensor are whole
        rows of blocks; a column slice reads the blocks that cover it (quant blocks run
        along a row), so a shard reads its part of the file, not the whole tensor."""
        import numpy as np
        from gguf.quants import dequantize

        data = t.data  # a read-only memmap: HF rows x (elements, or bytes of blocks when quantized)
        plain = t.tensor_type.name in ("F32", "F16")  # numpy floats; the rest are rows of bytes
        if sl is None:
            raw = data
            cut = None
        elif sl[0] == 0:
            raw = data[sl[1] : sl[2]]
            cut = None
        elif plain:
            raw = data[:, sl[1] : sl[2]]
            cut = None
        else:
            import gguf

            block, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
            a0, b0 = sl[1] // block * block, -(-sl[2] // block) * block
            raw = data[:, a0 // block * size : b0 // block * size]
            cut = (sl[1] - a0, sl[2] - a0)
        # reading the memmap's slice here is what reads the file: a copy of plain values
        # (the memmap is read-only), the quantized bytes as they lie when contiguous
        raw = np.array(raw) if plain else np.ascontiguousarray(raw)
        self.bytes_read += raw.nbytes
        values = raw if plain else dequantize(raw, t.tensor_type)
        if cut is not None:
            values = values[:, cut[0] : cut[1]]
        return np.ascontiguousarray(values)


def _rope_factors(t: Any, path: Path) -> list[float]:
    """The rope_freqs tensor as a list of positive floats (F32/F16 only, as llama.cpp writes it)."""
    import numpy as np

    if t.tensor_type.name not in ("F32", "F16"):
        raise CheckpointError(f"{path}: tensor 'rope_freqs.weight' has type {t.tensor_type.name}, expected F32")
    values = np.asarray(t.data, dtype=np.float64).reshape(-1)
    if values.size == 0 or not np.all(np.isfinite(values)) or not np.all(values > 0):
        raise CheckpointError(f"{path}: tensor 'rope_freqs.weight' must hold positive finite factors")
    return [float(v) for v in values]

"""The format-neutral face of a checkpoint: ModelArch, CheckpointError and Checkpoint.

Every reader (HF safetensors dirs, GGUF files) turns its file into the same three
things: a ModelArch, the exact set of HF-named tensors the model needs with their HF
shapes, and a stream of those tensors one at a time. The expected tensor set is
derived from the architecture alone (``expected_tensor_shapes``), so a reader checks
the file against what the model needs instead of trusting the file's own listing:
a missing, extra or misshaped tensor is caught when the checkpoint is opened, long
before a worker has allocated device memory for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    import torch

    from janusd.engine.tokenizer import Tokenizer

# a tensor-parallel shard's part of a tensor: (dim, start, stop), engine/tp/layout.py
Slice = tuple[int, int, int]

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
# RoPE scalings the forward implements (engine/models/rope.py); anything else is refused
# when the checkpoint is opened, so `janus models inspect` never approves a model that
# would only fail once a worker builds it.
SUPPORTED_ROPE_SCALINGS = ("linear", "llama3", "freq_factors")


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message names the file and, where relevant, the tensor."""


class ModelArch(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the llama-family forward needs to know about a model's shape.

    ``attention_bias`` means bias on q/k/v only (Qwen2); ``qk_norm`` means per-head
    RMSNorm on q and k before RoPE (Qwen3). ``rope_scaling`` is None for plain RoPE or a
    dict with at least ``rope_type`` (e.g. llama3 with factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    torch_dtype: str = "float32"


def validate_arch(arch: ModelArch, where: str) -> None:
    """Reject shapes no forward can run, naming ``where`` (the file) in the message."""
    if arch.architecture not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"{where}: unsupported architecture {arch.architecture!r} (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
    ):
        value = getattr(arch, field)
        if not isinstance(value, int) or value <= 0:
            raise CheckpointError(f"{where}: {field} must be a positive integer, got {value!r}")
    if arch.num_attention_heads % arch.num_key_value_heads:
        raise CheckpointError(
            f"{where}: num_attention_heads ({arch.num_attention_heads}) is not a multiple of "
            f"num_key_value_heads ({arch.num_key_value_heads})"
        )
    if arch.head_dim % 2:
        raise CheckpointError(f"{where}: head_dim must be even for RoPE, got {arch.head_dim}")
    if not arch.rms_norm_eps > 0 or not arch.rope_theta > 0:
        raise CheckpointError(f"{where}: rms_norm_eps and rope_theta must be positive")
    if arch.rope_scaling is not None:
        _validate_rope_scaling(arch.rope_scaling, where, arch.head_dim)


def _validate_rope_scaling(scaling: dict[str, Any], where: str, head_dim: int) -> None:
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in SUPPORTED_ROPE_SCALINGS:
        raise CheckpointError(
            f"{where}: rope_scaling type {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_SCALINGS)})"
        )
    if kind == "freq_factors":  # per-frequency divisors, as GGUF's rope_freqs tensor gives them
        factors = scaling.get("factors")
        if (not isinstance(factors, list) or len(factors) != head_dim // 2
                or not all(isinstance(f, int | float) and not isinstance(f, bool) and f > 0 for f in factors)):
            raise CheckpointError(f"{where}: rope_scaling 'freq_factors' needs head_dim/2 = {head_dim // 2} "
                                  "positive factors")
        return
    factor = scaling.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 0:
        raise CheckpointError(f"{where}: rope_scaling factor must be a number > 0, got {factor!r}")
    if kind == "llama3" and not isinstance(scaling.get("original_max_position_embeddings"), int):
        raise CheckpointError(f"{where}: rope_scaling 'llama3' needs original_max_position_embeddings")


def expected_tensor_shapes(arch: ModelArch) -> dict[str, tuple[int, ...]]:
    """HF parameter name -> HF shape ([out, in] for linears) for every tensor the model needs."""
    h, i, d = arch.hidden_size, arch.intermediate_size, arch.head_dim
    q_rows, kv_rows = arch.num_attention_heads * d, arch.num_key_value_heads * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (arch.vocab_size, h)}
    for n in range(arch.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q_rows, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv_rows, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv_rows, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, q_rows)
        if arch.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q_rows,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_rows,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_rows,)
        if arch.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
    shapes["model.norm.weight"] = (h,)
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, h)
    return shapes


def check_tensor_set(
    expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], where: Callable[[str], str]
) -> None:
    """Raise CheckpointError for the first missing, extra or misshaped tensor.

    ``where(name)`` names the file holding ``name`` (shards differ per tensor).
    """
    missing = [n for n in expected if n not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{where(missing[0])}: missing tensor {missing[0]!r}{more}")
    extra = sorted(n for n in found if n not in expected)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise CheckpointError(f"{where(extra[0])}: unexpected tensor {extra[0]!r}{more}")
    for name, shape in expected.items():
        if tuple(found[name]) != tuple(shape):
            raise CheckpointError(
                f"{where(name)}: tensor {name!r} has shape {list(found[name])}, expected {list(shape)}"
            )


def sliced_shape(shape: tuple[int, ...], sl: Slice | None) -> tuple[int, ...]:
    """The shape of slice ``sl`` of a tensor of ``shape`` (the whole shape when None)."""
    if sl is None:
        return tuple(shape)
    dim, a, b = sl
    return tuple(b - a if i == dim else s for i, s in enumerate(shape))


class Checkpoint:
    """An opened, validated checkpoint. Subclasses implement ``_iter_raw``.

    Construction reads only metadata (headers, config, tokenizer); weights are read
    lazily, one tensor at a time, by ``iter_tensors`` / ``load_into``.
    """

    format: str = ""

    def __init__(
        self,
        path: Path,
        arch: ModelArch,
        specs: dict[str, tuple[tuple[int, ...], str]],
        tokenizer: Tokenizer,
        generation_defaults: dict[str, Any],
        eos_token_ids: list[int],
    ) -> None:
        self.path = path
        self.arch = arch
        self._specs = specs
        self.tokenizer = tokenizer
        self.generation_defaults = generation_defaults
        self.eos_token_ids = eos_token_ids
        # bytes of tensor data read from the file so far, as stored (quantized blocks for GGUF):
        # a tensor-parallel shard reads about its share (tests/test_tp_engine.py)
        self.bytes_read = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.format} {self.arch.architecture} {self.path}>"

    def drop_pages(self) -> None:
        """The weights were copied where they serve: let go of the file's pages this process
        mapped while reading them (a memory-mapped format's override). They stay in the page
        cache and are mapped again if read again; until then they are not this process's RSS."""

    def tensor_specs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """HF name -> (HF shape, stored dtype name: float32/float16/bfloat16, or a GGUF quant like q4_1)."""
        return dict(self._specs)

    def num_parameters(self) -> int:
        total = 0
        for shape, _ in self._specs.values():
            n = 1
            for s in shape:
                n *= s
            total += n
        return total

    def _iter_raw(self, dtype: torch.dtype, slices: Mapping[str, Slice | None] | None = None,
                  skip: Collection[str] = ()) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, tensor) in HF layout converted to ``dtype``; with ``slices``, only the
        slice ``slices[name]`` of each tensor (a tensor-parallel shard's part), read as
        such from the file (never the whole tensor), counted in ``bytes_read``. Tensors
        named in ``skip`` are neither read nor yielded (packed ones: read_q4)."""
        raise NotImplementedError

    def iter_tensors(self, dtype: torch.dtype, slices: Mapping[str, Slice | None] | None = None,
                     skip: Collection[str] = ()) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (HF name, tensor in HF layout converted to ``dtype``), one tensor at a time.

        ``slices``: name -> (dim, start, stop) or None (engine/tp/layout.py): the reader
        reads only rows (dim 0) or columns (dim 1) [start, stop) of that tensor."""
        for name, tensor in self._iter_raw(dtype, slices, skip):
            shape = sliced_shape(self._specs[name][0], slices.get(name) if slices else None)
            if tuple(tensor.shape) != shape:  # a reader bug or a file changed under us
                raise CheckpointError(
                    f"{self.path}: tensor {name!r} read with shape {list(tensor.shape)}, expected {list(shape)}"
                )
            yield name, tensor

    def read_float(self, name: str) -> Any:
        """One tensor as float32 numpy, HF layout (what `int8` / `int4` quantize at load)."""
        import torch

        for _, tensor in self.iter_tensors(torch.float32, skip=set(self._specs) - {name}):
            return tensor.numpy()
        raise CheckpointError(f"{self.path}: no tensor {name!r}")

    def read_q4(self, name: str) -> tuple[Any, Any, Any]:
        """A float tensor quantized to Q4_1 blocks (engine/models/quantize_float.py); a GGUF
        reader overrides this with the file's own blocks."""
        from janusd.engine.models.quantize_float import q4_blocks

        return q4_blocks(self.read_float(name))

    def read_q8(self, name: str) -> tuple[Any, Any]:
        """A float tensor quantized to Q8_0 blocks (engine/models/quantize_float.py); a GGUF
        reader overrides this with the file's own blocks."""
        from janusd.engine.models.quantize_float import q8_blocks

        return q8_blocks(self.read_float(name))

    def load_into(self, dest: Callable[[str], torch.Tensor], dtype: torch.dtype,
                  slices: Mapping[str, Slice | None] | None = None, skip: Collection[str] = ()) -> None:
        """Copy every tensor into ``dest(name)`` (a preallocated view of exactly the HF shape,
        or with ``slices`` of the slice's shape; a slice shorter than its destination along
        the sliced dim, a vocabulary shard's padding, fills the front and zeroes the rest).

        Only one source tensor is alive at a time. A progress bar appears when loading
        takes longer than a second (tqdm's ``delay``), and stays quiet off a terminal.
        """
        from tqdm import tqdm

        start = time.monotonic()
        with tqdm(
            total=len(self._specs) - len(skip), desc=f"loading {self.path.name}", unit="tensor", delay=1.0, disable=None, leave=False
        ) as bar:
            for name, tensor in self.iter_tensors(dtype, slices, skip):
                target = dest(name)
                sl = slices.get(name) if slices else None
                if sl is not None and tuple(target.shape) != tuple(tensor.shape):
                    dim = sl[0]
                    n = tensor.shape[dim]
                    if (target.dim() != tensor.dim() or n > target.shape[dim]
                            or any(a != b for i, (a, b) in enumerate(zip(target.shape, tensor.shape)) if i != dim)):
                        raise CheckpointError(
                            f"{self.path}: destination for the slice of tensor {name!r} has shape "
                            f"{list(target.shape)}, expected {list(tensor.shape)} (or longer along dim {dim})"
                        )
                    target.narrow(dim, n, target.shape[dim] - n).zero_()
                    target = target.narrow(dim, 0, n)
                if tuple(target.shape) != tuple(tensor.shape):
                    raise CheckpointError(
                        f"{self.path}: destination for tensor {name!r} has shape {list(target.shape)}, "
                        f"expected {list(tensor.shape)}"
                    )
                target.copy_(tensor)
                del tensor
                bar.update(1)
        self.last_load_seconds = time.monotonic() - start

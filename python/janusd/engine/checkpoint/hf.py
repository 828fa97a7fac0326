"""HF checkpoint directories: config.json + safetensors (single or sharded) + tokenizer.json.

Shapes and dtypes come from the safetensors headers, parsed directly (8-byte length +
JSON) so that opening a checkpoint reads a few KB per shard, never the weights. Tensor
data is read later through safetensors' mmap-backed ``safe_open``, one tensor at a time
(a tensor-parallel shard reads only its rows or columns, through ``get_slice``).
Pickle-based ``pytorch_model.bin`` checkpoints are refused on purpose.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from janusd.engine.checkpoint.base import Checkpoint, CheckpointError, Slice, check_tensor_set, expected_tensor_shapes
from janusd.engine.checkpoint.hf_config import arch_from_config, generation_defaults, load_hf_tokenizer, read_json

if TYPE_CHECKING:
    import torch

FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
MAX_HEADER = 100 * 1024 * 1024


def read_safetensors_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, safetensors dtype code) from a file's header; CheckpointError if corrupt."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: corrupt safetensors file (shorter than its header length)")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER or 8 + n > size:
                raise CheckpointError(f"{path}: corrupt safetensors file (header length {n} exceeds the file)")
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors header: {e}") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not an object)")
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    data_len = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
            dtype = str(info["dtype"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupt safetensors header entry for tensor {name!r}") from None
        if not 0 <= begin <= end <= data_len:
            raise CheckpointError(f"{path}: tensor {name!r} lies outside the file (truncated?)")
        out[name] = (shape, dtype)
    return out


def _skip(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


class HFCheckpoint(Checkpoint):
    format = "hf"

    def __init__(self, root: Path) -> None:
        root = Path(root)
        if not root.is_dir():
            raise CheckpointError(f"{root}: not a checkpoint directory")
        cfg = read_json(root / "config.json")
        arch = arch_from_config(cfg, root / "config.json")
        self._file_of = self._locate_tensors(root)
        found: dict[str, tuple[int, ...]] = {}
        dtypes: dict[str, str] = {}
        headers: dict[Path, dict[str, tuple[tuple[int, ...], str]]] = {}
        for file in sorted(set(self._file_of.values())):
            headers[file] = read_safetensors_header(file)
        for name, file in list(self._file_of.items()):
            if name not in headers[file]:
                raise CheckpointError(f"{file}: tensor {name!r} listed in the index is not in this shard")
        for file, header in headers.items():
            for name, (shape, dtype) in header.items():
                if _skip(name):
                    continue
                if self._file_of.get(name, file) != file:
                    continue  # the index says another shard holds it
                self._file_of[name] = file
                found[name] = shape
                dtypes[name] = dtype
        for name in [n for n in self._file_of if _skip(n)]:
            del self._file_of[name]
        if arch.tie_word_embeddings and "lm_head.weight" in found:
            del found["lm_head.weight"]  # tied: the model uses embed_tokens; a stored copy is redundant
            del self._file_of["lm_head.weight"]
        expected = expected_tensor_shapes(arch)
        index = root / "model.safetensors.index.json"
        shards = sorted(set(self._file_of.values()))
        fallback = index if index.exists() else (shards[0] if len(shards) == 1 else root)
        check_tensor_set(expected, found, lambda name: str(self._file_of.get(name, fallback)))
        specs: dict[str, tuple[tuple[int, ...], str]] = {}
        for name, shape in expected.items():
            code = dtypes[name]
            if code not in FLOAT_DTYPES:
                raise CheckpointError(
                    f"{self._file_of[name]}: tensor {name!r} has dtype {code}, expected one of {sorted(FLOAT_DTYPES)}"
                )
            specs[name] = (shape, FLOAT_DTYPES[code])
        defaults, eos = generation_defaults(root, cfg)
        tokenizer = load_hf_tokenizer(root, eos)
        all_eos = list(eos) + [i for i in tokenizer.eos_token_ids if i not in eos]
        defaults["eos_token_id"] = all_eos
        tokenizer.eos_token_ids = all_eos
        super().__init__(root, arch, specs, tokenizer, defaults, all_eos)

    @staticmethod
    def _locate_tensors(root: Path) -> dict[str, Path]:
        """name -> shard file, from model.safetensors.index.json, else every *.safetensors file's header."""
        index = root / "model.safetensors.index.json"
        if index.exists():
            data = read_json(index)
            weight_map = data.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: no weight_map")
            for name, f in weight_map.items():
                if not isinstance(f, str) or not f:
                    raise CheckpointError(f"{index}: tensor {name!r} has shard {f!r}, expected a file name")
            files = {f: root / f for f in set(weight_map.values())}
            for f, p in files.items():
                if not p.exists():
                    raise CheckpointError(f"{p}: missing file (a shard named in {index.name})")
            return {name: files[f] for name, f in weight_map.items()}
        shards = sorted(root.glob("*.safetensors"))
        if not shards:
            pickled = " (pickle .bin checkpoints are not supported)" if list(root.glob("*.bin")) else ""
            raise CheckpointError(f"{root / 'model.safetensors'}: missing file{pickled}")
        out: dict[str, Path] = {}
        for shard in shards:
            for name in read_safetensors_header(shard):
                if name in out:
                    raise CheckpointError(f"{shard}: tensor {name!r} also appears in {out[name].name}")
                out[name] = shard
        return out

    def _iter_raw(self, dtype: torch.dtype, slices: Mapping[str, Slice | None] | None = None,
                  skip: Collection[str] = ()) -> Iterator[tuple[str, torch.Tensor]]:
        from safetensors import SafetensorError, safe_open

        by_file: dict[Path, list[str]] = {}
        for name in self._specs:
            if name in skip:
                continue
            by_file.setdefault(self._file_of[name], []).append(name)
        for file, names in by_file.items():
            try:
                handle = safe_open(str(file), framework="pt")
            except (SafetensorError, OSError) as e:
                raise CheckpointError(f"{file}: cannot open: {e}") from e
            with handle as f:
                for name in names:
                    sl = slices.get(name) if slices else None
                    try:
                        if sl is None:
                            tensor = f.get_tensor(name)
                        else:  # a shard's rows or columns: safetensors reads only those bytes (mmap)
                            dim, a, b = sl
                            part = f.get_slice(name)
                            tensor = part[a:b] if dim == 0 else part[:, a:b]
                    except (SafetensorError, OSError) as e:
                        raise CheckpointError(f"{file}: cannot read tensor {name!r}: {e}") from e
                    self.bytes_read += tensor.numel() * tensor.element_size()
                    yield name, tensor.to(dtype)

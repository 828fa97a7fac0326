"""DeviceEngine: several models on one device, sharing one xTensor page pool.

Each loaded model gets one weight segment (all its parameters are views into it) and
one KV region that maps pool pages only while its sequences need them, so the KV of
one model grows into pages another model released. `step()` runs one engine step of
every model that has work, one after the other on the calling thread (interleaved):
on CPU a model's step already uses all intra-op threads, so a thread per model would
only make them fight for the same cores; measured in `janus bench engine`
(co-location throughput vs each model alone).

Device kinds share this code path: "cpu" here, "cuda" through torch, "npu" through
torch_npu, imported only when configured; a missing runtime is one clear EngineError.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from janusd.engine.kv_cache import PagedKVCache
from janusd.engine.models.llama import LlamaModel
from janusd.engine.models.qlinear import keeps_q4
from janusd.engine.models.weights import WeightPlan, landing_groups, load_weights, materialize, plan_weights
from janusd.engine.restore import Copier, HostCopy, host_buffer, plain_view, sync_device, trim_heap, wait_landed
from janusd.engine.runner import ModelEngine, torch_dtype
from janusd.engine.types import EngineError, StepOutput


@dataclass
class Placement:
    """Where an Active model lives on the device, kept beside its engine so that leaving
    Active can copy the weights out (Warm) and free exactly what the model held."""

    model_cfg: Any
    engine_cfg: Any
    plan: Any  # WeightPlan
    segment: Any  # memory.WeightSegment
    region: Any  # memory.KvRegion


def check_device_runtime(kind: str, device_index: int) -> torch.device:
    """The torch device for `kind`, or an EngineError naming what is missing."""
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise EngineError("device kind 'cuda' is configured but torch sees no CUDA device (driver/runtime missing?)")
        if device_index >= torch.cuda.device_count():
            raise EngineError(f"cuda device {device_index} does not exist ({torch.cuda.device_count()} visible)")
        return torch.device("cuda", device_index)
    if kind == "npu":
        try:
            import torch_npu  # type: ignore[import-not-found]  # noqa: F401
        except ImportError as e:
            raise EngineError(f"device kind 'npu' is configured but torch_npu cannot be imported: {e}") from None
        return torch.device("npu", device_index)
    raise EngineError(f"unknown device kind {kind!r} (cpu, cuda, npu)")


def weight_plan(ck: Any, dtype_name: str, device_kind: str) -> WeightPlan:
    """The whole model's weight plan for `dtype_name` (a config dtype: "auto" keeps a GGUF's
    Q4 linears packed on cpu, engine/models/qlinear.py) on a `device_kind` device; every
    load, host copy, image and fork of the model lays its bytes out by it."""
    return plan_weights(ck.arch, ck.tensor_specs(), torch_dtype(dtype_name), quantized=keeps_q4(dtype_name, device_kind),
                        quantize_to=dtype_name)


def shard_plan(ck: Any, shard: Any, dtype_name: str) -> WeightPlan:
    """A tp shard's weight plan: its own arch and shapes (engine/tp/layout.py), never
    packed. A fork of shard i reads it byte for byte from the source's shard i."""
    return plan_weights(shard.layout.local, shard.layout.local_specs(ck.tensor_specs()), torch_dtype(dtype_name))


class DeviceEngine:
    def __init__(self, kind: str = "cpu", device_index: int = 0, memory_bytes: int = 2 << 30,
                 page_size: int = 2 << 20, kv_cache_pages: tuple[int, int] | None = None,
                 resident_bytes: int = 0) -> None:
        """`kv_cache_pages` = (low, high) watermarks of each KV region's cache of mapped
        spare pages (xTensor's defaults when None; (0, 0) returns every page at once).
        `resident_bytes` (cpu): the top of the pool kept backed by host memory from now
        on (DevicePool resident_pages), so weights restored there are written at memcpy
        speed."""
        self.device = check_device_runtime(kind, device_index)
        if memory_bytes < page_size or memory_bytes % page_size:
            raise EngineError(f"memory_bytes {memory_bytes} must be a positive multiple of page_size {page_size}")
        if not 0 <= resident_bytes <= memory_bytes or resident_bytes % page_size:
            raise EngineError(f"resident_bytes {resident_bytes} must be a multiple of page_size {page_size} "
                              f"between 0 and memory_bytes {memory_bytes}")
        from janusd.memory import DevicePool, XTensorError

        self.kind = kind
        try:
            self.pool = DevicePool(kind=kind, num_pages=memory_bytes // page_size, page_size=page_size,
                                   device_index=device_index, resident_pages=resident_bytes // page_size)
        except XTensorError as e:
            raise EngineError(f"device memory: {e}") from None
        self.models: dict[str, ModelEngine] = {}
        self.host: dict[str, HostCopy] = {}  # Warm models: host copies of their weights
        self._kv_cache_pages = kv_cache_pages
        self._building: set[str] = set()
        self._lock = threading.Lock()
        self._stalled = False  # every model stepped last time did nothing (and freed nothing)

    def load_model(self, model_cfg: Any, engine_cfg: Any, cache_dir: Path | None = None, checkpoint: Any = None,
                   shard: Any = None) -> ModelEngine:
        """Open the checkpoint, place its weights in one segment, reserve its KV region.

        `checkpoint` may pass an already opened Checkpoint (the bench opens once).
        `shard` (engine/tp/shard.py TPShard): load only this shard's slices of a
        tensor-parallel model; its weights and KV pages live in this device's pool."""
        return self.register(self.build_model(model_cfg, engine_cfg, cache_dir, checkpoint, shard))

    def build_model(self, model_cfg: Any, engine_cfg: Any, cache_dir: Path | None = None,
                    checkpoint: Any = None, shard: Any = None) -> ModelEngine:
        """Everything of a load except making the model visible to step(): safe to run on
        another thread while this device steps its other models (the pool is thread-safe
        and nothing here touches them), so loading a model never stalls its neighbours.
        Hand the result to register() on the stepping thread."""
        name = model_cfg.name
        with self._lock:
            if name in self.models or name in self._building:
                raise EngineError(f"model {name!r} is already loaded on this device")
            self._building.add(name)
        try:
            return self._build(model_cfg, engine_cfg, cache_dir, checkpoint, shard)
        except BaseException:
            with self._lock:
                self._building.discard(name)
            raise

    def register(self, me: ModelEngine) -> ModelEngine:
        """Make a built model steppable (call on the thread that calls step())."""
        with self._lock:
            self._building.discard(me.name)
            self.models[me.name] = me
        return me

    def drop_built(self, me: ModelEngine) -> None:
        """Free a built model that will not be registered (a tp group whose other shard
        failed): its pages go back, its name is free again."""
        self.release(me, None, keep_host=False)
        with self._lock:
            self._building.discard(me.name)

    def _build(self, model_cfg: Any, engine_cfg: Any, cache_dir: Path | None, checkpoint: Any,
               shard: Any = None) -> ModelEngine:
        from janusd.engine.loader import open_checkpoint

        ck = checkpoint if checkpoint is not None else open_checkpoint(model_cfg.checkpoint, cache_dir)
        if shard is None:
            plan = weight_plan(ck, model_cfg.dtype, self.kind)
            slices = None
        else:  # the shard's own arch and shapes, never packed; the reader reads only its slices
            plan = shard_plan(ck, shard, model_cfg.dtype)
            slices = shard.layout.slices(ck.tensor_specs())

        def fill(seg: Any) -> dict[str, Any]:
            views = materialize(plan, seg.view)
            load_weights(ck, plan, views, slices)
            ck.drop_pages()  # the segment holds the weights now
            return views

        return self._on_device(model_cfg, engine_cfg, ck, plan, fill, shard)

    def _on_device(self, model_cfg: Any, engine_cfg: Any, ck: Any, plan: Any, fill: Any,
                   shard: Any = None) -> ModelEngine:
        """Reserve the weight segment, `fill(seg)` it (returns the views), reserve the KV
        region, build the engine. Anything that fails frees what was reserved: the pool is
        as before (an out-of-memory restore rolls back, never half-loaded)."""
        from janusd.memory import XTensorError

        name = model_cfg.name
        arch = ck.arch
        try:
            seg = self.pool.alloc_weights(name, plan.total_bytes)
            views = fill(seg)
            model = LlamaModel(arch, views, max_positions=model_cfg.max_model_len, shard=shard)
            if self._kv_cache_pages is None:
                region = self.pool.kv_region(name, model_cfg.kv_cache_mib << 20)
            else:
                low, high = self._kv_cache_pages
                region = self.pool.kv_region(name, model_cfg.kv_cache_mib << 20, cache_low=low, cache_high=high)
            kv = PagedKVCache(region, shard.layout.local if shard is not None else arch, plan.dtype,
                              engine_cfg.block_size)
            # its own weights never leave while it serves: KV beyond the rest of the pool never fits
            max_kv_blocks = kv.blocks_within(self.pool.num_pages - len(seg.page_ids))
            tokenizer = ck.tokenizer  # an image's may still be being built (host_image.py): wait here
        except XTensorError as e:
            self._release(name)
            raise EngineError(f"model {name!r}: device memory: {e}") from None
        except BaseException:
            self._release(name)
            raise
        me = ModelEngine(
            name, model, kv, tokenizer, eos_token_ids=list(ck.eos_token_ids),
            max_model_len=min(model_cfg.max_model_len, arch.max_position_embeddings),
            max_num_seqs=engine_cfg.max_num_seqs, max_num_batched_tokens=engine_cfg.max_num_batched_tokens,
            role=model_cfg.role, dtype_name=model_cfg.dtype,
            kv_wait_timeout_s=engine_cfg.kv_wait_timeout_s, max_kv_blocks=max_kv_blocks,
        )
        me.checkpoint = ck  # type: ignore[attr-defined]
        me.weight_bytes = plan.total_bytes  # type: ignore[attr-defined]
        me.placement = Placement(model_cfg, engine_cfg, plan, seg, region)  # type: ignore[attr-defined]
        return me

    # ---- Active <-> Warm / Cold (engine/restore.py) ----
    def stage_host_copy(self, model_cfg: Any, engine_cfg: Any, cache_dir: Path | None = None,
                        checkpoint: Any = None) -> HostCopy:
        """Read the checkpoint into a host copy (Loading/Cold -> Warm): the device is not touched."""
        from janusd.engine.loader import open_checkpoint

        ck = checkpoint if checkpoint is not None else open_checkpoint(model_cfg.checkpoint, cache_dir)
        plan = weight_plan(ck, model_cfg.dtype, self.kind)
        buf, pinned = host_buffer(plan.total_bytes, self.kind)
        load_weights(ck, plan, materialize(plan, plain_view(buf)))
        ck.drop_pages()
        return HostCopy(model_cfg.name, model_cfg, engine_cfg, ck, plan, buf, pinned)

    def restore_model(self, host: HostCopy, copier: Copier, phases: dict[str, float], model_cfg: Any = None,
                      engine_cfg: Any = None, overlap: bool = False) -> ModelEngine:
        """Warm -> Active by H2D: a fresh segment, the host bytes copied in chunks, the views
        rebuilt at the plan's offsets. `phases` gets prepare / transfer / restore seconds.
        `model_cfg` / `engine_cfg`: what this activation asked for (SetState's), else the
        host copy's: the weights are the same, but an elastic P/D instance may come back
        in another engine role than the one its copy was made in (policy/roles.py).
        Run like build_model (off the stepping thread), then register().

        `overlap` (cpu, from a host buffer): return once the model is built and the copy has
        started, layer by layer in the forward's order; the forward waits for each layer's
        bytes (restore.Copier.copy_in_order). No `transfer` phase then: it runs on."""
        name = host.name
        with self._lock:
            if name in self.models or name in self._building:
                raise EngineError(f"model {name!r} is already loaded on this device")
            self._building.add(name)
        t0 = time.perf_counter()
        marks = {"prepare": 0.0, "transfer": 0.0}
        overlap = overlap and host.buf is not None and self.device.type == "cpu" and host.shard is None
        later: list[torch.Tensor] = []  # an overlapped copy starts once nothing of the build can fail

        def fill(seg: Any) -> dict[str, torch.Tensor]:
            t1 = time.perf_counter()
            marks["prepare"] = t1 - t0
            dst = seg.tensor()[: host.nbytes]
            if overlap:
                later.append(dst)
            elif host.buf is not None:
                marks["transfer"] = copier.copy(dst, host.buf)
            elif host.file is not None:
                marks["transfer"] = copier.read_file(dst, host.file)
            else:
                raise EngineError(f"model {name!r}: the host copy has neither a buffer nor a file")
            marks["after"] = time.perf_counter()
            return materialize(host.plan, seg.view)

        try:
            me = self._on_device(model_cfg or host.model_cfg, engine_cfg or host.engine_cfg, host.checkpoint,
                                 host.plan, fill, host.shard)
        except BaseException:
            with self._lock:
                self._building.discard(name)
            raise
        if later and host.buf is not None:
            try:
                me.model.landing = copier.copy_in_order(
                    later[0], host.buf, landing_groups(host.plan, host.checkpoint.arch.num_hidden_layers))
            except BaseException:  # nothing started: free what was built, as a failed build does
                self.release(me, None, keep_host=False)
                with self._lock:
                    self._building.discard(name)
                raise
            phases["prepare"] = phases.get("prepare", 0.0) + marks["prepare"]
            phases["restore"] = time.perf_counter() - t0 - marks["prepare"]
            return me
        phases["prepare"] = phases.get("prepare", 0.0) + marks["prepare"]
        phases["transfer"] = phases.get("transfer", 0.0) + marks["transfer"]
        phases["restore"] = time.perf_counter() - marks.get("after", t0)
        return me

    def detach(self, name: str) -> ModelEngine:
        """Stop stepping the model (call on the stepping thread); its requests are aborted.
        The memory is freed by release(), which may run on another thread."""
        me = self.models.pop(name, None)
        if me is None:
            raise EngineError(f"model {name!r} is not active on this device")
        for rid in list(me.seqs):
            me.abort(rid)
        return me

    def release(self, me: ModelEngine, copier: Copier | None, keep_host: bool,
                return_pages: bool | None = None) -> tuple[HostCopy | None, float]:
        """Free a detached model's KV pages and weight segment; with keep_host, first copy
        the weights into a host copy (D2H). Returns (the host copy or None, seconds copying).

        `return_pages` (default: not keep_host): on cpu devices also give the pages' host
        memory back to the OS, so the worker's RSS drops (Cold, Unloaded), except pages
        of the pool's resident zone (`devices.resident_mib`). Warm keeps them resident in
        the pool, as a GPU keeps its HBM: the restore that follows then copies at memory
        speed instead of paying the kernel's page zeroing on first touch (about 1 GB/s on
        this VM, several times slower than memcpy; `janus bench restore`)."""
        name = me.name
        pl: Placement = me.placement  # type: ignore[attr-defined]
        wait_landed(me.model)  # an overlapped restore's copy may still be writing the segment
        sync_device(me.device)  # no kernel of this model may still touch the memory
        host = None
        seconds = 0.0
        if keep_host:
            buf, pinned = host_buffer(pl.plan.total_bytes, self.kind)
            seconds = (copier or Copier(1)).copy(buf, pl.segment.tensor()[: pl.plan.total_bytes])
            host = HostCopy(name, pl.model_cfg, pl.engine_cfg, me.checkpoint, pl.plan, buf, pinned,  # type: ignore[attr-defined]
                            shard=getattr(me.model, "shard", None))  # a tp shard's copy: this shard's bytes
        pages = pl.segment.page_ids + pl.region.page_ids()
        me.close()
        me.placement = None  # type: ignore[attr-defined]
        del me, pl
        give_back = (not keep_host) if return_pages is None else return_pages
        if give_back:
            self.pool.give_back(pages)
        self.pool.free(name)
        if give_back:
            trim_heap()
        return host, seconds

    def _release(self, name: str) -> None:
        """Free whatever a failed load got (possibly nothing: the pool then says unknown owner)."""
        from janusd.memory import XTensorError

        try:
            self.pool.free(name)
        except XTensorError:
            pass

    def unload_model(self, name: str) -> None:
        """Drop the model's views, then return all its pages (weights and KV) to the pool,
        and any host copy of it (Unloaded holds nothing)."""
        host = self.host.pop(name, None)
        if name not in self.models and host is not None:
            return
        self.release(self.detach(name), None, keep_host=False)

    def has_work(self) -> bool:
        return any(m.has_work() for m in self.models.values())

    def waiting_for_pages(self) -> bool:
        """Every model with work scheduled nothing in its last step (they wait for KV
        pages), and no model stepped last time finished, failed or preempted anything: the
        caller should wait briefly rather than step again at once. A model that gave pages
        back after another's step already stalled makes the next step worth running now."""
        busy = [m for m in self.models.values() if m.has_work()]
        return self._stalled and bool(busy) and all(m.waiting_for_pages() for m in busy)

    def step(self) -> list[StepOutput]:
        out: list[StepOutput] = []
        now = time.monotonic()
        stepped = [me for me in list(self.models.values()) if me.has_work()]
        for me in stepped:
            out += me.step(now)
        self._stalled = all(me.waiting_for_pages() for me in stepped)
        return out

    def shrink_kv(self) -> int:
        return sum(m.shrink_kv() for m in self.models.values())

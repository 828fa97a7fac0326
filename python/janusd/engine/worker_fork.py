"""D2D fork on the worker, both ends: the source publishes where its weight segment is,
with sampled-block checksums; the target reads those bytes into a segment of its own over
Mooncake, verifies sizes and checksums, and builds the model on them. A tp group forks
shard by shard (`pull_shard`: shard i of the source into shard i of the target, each
shard's worker pulling its own at once).

A fork copies bytes, not tensors, so both ends must lay the weights out identically
(`layout_signature`); the checksums catch a source that changed or died mid-read. The
target's pull runs on a lifecycle thread (engine/worker_lifecycle.py) and may be paced
(`lifecycle.fork_bandwidth_mib_s`) so a source that serves keeps its CPU.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from janusd.wire import worker_msgs as wm


def layout_signature(plan: Any) -> str:
    """The weight plan's identity: every tensor's offset and shape, the dtype and the
    size. A fork copies bytes, so source and target must lay them out identically."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{plan.dtype}|{plan.total_bytes}".encode())
    if plan.quant or plan.q8:  # the file's blocks split into qs and scales (models/qkernel.py)
        h.update(b"|quant:gguf-blocks-1")
    for name in sorted(plan.slots):
        s = plan.slots[name]
        h.update(f"|{name}:{s.offset}:{s.shape}:{s.parent}:{s.row0}".encode())
        if s.dtype is not None:
            h.update(f":{s.dtype}".encode())
    return h.hexdigest()


def sample_blocks(nbytes: int, count: int, block: int) -> list[tuple[int, int]]:
    """`count` blocks of `block` bytes spread evenly over [0, nbytes), first and last included."""
    if nbytes <= 0 or count <= 0:
        return []
    block = min(block, nbytes)
    if count == 1:
        return [(0, block)]
    span = nbytes - block
    starts = sorted({span * i // (count - 1) for i in range(count)})
    return [(s, block) for s in starts]


def checksums(buf: Any, blocks: list[tuple[int, int]]) -> list[tuple[int, int, str]]:
    out = []
    for off, n in blocks:
        out.append((off, n, hashlib.blake2b(buf[off: off + n].cpu().numpy().tobytes(), digest_size=16).hexdigest()))
    return out


def publish(de: Any, pd: Any, msg: wm.PublishWeights) -> Any:
    """A fork's source: where our weight segment is, with sampled-block checksums."""
    me = de.models.get(msg.name)
    if me is None:
        return wm.ErrorReply(msg.seq, f"model {msg.name!r} is not active on this worker", "bad_request")
    try:
        pd.ensure()  # the global region registered with Mooncake (once per worker)
    except Exception as e:
        return wm.ErrorReply(msg.seq, f"cannot serve a fork: the transfer engine failed: {e}", "internal")
    landing = me.model.landing  # restored overlapped and still landing: publish whole bytes only
    if landing is not None:
        try:
            landing.wait_all()
        except Exception as e:
            return wm.ErrorReply(msg.seq, f"cannot serve a fork: {e}", "internal")
    pl = me.placement
    n = pl.plan.total_bytes
    blocks = sample_blocks(n, msg.verify_blocks, msg.verify_block_bytes)
    src = wm.ForkSource(pd.transport.session, int(de.pool.global_base), pl.segment.global_pieces(n), n,
                        layout_signature(pl.plan), checksums(pl.segment.tensor(), blocks))
    return wm.WeightsPublished(msg.seq, msg.name, src)


def pull_model(de: Any, pd: Any, msg: wm.SetState, host: Any, phases: dict[str, float],
               from_image: Callable[[wm.SetState], Any]) -> Any:
    """D2D: reserve our segment, read the source's bytes into it over Mooncake (many
    pieces in one batch: several transfers in flight), verify sizes and the sampled
    checksums, rebuild the views. The tensor table and tokenizer come from `host` (a
    Warm copy), else `from_image(msg)` (the converted image), else the checkpoint."""
    from janusd.engine.loader import open_checkpoint
    from janusd.engine.device_engine import weight_plan
    from janusd.engine.models.weights import materialize
    from janusd.engine.types import EngineError
    src = msg.fork
    assert src is not None
    t0 = time.perf_counter()
    if host is None:  # the tensor table and tokenizer from the image when there is one
        host = from_image(msg)
    if host is not None:
        ck, plan = host.checkpoint, host.plan
    else:
        ck = open_checkpoint(msg.model.checkpoint, Path(msg.cache_dir) if msg.cache_dir else None)
        plan = weight_plan(ck, msg.model.dtype, de.kind)
    if layout_signature(plan) != src.layout or plan.total_bytes != src.nbytes:
        raise EngineError(f"the source lays out {src.nbytes} bytes differently from this worker's "
                          f"{plan.total_bytes} (another dtype or checkpoint?)")
    pd.ensure()
    chunk = msg.lifecycle.copy_chunk_mib << 20
    marks: dict[str, float] = {}

    def fill(seg: Any) -> Any:
        t1 = time.perf_counter()
        marks["prepare"] = t1 - t0
        pull_segment(pd.transport, src, seg, chunk, msg.lifecycle.fork_bandwidth_mib_s * float(1 << 20))
        marks["transfer"] = time.perf_counter() - t1
        marks["after"] = time.perf_counter()
        return materialize(plan, seg.view)

    me = build_once(de, msg.model.name, lambda: de._on_device(msg.model, msg.engine, ck, plan, fill))
    phases.update(prepare=marks.get("prepare", 0.0), transfer=marks.get("transfer", 0.0),
                  restore=time.perf_counter() - marks.get("after", t0))
    return me


def pull_shard(de: Any, pd: Any, msg: wm.LoadModel, ck: Any, shard: Any) -> Any:
    """A tp shard's D2D fork (a LoadModel with `fork`): reserve this shard's segment, read
    shard i of the source (the same rank) into it over Mooncake, verify as pull_model does,
    build the shard on it (not registered: the group agrees first, engine/worker_tp.py).
    Raises when the pull fails or does not verify; the caller falls back to the slices."""
    from janusd.engine.device_engine import shard_plan
    from janusd.engine.models.weights import materialize
    from janusd.engine.types import EngineError

    src = msg.fork
    assert src is not None
    plan = shard_plan(ck, shard, msg.model.dtype)
    if layout_signature(plan) != src.layout or plan.total_bytes != src.nbytes:
        raise EngineError(f"the source shard lays out {src.nbytes} bytes differently from this shard's "
                          f"{plan.total_bytes} (another dtype, checkpoint or tp?)")
    pd.ensure()
    chunk = msg.lifecycle.copy_chunk_mib << 20
    pace = msg.lifecycle.fork_bandwidth_mib_s * float(1 << 20)

    def fill(seg: Any) -> Any:
        pull_segment(pd.transport, src, seg, chunk, pace)
        return materialize(plan, seg.view)

    return build_once(de, msg.model.name, lambda: de._on_device(msg.model, msg.engine, ck, plan, fill, shard))


def build_once(de: Any, name: str, build: Callable[[], Any]) -> Any:
    """Run `build` with `name` marked as being built on this device, so a second load of
    the same name is refused while the first pulls; the mark goes if the build fails (on
    success the model's registration takes its place)."""
    from janusd.engine.types import EngineError

    with de._lock:
        if name_taken(de, name):
            raise EngineError(f"model {name!r} is already loaded on this device")
        de._building.add(name)
    try:
        return build()
    except BaseException:
        with de._lock:
            de._building.discard(name)
        raise


def pull_segment(transport: Any, src: wm.ForkSource, seg: Any, chunk_bytes: int, max_bytes_per_s: float = 0.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> int:
    """Read the source's segment bytes into `seg` (ours, reserved) over the transport:
    the pieces paired by lifecycle/transfer.match_pieces, cut into `chunk_bytes` so one
    batch keeps several transfers in flight; then check the byte count and the sampled
    checksums. Raises EngineError (or TransferError) when either does not match.

    `max_bytes_per_s` > 0 paces the pull (lifecycle.fork_bandwidth_mib_s while the source
    serves): batches of at most a 20th of a second's worth, each started no earlier than
    the cap allows, so the source's own work gets the CPU (and, on a shared link, the
    bandwidth) between them."""
    from janusd.engine.types import EngineError
    from janusd.lifecycle.transfer import Piece, match_pieces

    if max_bytes_per_s > 0:
        chunk_bytes = max(1 << 20, min(chunk_bytes, int(max_bytes_per_s / 20)))
    pieces = []
    for p in match_pieces([(int(a), int(n)) for a, n in src.pieces], seg.global_pieces(src.nbytes)):
        for a in range(0, p.nbytes, chunk_bytes):
            pieces.append(Piece(p.src_offset + a, p.dst_offset + a, min(chunk_bytes, p.nbytes - a)))
    if max_bytes_per_s > 0:
        moved = 0
        t0 = clock()
        for p in pieces:
            wait = t0 + moved / max_bytes_per_s - clock()
            if wait > 0:
                sleep(wait)
            moved += transport.read(src.session, src.global_base, [p])
    else:
        moved = transport.read(src.session, src.global_base, pieces)
    if moved != src.nbytes:
        raise EngineError(f"fork moved {moved} bytes, expected {src.nbytes}")
    got = checksums(seg.tensor(), [(o, n) for o, n, _ in src.checksums])
    bad = [o for (o, _, h), (_, _, g) in zip(src.checksums, got) if h != g]
    if bad:
        raise EngineError(f"fork verification failed: {len(bad)} of {len(got)} sampled blocks differ "
                          f"(first at offset {bad[0]})")
    return moved


def name_taken(de: Any, name: str) -> bool:
    return name in de.models or name in de._building

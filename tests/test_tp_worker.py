"""A worker's shard of a tp group (engine/worker_tp.py), driven in this process: every
shard is a TPWorker over a DeviceEngine of its own, the ranks run on threads over gloo on
127.0.0.1. What the daemon test (tests/test_tp_daemon.py) cannot cheaply reach: a group
whose shards do not all build is refused on every shard, naming the shard, and leaves
nothing allocated on the shards that did build; a shard whose fork's pull fails (its
source gone) reads its own slices and the group still builds."""

from __future__ import annotations

import queue
import threading
from typing import Any

from daemon_harness import SHARED_CACHE
from janusd.config import EngineConfig, LifecycleConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.tp.comm import open_store
from janusd.engine.types import EngineError
from janusd.engine.worker_fork import layout_signature
from janusd.engine.worker_pd import PDLink
from janusd.engine.worker_tp import TPWorker
from janusd.wire import worker_msgs as wm


class Shard(TPWorker):
    """TPWorker's attributes as WorkerProc makes them, over a small cpu pool."""

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        self.de = DeviceEngine(memory_bytes=32 << 20)
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.tp_stores: dict[str, Any] = {}
        self.followers: dict[str, Any] = {}
        self.sent: list[Any] = []
        self.pd = PDLink(self.de.pool, "cpu", self.inbox)  # its transfer engine starts at a fork's pull

    def _send(self, msg: Any) -> None:
        self.sent.append(msg)


def build_all(checkpoints: list[str], tp: int, forks: list[wm.ForkSource | None] | None = None,
              free: bool = True) -> list[Any]:
    """build_shard on `tp` shards at once (rank r reads checkpoints[r], or forks from
    forks[r]): each one's result or error."""
    store = open_store("127.0.0.1", 0, 20.0, is_master=True)
    shards = [Shard(10 + r) for r in range(tp)]
    out: list[Any] = [None] * tp

    def run(rank: int) -> None:
        cfg = ModelConfig(name="m", checkpoint=checkpoints[rank], kv_cache_mib=4, max_model_len=256, tp=tp)
        msg = wm.LoadModel(1, wm.WorkerModel.of(cfg), wm.WorkerEngine.of(EngineConfig()), str(SHARED_CACHE),
                           wm.WorkerLifecycle.of(LifecycleConfig()), wm.TPPlace(rank, tp, "127.0.0.1", store.port, 20.0),
                           forks[rank] if forks else None)
        try:
            out[rank] = shards[rank].build_shard(msg)
        except Exception as e:
            out[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if not free:
        return out
    for s in shards:  # nothing stays allocated on any shard of a group that failed
        assert s.de.pool.stats().free_pages == s.de.pool.stats().num_pages
        assert not s.de.models
    return out


def segment_bytes(me: Any) -> bytes:
    pl = me.placement
    return bytes(pl.segment.tensor()[: pl.plan.total_bytes].numpy().tobytes())


def test_heads_that_do_not_divide_are_refused_on_every_shard_naming_the_numbers():
    out = build_all(["demo:llama-tiny"] * 3, 3)
    assert all(isinstance(e, EngineError) for e in out), out
    assert {str(e) for e in out} == {str(out[0])}  # one error for the group, the same on every shard
    assert "num_attention_heads 4 is not divisible by tp 3" in str(out[0])


def test_one_shard_that_fails_fails_the_group_and_the_built_shards_free_theirs():
    out = build_all(["demo:llama-tiny", "demo:nope-tiny"], 2)
    assert all(isinstance(e, EngineError) for e in out), out
    for e in out:
        assert str(e).startswith("tp shard 1 (device 11): "), e
        assert "nope" in str(e)


def test_a_shard_whose_fork_fails_reads_its_own_slices_and_the_group_builds():
    """Shard 1's source is gone (nothing serves its Mooncake session): its pull fails, that
    shard alone reads its slices from the checkpoint (ModelLoaded says why), the group
    builds, and its bytes are those a plain load of shard 1 gives."""
    plain = build_all(["demo:llama-tiny"] * 2, 2, free=False)
    assert not any(isinstance(e, Exception) for e in plain), plain
    pl = plain[1].placement
    gone = wm.ForkSource("127.0.0.1:1", 1 << 40, [(0, pl.plan.total_bytes)], pl.plan.total_bytes,
                         layout_signature(pl.plan))
    out = build_all(["demo:llama-tiny"] * 2, 2, [None, gone], free=False)
    assert not any(isinstance(e, Exception) for e in out), out
    assert out[0].arrival[:2] == ("checkpoint", "")
    path, fallback, nbytes, _ = out[1].arrival
    assert path == "checkpoint" and fallback.startswith("TransferError: ") and nbytes == pl.plan.total_bytes, out[1].arrival
    assert [segment_bytes(me) for me in out] == [segment_bytes(me) for me in plain]

"""A process for tests/test_lifecycle_fork.py (not a test file): `source` loads the demo
model on its own DeviceEngine, publishes its weight segment for a fork (one JSON line:
the ForkSource plus the sha256 of the segment) and serves Mooncake reads until stdin
closes; `target SOURCE_JSON` forks from it, then (after the test kills the source) forks
again and must fall back, printing one JSON line per step."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import sys
import tempfile
from pathlib import Path

import msgspec
import torch

from janusd.config import EngineConfig, LifecycleConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.worker_lifecycle import Done, Lifecycle
from janusd.engine.worker_pd import PDLink
from janusd.wire import worker_msgs as wm

torch.set_num_threads(1)
CACHE = Path(tempfile.gettempdir()) / "janusd-test-cache"
MC = ModelConfig(name="m", checkpoint="demo:llama-tiny", kv_cache_mib=4)


def engine() -> tuple[DeviceEngine, Lifecycle, list]:
    de = DeviceEngine(memory_bytes=16 << 20)
    inbox: queue.Queue = queue.Queue()
    sent: list = []
    life = Lifecycle(de, inbox, PDLink(de.pool, "cpu", inbox), sent.append, lambda *a: None)
    life.inbox = inbox
    return de, life, sent


def run(life: Lifecycle, msg: wm.SetState, sent: list) -> object:
    life.set_state(msg)
    while True:
        item = life.inbox.get(timeout=60)
        if isinstance(item, Done):
            life.done(item)
            return sent[-1]


def seg_sha(de: DeviceEngine) -> str:
    pl = de.models["m"].placement
    return hashlib.sha256(pl.segment.tensor()[: pl.plan.total_bytes].numpy().tobytes()).hexdigest()


def greedy(de: DeviceEngine) -> list[int]:
    from janusd.engine.types import SamplingParams

    out = de.models["m"].generate({"r": [3, 4, 5, 6]}, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    return [t for o in out["r"] for t in o.token_ids]


def pull(nbytes: int, source: str, cap_bytes_per_s: float = 0.0, thread_nice: int = 0) -> int:
    """Pull a synthetic segment (janusd.bench.restore_peer) into a fresh one of ours; say
    "started", then one JSON line: the error (if the test killed the source meanwhile),
    the seconds the pull ran, our pool's free pages before and after, and the nice values
    of the transfer engine's threads and of this main thread."""
    import threading
    import time

    from janusd.engine.worker_fork import pull_segment
    from janusd.lifecycle.transfer import GlobalRegionTransport
    from janusd.memory import DevicePool

    src = msgspec.convert(json.loads(source), wm.ForkSource)
    pool = DevicePool("cpu", nbytes // (2 << 20) + 2, 2 << 20, background=False)
    transport = GlobalRegionTransport(pool.global_base, pool.global_nbytes, thread_nice=thread_nice)
    nice = {"engine": [os.getpriority(os.PRIO_PROCESS, t) for t in transport.engine_threads],
            "main": os.getpriority(os.PRIO_PROCESS, threading.get_native_id())}
    free0 = pool.stats().free_pages
    out: dict = {}

    def run() -> None:
        seg = pool.alloc_weights("w", nbytes)
        t0 = time.perf_counter()
        try:
            pull_segment(transport, src, seg, 1 << 20, cap_bytes_per_s)
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}"
        out["seconds"] = time.perf_counter() - t0
        del seg
        pool.free("w")

    th = threading.Thread(target=run)
    th.start()
    print("started", flush=True)
    th.join(60)
    print(json.dumps({**out, "free_before": free0, "free_after": pool.stats().free_pages, "nice": nice}), flush=True)
    return 0


def main() -> int:
    mode = sys.argv[1]
    if mode == "pull":
        return pull(int(sys.argv[2]), sys.argv[3], *(float(a) for a in sys.argv[4:5]), *(int(a) for a in sys.argv[5:6]))
    de, life, sent = engine()
    if mode == "source":
        de.load_model(MC, EngineConfig(), CACHE)
        pub = life.publish(wm.PublishWeights(1, "m", 8, 4096))
        print(json.dumps({"source": msgspec.to_builtins(pub.source), "sha": seg_sha(de), "greedy": greedy(de)}),
              flush=True)
        sys.stdin.read()
        return 0
    src = msgspec.convert(json.loads(sys.argv[2]), wm.ForkSource)
    carried = (wm.WorkerModel.of(MC), wm.WorkerEngine.of(EngineConfig()), str(CACHE))
    moves = wm.WorkerLifecycle.of(LifecycleConfig(copy_chunk_mib=1))
    msg = lambda seq, target, fork=None: wm.SetState(seq, *carried, target, moves, fork)  # noqa: E731
    r = run(life, msg(1, "active", src), sent)
    print(json.dumps({"path": r.path, "fallback": r.fallback, "sha": seg_sha(de), "greedy": greedy(de)}), flush=True)
    run(life, msg(2, "warm"), sent)
    sys.stdin.readline()  # the test kills the source now
    r = run(life, msg(3, "active", src), sent)  # a host copy: falls back to H2D
    print(json.dumps({"path": r.path, "fallback": r.fallback, "sha": seg_sha(de), "greedy": greedy(de)}), flush=True)
    run(life, msg(4, "cold"), sent)
    r = run(life, msg(5, "active", src), sent)  # no host copy: falls back to a cold start
    print(json.dumps({"path": r.path, "fallback": r.fallback, "sha": seg_sha(de), "greedy": greedy(de),
                      "weight_pages": de.pool.stats().weight_pages}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

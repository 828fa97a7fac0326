"""Requests wait for KV pages that other requests on the device hold (scheduler.py):
real ModelEngines on one real xTensor pool, plus a property test of the pure scheduler.

A request of model B that cannot get pages while model A's requests hold them waits
(no error) and completes once A's finish; it fails only after kv_wait_timeout_s, or at
once when it could never fit; no loop spins while it waits."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_fixtures import advance, write_hf_checkpoint
from engine_fixtures import weight_pages as engine_weight_pages
from janusd.config import EngineConfig, ModelConfig, Role
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.kv_cache import BlockAllocator
from janusd.engine.runner import ModelEngine, SamplingParams
from janusd.engine.scheduler import Scheduler
from janusd.engine.sequence import Sequence

PAGE = 4096  # 2 blocks of 4 tokens per page for the tiny model (block_bytes 2048)
A_PROMPTS = {f"a{i}": [(17 * i + 5 * j) % 470 + 25 for j in range(17)] for i in range(2)}
B_PROMPT = [(7 * j) % 450 + 40 for j in range(9)]
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    d, _ = write_hf_checkpoint(tmp_path_factory.mktemp("kvw") / "qwen2", "qwen2", seed=5)
    return str(d)


@pytest.fixture(scope="module")
def weight_pages(ckpt) -> int:
    return engine_weight_pages(ckpt, PAGE)


def _device(weight_pages: int, models: int, kv_pages: int) -> DeviceEngine:
    return DeviceEngine(kind="cpu", memory_bytes=(models * weight_pages + kv_pages) * PAGE, page_size=PAGE,
                        kv_cache_pages=(0, 0))


def _load(de: DeviceEngine, ckpt: str, name: str, role: Role = "mixed", **eng) -> ModelEngine:
    return de.load_model(ModelConfig(name=name, checkpoint=ckpt, kv_cache_mib=1, max_model_len=256, role=role),
                         EngineConfig(**{"block_size": 4, **eng}))


@pytest.fixture(scope="module")
def b_alone(ckpt, weight_pages) -> list[int]:
    de = _device(weight_pages, 1, 32)
    me = _load(de, ckpt, "b")
    return [t for o in me.generate({"b": B_PROMPT}, GREEDY)["b"] for t in o.token_ids]


def test_request_waits_for_pages_another_model_holds_then_completes(ckpt, weight_pages, b_alone) -> None:
    """Blocks of 16 tokens = 2 pages. A's two requests (KV of 17 + 31 tokens) hold 3
    blocks each from their 33rd token on: 12 of the 15 KV pages, for 15 more steps. B's
    needs 2 blocks (9 + 19 tokens), 1 more than is left. B arrives once A holds all it
    needs: it must wait while A runs, with no error, and finish after A with exactly
    its output alone; every page returns."""
    de = _device(weight_pages, 2, 15)
    a = _load(de, ckpt, "a", block_size=16)
    b = _load(de, ckpt, "b", block_size=16, kv_wait_timeout_s=30.0)
    for rid, p in A_PROMPTS.items():
        a.add_request(rid, p, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
    while a.kv.region.mapped_pages < 12:  # A holds all it will need before B arrives
        de.step()
    b.add_request("b", B_PROMPT, GREEDY)
    t_add = time.monotonic()
    got: list[int] = []
    errors: list[str] = []
    for _ in range(20):  # B alone against A's held pages: runs into them, then waits
        for o in b.step():
            got += o.token_ids
            errors += [o.error] if o.error else []
        if b.waiting_for_pages():
            break
    assert b.waiting_for_pages() and de.waiting_for_pages() is False  # A still has work
    seq = b.seqs["b"]
    wait_started = seq.kv_wait_since
    assert wait_started is not None and seq.blocks == [] and b.kv.region.mapped_pages == 0
    a_done: dict[str, float] = {}
    b_done_at, waited_steps, steps, b_resumed = None, 0, 0, None
    while de.has_work():
        outs = de.step()
        steps += 1
        if seq.kv_wait_since is not None:
            waited_steps += 1
        for o in outs:
            errors += [o.error] if o.error else []
            if o.model == "a" and o.finished:
                a_done[o.req_id] = time.monotonic()
            if o.model == "b":
                b_resumed = b_resumed or time.monotonic()
                got += o.token_ids
                if o.finished:
                    b_done_at = time.monotonic()
        if de.waiting_for_pages():
            time.sleep(0.005)
    assert errors == []
    assert waited_steps >= 10  # B kept waiting while A ran its last ~15 steps
    assert b_done_at is not None and len(a_done) == 2 and b_resumed is not None
    assert b_resumed >= min(a_done.values())  # B's next token only once A gave pages back
    assert got == b_alone
    stats = de.pool.stats()
    assert stats.kv_pages == 0 and a.kv.alloc.num_used == b.kv.alloc.num_used == 0
    de.pool.check_integrity()
    print(f"\nB waited for pages {min(a_done.values()) - t_add:.3f}s ({waited_steps} device steps) until A's first "
          f"finish, done {b_done_at - t_add:.3f}s after arrival; {steps} device steps")


def test_request_fails_after_the_timeout_when_pages_stay_held(ckpt, weight_pages, b_alone) -> None:
    """A prefill-role A holds its requests' KV (KV_READY) and never releases it; B waits
    kv_wait_timeout_s = 0.2 s, then fails with the KV-exhausted error, not much later,
    without spinning, with all its blocks and pages back; once A lets go, B runs."""
    de = _device(weight_pages, 2, 12)
    a = _load(de, ckpt, "a", role="prefill")
    b = _load(de, ckpt, "b", kv_wait_timeout_s=0.2)
    prompts = {f"h{i}": [(11 * i + 3 * j) % 470 + 30 for j in range(38)] for i in range(2)}  # 10 blocks each
    for rid, p in prompts.items():
        a.add_request(rid, p, GREEDY)
    while a.has_work():
        assert all(o.kv_ready for o in a.step())
    assert a.kv.region.mapped_pages == 10 and not de.has_work()
    t0 = time.monotonic()
    outs = b.generate({"b": B_PROMPT}, GREEDY)["b"]
    elapsed = time.monotonic() - t0
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    err = outs[-1].error or ""
    assert err.startswith("KV cache exhausted: waited") and "kv_wait_timeout_s = 0.2" in err
    assert 0.2 <= elapsed < 1.5, elapsed
    assert 5 <= b.stats.stalled_steps <= 80  # each stalled step slept STALL_WAIT_S instead of spinning
    assert b.seqs == {} and b.kv.alloc.num_used == 0 and b.kv.region.mapped_pages == 0 and not b.has_work()
    de.pool.check_integrity()
    assert de.pool.stats().pages_by_owner.get("a", 0) - weight_pages == 10  # A's held KV untouched
    for rid in prompts:
        assert a.release_kv(rid)
    assert [t for o in b.generate({"b2": B_PROMPT}, GREEDY)["b2"] for t in o.token_ids] == b_alone
    print(f"\nB failed {elapsed:.3f}s after arrival (timeout 0.2s) after {b.stats.stalled_steps} stalled steps: {err}")


def test_request_that_can_never_fit_fails_at_once(ckpt, weight_pages) -> None:
    """8 KV pages = 16 blocks on the whole device; 30 + 40 tokens need 18. The region
    (1 MiB) would take it, the pool never can: fail at once, not after 30 s."""
    de = _device(weight_pages, 1, 8)
    me = _load(de, ckpt, "m")  # kv_wait_timeout_s default: 30 s
    assert me.scheduler.kv_wait_timeout_s == 30.0 and me.scheduler.max_blocks == 16
    t0 = time.monotonic()
    outs = me.generate({"big": [50 + j for j in range(30)]},
                       SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))["big"]
    elapsed = time.monotonic() - t0
    assert len(outs) == 1 and outs[0].finished and outs[0].token_ids == [] and elapsed < 1.0
    assert "needs 18 KV blocks" in (outs[0].error or "") and "never" in (outs[0].error or "")
    assert me.kv.region.mapped_pages == 0 and me.stats.steps == 0
    de.pool.check_integrity()


def test_zero_timeout_fails_at_once_while_pages_are_held(ckpt, weight_pages) -> None:
    de = _device(weight_pages, 1, 8)
    me = _load(de, ckpt, "m", kv_wait_timeout_s=0.0)
    de.pool.alloc_weights("other", 7 * PAGE)  # 1 page = 2 blocks left; B needs 8
    t0 = time.monotonic()
    outs = me.generate({"b": B_PROMPT}, GREEDY)["b"]
    assert time.monotonic() - t0 < 1.0 and "KV cache exhausted: waited 0.00 s" in (outs[-1].error or "")
    assert me.stats.preemptions == 0 and me.kv.region.mapped_pages == 0


# ---- the pure scheduler under random interleavings ------------------------------------


def _seq(i: int, prompt_len: int, max_tokens: int) -> Sequence:
    return Sequence(f"r{i}", list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens, temperature=0),
                    i, None, [], 10_000, None)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(reqs=st.lists(st.tuples(st.integers(1, 24), st.integers(1, 10)), min_size=1, max_size=6),
       capacity=st.integers(4, 12), held=st.integers(0, 12), release_at=st.integers(0, 40),
       dt=st.sampled_from([0.01, 0.05, 0.3]), timeout=st.sampled_from([0.0, 0.5, 1e9]),
       budget=st.integers(1, 32), max_seqs=st.integers(1, 4), arrive=st.lists(st.integers(0, 10), min_size=6,
                                                                              max_size=6))
def test_waits_end_in_completion_or_a_timed_out_failure(reqs, capacity, held, release_at, dt, timeout, budget,
                                                        max_seqs, arrive) -> None:
    """Another owner holds `held` blocks until step `release_at`; requests arrive at
    random steps. Every request finishes, or fails because it can never fit (at once) or
    because it waited >= the timeout; blocks are never shared or lost; with an endless
    timeout nothing that fits ever fails; nothing is scheduled while all wait."""
    alloc = BlockAllocator(capacity)
    holder = alloc.allocate(min(held, capacity)) or []
    sched = Scheduler(4, max_seqs, budget, alloc, kv_wait_timeout_s=timeout)
    seqs = [_seq(i, p, m) for i, (p, m) in enumerate(reqs)]
    pending = sorted(zip(arrive, range(len(seqs))))
    done: set[str] = set()
    failed: dict[str, str] = {}
    freed = False  # blocks came back since the last schedule()
    for k in range(4000):
        now = k * dt
        if k == release_at and holder:
            alloc.free(holder)
            holder = []
            freed = True
        while pending and pending[0][0] <= k:
            sched.add(seqs[pending.pop(0)[1]])
        if not sched.has_work() and not pending:
            break
        stalled = sched.waiting_for_pages()
        out = sched.schedule(now)
        assert out.num_tokens <= budget and len(sched.running) <= max_seqs
        if stalled and not freed and not out.failed:  # no block came back, no wait ran out:
            assert not out.items and not out.preempted  # nothing to do, so nothing was done
        freed = False
        for f in out.failed:
            assert f.blocks == [] and f not in sched.running and f not in sched.waiting
            need = -(-(f.prompt_len + f.params.max_tokens) // 4)
            if need > capacity:
                assert "can never run here" in f.fail_reason
            else:
                assert f.fail_reason.startswith("KV cache exhausted: waited") and timeout < 1e9
                assert f.kv_wait_since is not None and now - f.kv_wait_since >= timeout
            failed[f.req_id] = f.fail_reason
        owned = [b for s in sched.running for b in s.blocks] + holder
        assert len(owned) == len(set(owned)) == alloc.num_used
        finished = advance(sched, out)
        done |= {s.req_id for s in finished}
        freed = bool(finished)
    assert done | set(failed) == {s.req_id for s in seqs} and not done & set(failed)
    assert alloc.num_used == len(holder)
    if timeout >= 1e9:
        assert all("never" in r for r in failed.values())


# ---- the worker loop: waits on its inbox while stalled, wakes to pages freed elsewhere ----


class _Daemon:
    """The daemon's end of a worker socketpair (a real WorkerProc serves the other end)."""

    def __init__(self, de: DeviceEngine) -> None:
        import socket
        import threading

        from janusd.engine.worker_proc import WorkerProc
        from janusd.wire import worker_msgs as wm
        from janusd.wire.framing import BlockingFramedSocket

        a, b = socket.socketpair()
        self.conn = BlockingFramedSocket(a)
        self.dec = wm.from_worker_decoder()
        self.wm = wm
        self.proc = WorkerProc(BlockingFramedSocket(b), de, 0, "cpu")
        self.thread = threading.Thread(target=self.proc.serve, daemon=True)
        self.thread.start()
        assert isinstance(self.recv(), wm.Ready)

    def recv(self):
        body = self.conn.recv()
        assert body is not None
        return self.dec.decode(body)

    def generate(self, rid: int, model: str, prompt: list[int], max_tokens: int) -> None:
        spec = self.wm.SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.conn.send(self.wm.Generate(rid, model, prompt, spec))

    def close(self) -> None:
        self.conn.send(self.wm.Shutdown())
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_worker_waits_on_its_inbox_while_stalled_and_resumes_when_pages_free(ckpt, weight_pages, b_alone) -> None:
    """Another owner holds all but 1 KV page (2 blocks; B needs 7). The worker must not
    spin while B waits (few stalled steps, ~1 per STALL_WAIT_S), must notice on its own
    when the pages are freed (no message arrives), and B's output is its output alone.
    A second request with the pages held again fails after the 0.3 s timeout."""
    de = _device(weight_pages, 1, 12)
    b = _load(de, ckpt, "b", kv_wait_timeout_s=5.0)
    d = _Daemon(de)
    try:
        de.pool.alloc_weights("other", 11 * PAGE)
        d.generate(1, "b", B_PROMPT, 20)
        time.sleep(0.6)
        stalled = b.stats.stalled_steps
        assert 20 <= stalled <= 200, stalled  # waits ~5 ms per stalled step; a spin would be thousands
        assert b.has_work() and b.seqs["1"].kv_wait_since is not None
        de.pool.free("other")
        got: list[int] = []
        t0 = time.monotonic()
        while True:
            m = d.recv()
            assert isinstance(m, d.wm.StepBatch), m
            got += [t for o in m.outputs for t in o.token_ids]
            if m.outputs[-1].finished:
                break
        assert got == b_alone and time.monotonic() - t0 < 5.0
        b.scheduler.kv_wait_timeout_s = 0.3
        de.pool.alloc_weights("other", 11 * PAGE)
        t0 = time.monotonic()
        d.generate(2, "b", B_PROMPT, 20)
        while not isinstance(m := d.recv(), d.wm.RequestFailed):
            pass
        elapsed = time.monotonic() - t0
        assert m.req_id == 2 and m.kind == "unavailable" and m.message.startswith("KV cache exhausted: waited")
        assert 0.3 <= elapsed < 2.0, elapsed
        assert not b.has_work() and b.kv.alloc.num_used == 0
        print(f"\nworker: {stalled} stalled steps in 0.6 s of waiting; timed-out request failed after {elapsed:.3f}s")
    finally:
        d.close()
    de.pool.free("other")
    de.pool.check_integrity()

"""Edges of waiting for KV pages (scheduler.py, device_engine.py) that the main tests in
test_engine_kv_wait.py do not reach: each test here failed against a deliberately broken
scheduler (or against the code before its fix), see the docstrings.

The pure-scheduler tests drive `Scheduler.schedule(now)` with an injected clock; another
owner's pages are blocks taken from the same BlockAllocator."""

from __future__ import annotations

import pytest

from engine_fixtures import advance, write_hf_checkpoint
from engine_fixtures import weight_pages as engine_weight_pages
from janusd.config import EngineConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.kv_cache import BlockAllocator
from janusd.engine.runner import SamplingParams
from janusd.engine.scheduler import Scheduler
from janusd.engine.sequence import Sequence, Status


def _seq(i: int, prompt_len: int, max_tokens: int) -> Sequence:
    return Sequence(f"r{i}", list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens, temperature=0),
                    i, None, [], 10_000, None)


def test_a_wait_with_one_free_block_still_times_out_without_recomputing() -> None:
    """1 block is free, the sequence needs 3 (6 + 4 tokens of 4). It may try the smallest
    chunk once, then must wait (no step schedules anything, waiting_for_pages() says so)
    and fail once kv_wait_timeout_s has passed. A waiter that lost its wait start when
    it was preempted would instead take the free block again, recompute a chunk, hit the
    wall, restart its clock, and never time out (an endless recompute loop)."""
    alloc = BlockAllocator(4)
    holder = alloc.allocate(3)
    sched = Scheduler(4, 4, 64, alloc, kv_wait_timeout_s=1.0)
    seq = _seq(0, 6, 4)
    sched.add(seq)
    scheduled = 0
    failed_at = None
    for k in range(200):
        now = k * 0.125
        out = sched.schedule(now)
        scheduled += out.num_tokens
        if k >= 3 and not out.failed:  # past the first chunk and its preemption: a pure wait
            assert not out.items and not out.preempted and sched.waiting_for_pages()
        if out.failed:
            assert out.failed == [seq] and seq.fail_reason.startswith("KV cache exhausted: waited")
            failed_at = now
            break
        advance(sched, out)
    assert failed_at is not None, "the wait never ended"
    assert scheduled <= 4  # one block-sized chunk at most, never recomputed
    assert 1.0 <= failed_at - seq.kv_wait_since and failed_at <= 1.0 + 0.5  # the wait began at the preemption
    assert not sched.has_work() and alloc.num_used == len(holder)


def test_each_wait_gets_the_whole_timeout_after_progress() -> None:
    """The sequence waits 0.75 s (timeout 1.0 s), gets pages, produces tokens until it needs
    a block nobody frees, and waits again: that second wait must last the whole timeout
    from when IT began, not end at once because the first wait's start was kept."""
    alloc = BlockAllocator(6)
    holder = alloc.allocate(6)
    sched = Scheduler(4, 4, 64, alloc, kv_wait_timeout_s=1.0)
    seq = _seq(0, 4, 12)
    sched.add(seq)
    second_wait, failed_at = None, None
    for k in range(200):
        now = k * 0.125
        if k == 6:
            alloc.free(holder[:2])  # 2 blocks come back: prompt + 4 outputs fit, the 9th token does not
        out = sched.schedule(now)
        if out.preempted:
            assert out.preempted == [seq] and seq.num_output == 5 and second_wait is None
            second_wait = now
        if out.failed:
            failed_at = now
            break
        advance(sched, out)
    assert second_wait is not None and failed_at is not None
    assert failed_at - second_wait == 1.0, (second_wait, failed_at)
    assert "waited 1.00 s" in seq.fail_reason
    assert alloc.num_used == 4


@pytest.mark.parametrize("max_seqs", [1, 2])
def test_queueing_behind_its_own_running_model_does_not_count_as_waiting(max_seqs) -> None:
    """W waits for pages (clock starts at 0). An imported sequence I of the same model
    then gets blocks and decodes for 1.4 s (> the 1 s timeout) while W queues behind it:
    ordinary queueing, so W's wait restarts. When I finishes, another owner takes its
    blocks back for 0.6 s; W must wait for them (fresh timeout) and complete, not fail
    at once with "waited 1.6 s". With max_num_seqs = 1 the admission loop never reached
    W while I ran, so its stale start was kept (fixed in Scheduler.schedule)."""
    alloc = BlockAllocator(8)
    holder = alloc.allocate(8)
    sched = Scheduler(4, max_seqs, 64, alloc, kv_wait_timeout_s=1.0)
    w = _seq(0, 4, 4)
    sched.add(w)
    imp = _seq(1, 4, 8)
    done: list[Sequence] = []
    failed: list[Sequence] = []
    i_done_at, t = None, 0.0
    for k in range(200):
        t = round(k * 0.2, 6)
        if k == 1:  # the import reserves blocks directly (begin_import), then decodes
            alloc.free(holder[:3])
            holder = holder[3:]
            imp.blocks = alloc.allocate(3)
            imp.num_computed = 4
            imp.tokens.append(9)
            sched.add_running(imp)
        if i_done_at is not None and t >= i_done_at + 0.6 and holder:
            alloc.free(holder)
            holder = []
        out = sched.schedule(t)
        failed += out.failed
        finished = advance(sched, out)
        done += finished
        if imp in finished:
            i_done_at = t
            holder += alloc.allocate(alloc.num_free) or []  # another owner grabs the freed blocks
        if not sched.has_work():
            break
    assert i_done_at is not None and i_done_at >= 1.4
    assert failed == [], [f.fail_reason for f in failed]
    assert done == [imp, w] and alloc.num_used == len(holder)


def test_an_import_that_reaches_the_ceiling_fails_at_once_not_after_the_timeout() -> None:
    """An imported sequence bypasses add()'s never-fits check: 8 prompt + 8 outputs need 4
    blocks, the model can ever hold 3. When it outgrows them it must fail as "can never
    run here" at once, not wait the (here endless) kv_wait_timeout_s."""
    alloc = BlockAllocator(3)
    sched = Scheduler(4, 4, 64, alloc, kv_wait_timeout_s=1e9)
    imp = _seq(0, 8, 8)
    imp.blocks = alloc.allocate(2)
    imp.num_computed = 8
    imp.tokens.append(9)
    sched.add_running(imp)
    for k in range(50):
        out = sched.schedule(k * 0.1)
        if out.failed:
            assert out.failed == [imp] and "can never run here" in imp.fail_reason and imp.num_output == 5
            break
        advance(sched, out)
    else:
        pytest.fail("the sequence waited instead of failing")
    assert alloc.num_used == 0 and not sched.has_work()


# ---- the device: pages freed by one model's step are seen by the next step at once ----

PAGE = 4096  # the tiny model's blocks of 4 tokens are 2048 bytes: 2 per page


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    d, _ = write_hf_checkpoint(tmp_path_factory.mktemp("kvwe") / "qwen2", "qwen2", seed=5)
    return str(d)


def test_device_does_not_wait_after_a_step_that_freed_pages(ckpt) -> None:
    """B (stepped first) waits for pages A holds. In the device step where A finishes,
    B's step already ran (stalled); A's pages are free now, so the device must NOT report
    waiting_for_pages() (the worker would sleep STALL_WAIT_S for nothing): the next step
    admits B."""
    weight_pages = engine_weight_pages(ckpt, PAGE)
    de = DeviceEngine(kind="cpu", memory_bytes=(2 * weight_pages + 8) * PAGE, page_size=PAGE, kv_cache_pages=(0, 0))
    cfg = EngineConfig(block_size=4, kv_wait_timeout_s=30.0)
    b = de.load_model(ModelConfig(name="b", checkpoint=ckpt, kv_cache_mib=1, max_model_len=256), cfg)
    a = de.load_model(ModelConfig(name="a", checkpoint=ckpt, kv_cache_mib=1, max_model_len=256), cfg)
    assert list(de.models) == ["b", "a"]
    # A: 52 + 4 tokens = 14 blocks = 7 of the 8 KV pages, all mapped by its prefill
    a.add_request("a", [(5 * j) % 470 + 25 for j in range(52)], SamplingParams(max_tokens=4, temperature=0.0,
                                                                                ignore_eos=True))
    de.step()
    assert a.kv.region.mapped_pages == 7
    b.add_request("b", [(7 * j) % 450 + 40 for j in range(9)], SamplingParams(max_tokens=8, temperature=0.0,
                                                                               ignore_eos=True))
    a_finished = False
    for _ in range(20):
        outs = de.step()
        a_finished = any(o.model == "a" and o.finished for o in outs)
        if a_finished:
            break
        assert not any(o.error for o in outs)
    assert a_finished and b.seqs["b"].kv_wait_since is not None  # B waited through A's last step
    assert not de.waiting_for_pages()  # A's 7 pages just came back
    outs = de.step()
    assert b.seqs["b"].kv_wait_since is None and b.seqs["b"].num_computed > 0 and not b.waiting_for_pages()
    while de.has_work():
        outs += de.step()
    assert [o.finish_reason for o in outs if o.finished] == ["length"] and not any(o.error for o in outs)
    de.pool.check_integrity()


def test_device_does_not_wait_after_a_model_preempted_its_runner_to_wait(ckpt) -> None:
    """B (stepped first) waits for 3 pages; A's sole runner then cannot grow (another
    owner holds the rest) and is preempted to wait, giving its 4 pages back in that same
    device step. Both models scheduled nothing, but B's need now fits: the device must
    not report waiting_for_pages(), and the next step admits B."""
    weight_pages = engine_weight_pages(ckpt, PAGE)
    de = DeviceEngine(kind="cpu", memory_bytes=(2 * weight_pages + 8) * PAGE, page_size=PAGE, kv_cache_pages=(0, 0))
    cfg = EngineConfig(block_size=4, kv_wait_timeout_s=30.0)
    b = de.load_model(ModelConfig(name="b", checkpoint=ckpt, kv_cache_mib=1, max_model_len=256), cfg)
    a = de.load_model(ModelConfig(name="a", checkpoint=ckpt, kv_cache_mib=1, max_model_len=256), cfg)
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    a.add_request("a", [(5 * j) % 470 + 25 for j in range(30)], greedy)  # 8 blocks = 4 pages after its prefill
    de.step()
    assert a.kv.region.mapped_pages == 4
    de.pool.alloc_weights("other", 4 * PAGE)  # every other KV page
    b.add_request("b", [(7 * j) % 450 + 40 for j in range(20)], greedy)  # needs 5 blocks = 3 pages at once
    for _ in range(5):
        outs = de.step()
        assert not any(o.error for o in outs)
        if a.stats.preemptions:
            break
    assert a.stats.preemptions == 1 and a.seqs["a"].kv_wait_since is not None and a.kv.region.mapped_pages == 0
    assert b.seqs["b"].kv_wait_since is not None  # B's step in that device step ran before A gave pages back
    assert not de.waiting_for_pages()
    de.step()
    assert b.seqs["b"].num_computed > 0 and b.seqs["b"].kv_wait_since is None
    de.pool.free("other")
    outs = []
    while de.has_work():
        outs += de.step()
    assert sorted(o.req_id for o in outs if o.finished and o.finish_reason == "length") == ["a", "b"]
    de.pool.check_integrity()

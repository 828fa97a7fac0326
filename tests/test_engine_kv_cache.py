"""Block allocator and scheduler invariants (pure, hypothesis), and the paged KV cache on
a real xTensor pool: pages are mapped as blocks are needed and go back when released."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_fixtures import advance
from janusd.engine.kv_cache import BlockAllocator, PagedKVCache
from janusd.engine.scheduler import Scheduler
from janusd.engine.sequence import Sequence
from janusd.engine.types import SamplingParams
from janusd.memory import DevicePool


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 6)), max_size=60), st.integers(0, 20))
def test_allocator_lowest_first_and_compact(ops, capacity) -> None:
    alloc = BlockAllocator(capacity)
    held: list[list[int]] = []
    for is_alloc, n in ops:
        if is_alloc:
            free_before = sorted(set(range(alloc.capacity)) - {b for h in held for b in h})
            got = alloc.allocate(n)
            if n > len(free_before):
                assert got is None and alloc.num_free == len(free_before)
            else:
                assert got == free_before[:n]  # the n lowest free ids
                held.append(got)
        elif held:
            alloc.free(held.pop(n % len(held)))
        used = {b for h in held for b in h}
        assert alloc.num_used == len(used) and alloc.num_free == alloc.capacity - len(used)
        assert alloc.high_water() == (max(used) + 1 if used else 0)
    hw = alloc.high_water()
    alloc.shrink(hw)
    assert alloc.capacity == hw and alloc.num_free == hw - alloc.num_used


def test_allocator_errors() -> None:
    alloc = BlockAllocator(4)
    ids = alloc.allocate(3)
    assert ids == [0, 1, 2]
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free([3])
    with pytest.raises(ValueError, match="in use"):
        alloc.shrink(2)
    alloc.free([1])
    assert alloc.allocate(1) == [1]


def _seq(i: int, prompt_len: int, max_tokens: int) -> Sequence:
    return Sequence(f"r{i}", list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens, temperature=0),
                    i, None, [], 10_000, None)


@settings(max_examples=60)
@given(
    reqs=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=10),
    capacity=st.integers(13, 30), budget=st.integers(1, 64), max_seqs=st.integers(1, 6),
)
def test_scheduler_invariants_and_progress(reqs, capacity, budget, max_seqs) -> None:
    """Budget and seq limits hold, blocks cover every scheduled token and are never shared,
    preemption frees everything, and every request finishes (capacity fits the largest)."""
    bs = 4
    alloc = BlockAllocator(capacity)  # >= 13 blocks = 52 tokens >= the largest request
    sched = Scheduler(bs, max_seqs, budget, alloc)
    seqs = [_seq(i, p, m) for i, (p, m) in enumerate(reqs)]
    for s in seqs:
        sched.add(s)
    done: set[str] = set()
    for _ in range(2000):
        if not sched.has_work():
            break
        out = sched.schedule(0.0)
        assert out.num_tokens <= budget and len(sched.running) <= max_seqs and not out.failed
        for it in out.items:
            assert it.start == it.seq.num_computed and it.n >= 1
            assert len(it.seq.blocks) >= math.ceil((it.start + it.n) / bs)
        for p in out.preempted:
            assert p.blocks == [] and p.num_computed == 0 and p not in sched.running
        owned = [b for s in sched.running for b in s.blocks]
        assert len(owned) == len(set(owned)) == alloc.num_used
        done |= {s.req_id for s in advance(sched, out)}
    assert done == {s.req_id for s in seqs}
    assert alloc.num_used == 0


def test_preemption_picks_youngest() -> None:
    alloc = BlockAllocator(3)
    sched = Scheduler(4, 8, 100, alloc)
    old, mid, young = _seq(0, 4, 8), _seq(1, 4, 8), _seq(2, 4, 8)
    for s in (old, mid, young):
        sched.add(s)
    out = sched.schedule(0.0)
    assert [it.seq for it in out.items] == [old, mid, young] and alloc.num_free == 0
    sched.complete(out)
    for s in (old, mid, young):
        s.tokens.append(9)  # each now needs a second block
    out = sched.schedule(0.0)
    # old needs a block: the youngest (young) is preempted; mid then needs one: young's
    # freed block went to old, so mid preempts... itself, being the youngest left
    assert [it.seq for it in out.items] == [old]
    assert out.preempted == [young, mid]
    assert [s.req_id for s in sched.waiting] == ["r1", "r2"]  # arrival order kept
    assert mid.num_computed == young.num_computed == 0 and old.blocks == [0, 2]
    assert alloc.num_used == 2


def _arch(layers=2, kv_heads=2, head_dim=16):
    from janusd.engine.checkpoint.base import ModelArch

    return ModelArch(architecture="llama", vocab_size=64, hidden_size=32, intermediate_size=64,
                     num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=kv_heads,
                     head_dim=head_dim, rms_norm_eps=1e-5, rope_theta=10000.0)


def test_paged_cache_maps_pages_on_demand_and_returns_them() -> None:
    page = 64 << 10
    pool = DevicePool(kind="cpu", num_pages=16, page_size=page, background=False)
    region = pool.kv_region("m", 8 * page, cache_low=0, cache_high=0)
    kv = PagedKVCache(region, _arch(), torch.float32, block_size=16)
    assert kv.block_bytes == 2 * 2 * 16 * 2 * 16 * 4 == 8192 and kv.max_blocks == 8 * page // 8192
    assert region.mapped_pages == 0 and kv.alloc.capacity == 0
    a = kv.allocate(3)
    assert a == [0, 1, 2] and region.mapped_pages == 1  # 8 blocks per 64 KiB page
    b = kv.allocate(10)
    assert b == list(range(3, 13)) and region.mapped_pages == 2
    # the bytes of each block are where the layout says: block-major, layer, k/v
    k0, v0 = kv.layers[0]
    k1, _ = kv.layers[1]
    k0[5].fill_(1.0)
    v0[5].fill_(2.0)
    k1[5].fill_(3.0)
    raw = kv.block_view(5).view(torch.float32).view(2, 2, 16, 2, 16)
    assert raw[0, 0].eq(1).all() and raw[0, 1].eq(2).all() and raw[1, 0].eq(3).all()
    offs = kv.global_offsets(5)
    assert sum(n for _, n in offs) == kv.block_bytes
    g = pool.global_tensor()
    pieces = torch.cat([g[o : o + n] for o, n in offs])
    assert torch.equal(pieces, kv.block_view(5))
    kv.free(b)
    assert kv.shrink() == 1 and region.mapped_pages == 1
    assert kv.allocate(200) is None  # more than the region's maximum: nothing taken
    assert kv.alloc.num_used == 3
    kv.free(a)
    kv.shrink()
    assert region.mapped_pages == 0
    assert pool.stats().free_pages == 16
    pool.check_integrity()


def test_paged_cache_stops_at_pool_exhaustion() -> None:
    page = 64 << 10
    pool = DevicePool(kind="cpu", num_pages=4, page_size=page, background=False)
    pool.alloc_weights("w", 3 * page)
    region = pool.kv_region("m", 8 * page, cache_low=0, cache_high=0)
    kv = PagedKVCache(region, _arch(), torch.float32, block_size=16)
    assert kv.allocate(8) == list(range(8))
    assert kv.allocate(1) is None and region.mapped_pages == 1  # pool has no 5th page
    pool.free("w")
    assert kv.allocate(1) == [8]


def test_a_sequence_that_alone_outgrows_the_blocks_fails_instead_of_looping() -> None:
    """2 blocks of 4 tokens; `big` needs 3 (4 prompt + 8 outputs), more than the allocator
    can ever hold: waiting could never help, so it fails at once (not after a wait, not
    after computing tokens it can never finish) and the request behind it runs."""
    alloc = BlockAllocator(2)
    sched = Scheduler(4, 8, 100, alloc)
    big, small = _seq(0, 4, 8), _seq(1, 2, 2)
    sched.add(big)
    sched.add(small)
    failed, finished = [], []
    for _ in range(50):
        if not sched.has_work():
            break
        out = sched.schedule(0.0)
        failed += out.failed
        assert all(s.blocks == [] and s not in sched.running for s in out.failed)
        finished += advance(sched, out)
    assert failed == [big] and finished == [small]
    assert big.num_output == 0 and "can never run here" in big.fail_reason  # failed at once, no wasted work
    assert not sched.has_work() and alloc.num_used == 0


def test_preemption_picks_youngest_even_after_an_import_ran_ahead() -> None:
    """An imported (decode-role) sequence can be younger than one waiting: once both run,
    the imported one is the youngest and is the one preempted."""
    alloc = BlockAllocator(3)
    sched = Scheduler(4, 8, 100, alloc)
    older, imported = _seq(1, 4, 8), _seq(2, 4, 8)
    imported.blocks = alloc.allocate(1) or []
    imported.num_computed = 4
    imported.tokens.append(9)
    sched.add_running(imported)
    sched.add(older)
    out = sched.schedule(0.0)
    assert {it.seq.req_id for it in out.items} == {"r1", "r2"} and alloc.num_free == 0
    sched.complete(out)
    for s in (older, imported):
        s.tokens.append(9)  # older now needs a second block
    out = sched.schedule(0.0)
    assert out.preempted == [imported] and [it.seq for it in out.items] == [older]

"""ModelEngine behaviour on a real xTensor pool with a tiny transformers-written model:
continuous batching, chunked prefill, preemption, seeds, stop strings, errors, abort."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_fixtures import weight_pages as engine_weight_pages
from engine_fixtures import write_hf_checkpoint
from janusd.config import EngineConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.runner import ModelEngine, RequestError, SamplingParams

PROMPTS = {f"p{i}": [(13 * i + 7 * j) % 480 + 20 for j in range(n)] for i, n in enumerate([3, 9, 17, 30, 5, 12])}
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    d, _ = write_hf_checkpoint(tmp_path_factory.mktemp("ck") / "qwen2", "qwen2", seed=11)
    return str(d)


@pytest.fixture(scope="module")
def device() -> DeviceEngine:
    return DeviceEngine(kind="cpu", memory_bytes=32 << 20, page_size=64 << 10, kv_cache_pages=(0, 0))


def _load(device: DeviceEngine, ckpt: str, name: str, **eng) -> ModelEngine:
    e = dict(block_size=4, max_num_batched_tokens=512, max_num_seqs=32)
    e.update(eng)
    return device.load_model(ModelConfig(name=name, checkpoint=ckpt, kv_cache_mib=1, max_model_len=256), EngineConfig(**e))


def _tokens(outs) -> dict[str, list[int]]:
    return {rid: [t for o in os for t in o.token_ids] for rid, os in outs.items()}


@pytest.fixture(scope="module")
def alone(device, ckpt) -> dict[str, list[int]]:
    """Reference: every prompt alone, whole prefill."""
    me = _load(device, ckpt, "alone")
    try:
        return {rid: _tokens(me.generate({rid: p}, GREEDY))[rid] for rid, p in PROMPTS.items()}
    finally:
        device.unload_model("alone")


def test_batched_equals_one_at_a_time(device, ckpt, alone) -> None:
    me = _load(device, ckpt, "batched", max_num_batched_tokens=16, max_num_seqs=4)
    try:
        outs = me.generate(PROMPTS, GREEDY)
        assert _tokens(outs) == alone
        assert all(os[-1].finished and os[-1].finish_reason == "length" for os in outs.values())
        assert me.stats.decode_tokens > 0 and me.stats.prefill_tokens == sum(map(len, PROMPTS.values()))
    finally:
        device.unload_model("batched")


def test_chunked_prefill_equals_whole_prefill(device, ckpt) -> None:
    rows: dict[int, list[torch.Tensor]] = {3: [], 512: []}
    for budget in rows:
        me = _load(device, ckpt, f"chunk{budget}", max_num_batched_tokens=budget)
        me.logit_sink = lambda rid, row, b=budget: rows[b].append(row.clone())
        try:
            me.generate({"r": PROMPTS["p3"]}, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
            assert me.stats.steps == (8 if budget == 512 else 10 + 7)  # 30 tokens in chunks of 3
        finally:
            device.unload_model(f"chunk{budget}")
    assert (torch.stack(rows[3]) - torch.stack(rows[512])).abs().max().item() < 1e-5


@pytest.fixture(scope="module")
def weight_pages(ckpt) -> int:
    """4 KiB pages the tiny model's weights take (to size pools with a few KV pages)."""
    n = engine_weight_pages(ckpt, 4096)
    return n


def test_preemption_and_recompute_give_identical_greedy_output(ckpt, alone, weight_pages) -> None:
    # a pool with 8 spare 4 KiB pages for KV, far fewer than the 6 requests need together
    de = DeviceEngine(kind="cpu", memory_bytes=(weight_pages + 8) * 4096, page_size=4096, kv_cache_pages=(0, 0))
    me = de.load_model(ModelConfig(name="tight", checkpoint=ckpt, kv_cache_mib=1),
                       EngineConfig(block_size=4, max_num_batched_tokens=64))
    assert me.kv.block_bytes == 2048  # 2 per page: 16 blocks, the largest request needs 13
    outs = me.generate(PROMPTS, GREEDY)
    assert me.stats.preemptions > 0
    assert _tokens(outs) == alone
    assert de.pool.wait_maintenance(5.0)  # freed pages reach the pool on the refill thread
    assert de.pool.stats().free_pages == 8  # every KV page went back
    de.unload_model("tight")


def test_seeded_sampling_reproducible_regardless_of_batch(device, ckpt) -> None:
    me = _load(device, ckpt, "seeded", max_num_batched_tokens=8)
    try:
        p = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
        a = _tokens(me.generate({"a": PROMPTS["p1"]}, p))["a"]
        b = _tokens(me.generate({"b": PROMPTS["p1"], "x": PROMPTS["p3"], "y": PROMPTS["p2"]},
                                {"b": p, "x": SamplingParams(max_tokens=5, temperature=0.8), "y": GREEDY}))["b"]
        c = _tokens(me.generate({"c": PROMPTS["p1"]}, SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9,
                                                                      seed=99, ignore_eos=True)))["c"]
        assert a == b and a != c
    finally:
        device.unload_model("seeded")


def test_stop_strings_cut_exactly_with_real_tokenizer(device, ckpt) -> None:
    me = _load(device, ckpt, "stops", max_num_batched_tokens=8)
    try:
        full = me.generate({"f": PROMPTS["p2"]}, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))["f"]
        text = "".join(o.text for o in full)
        # a random model emits stray bytes; an incomplete character is only ever released at the end
        assert all("\ufffd" not in o.text for o in full[:-1])
        # choose a stop string that first occurs somewhere after the start and spans tokens
        at = next(i for i in range(3, len(text) - 3) if text.find(text[i : i + 3]) == i)
        stop = text[at : at + 3]
        cut = me.generate({"s": PROMPTS["p2"]}, SamplingParams(max_tokens=30, temperature=0.0, stop=[stop],
                                                               ignore_eos=True))["s"]
        assert "".join(o.text for o in cut) == text[:at]
        assert cut[-1].finish_reason == "stop" and cut[-1].finished
        assert me.kv.alloc.num_used == 0
    finally:
        device.unload_model("stops")


def test_outputs_carry_counts_prefill_time_and_logprobs(device, ckpt) -> None:
    me = _load(device, ckpt, "meta")
    try:
        outs = me.generate({"r": PROMPTS["p3"]}, SamplingParams(max_tokens=4, temperature=0.0, logprobs=2))["r"]
        assert [o.num_output_tokens for o in outs] == [1, 2, 3, 4][: len(outs)]
        assert all(o.num_prompt_tokens == 30 and o.model == "meta" for o in outs)
        assert outs[0].prefill_s is not None and outs[0].prefill_s > 0
        assert all(o.prefill_s is None for o in outs[1:])
        for o in outs:
            assert o.logprobs is not None and o.logprobs[0].token_id == o.token_ids[0]
            assert o.logprobs[0].top[0][0] == o.token_ids[0]  # greedy: the sampled token is the top one
    finally:
        device.unload_model("meta")


def test_request_errors(device, ckpt) -> None:
    me = _load(device, ckpt, "errs")
    try:
        with pytest.raises(RequestError, match="max_model_len"):
            me.add_request("long", [5] * 250, SamplingParams(max_tokens=7))
        with pytest.raises(RequestError, match="at least one token"):
            me.add_request("empty", [], SamplingParams())
        with pytest.raises(RequestError, match=r"\[0, 512\)"):
            me.add_request("oov", [1, 512], SamplingParams())
        with pytest.raises(RequestError, match="top_p"):
            me.add_request("bad", [1, 2], SamplingParams(top_p=1.5))
        me.add_request("dup", [1, 2], SamplingParams())
        with pytest.raises(RequestError, match="already in use"):
            me.add_request("dup", [3], SamplingParams())
        assert me.abort("dup") and not me.abort("dup") and not me.has_work()
    finally:
        device.unload_model("errs")


def test_abort_frees_blocks_mid_flight(device, ckpt, alone) -> None:
    me = _load(device, ckpt, "abort")
    try:
        me.add_request("keep", PROMPTS["p4"], GREEDY)
        me.add_request("drop", PROMPTS["p3"], GREEDY)
        got: list[int] = []
        for _ in range(3):
            got += [t for o in me.step() if o.req_id == "keep" for t in o.token_ids]
        used = me.kv.alloc.num_used
        assert me.abort("drop") and me.kv.alloc.num_used == used - 8  # KV of 30 + 2 tokens in blocks of 4
        while me.has_work():
            got += [t for o in me.step() for t in o.token_ids]
        assert got == alone["p4"]
        assert me.kv.alloc.num_used == 0 and me.kv.region.mapped_pages == 0
    finally:
        device.unload_model("abort")


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(block_size=st.sampled_from([1, 2, 3, 8, 16]), budget=st.integers(1, 48), max_seqs=st.integers(1, 6),
       subset=st.lists(st.sampled_from(sorted(PROMPTS)), min_size=1, max_size=6, unique=True))
def test_any_budget_block_size_and_mix_gives_the_alone_output(device, ckpt, alone, block_size, budget, max_seqs,
                                                               subset) -> None:
    me = _load(device, ckpt, "prop", block_size=block_size, max_num_batched_tokens=budget, max_num_seqs=max_seqs)
    try:
        outs = me.generate({rid: PROMPTS[rid] for rid in subset}, GREEDY)
        assert _tokens(outs) == {rid: alone[rid] for rid in subset}
        assert me.kv.alloc.num_used == 0
    finally:
        device.unload_model("prop")


def test_request_outgrowing_pages_another_owner_holds_fails_then_runs_once_freed(ckpt, alone, weight_pages) -> None:
    """p1 needs 8 blocks (9 + 20 tokens) = 4 pages; another owner holds all but 2. With
    kv_wait_timeout_s = 0 (no waiting for pages; the waiting path is in
    test_engine_kv_wait.py) the request must end with an error at once (not
    preempt-and-recompute itself forever), give its pages back, and run normally once the
    other owner lets go."""
    de = DeviceEngine(kind="cpu", memory_bytes=(weight_pages + 8) * 4096, page_size=4096, kv_cache_pages=(0, 0))
    me = de.load_model(ModelConfig(name="m", checkpoint=ckpt, kv_cache_mib=1),
                       EngineConfig(block_size=4, kv_wait_timeout_s=0.0))
    de.pool.alloc_weights("other", 6 * 4096)
    me.add_request("r", PROMPTS["p1"], GREEDY)
    outs = []
    for _ in range(40):
        if not me.has_work():
            break
        outs += me.step()
    assert not me.has_work() and outs[-1].finished and outs[-1].finish_reason == "abort"
    assert "KV cache exhausted" in (outs[-1].error or "") and me.stats.preemptions == 0
    assert me.seqs == {} and me.kv.alloc.num_used == 0 and me.kv.region.mapped_pages == 0
    de.pool.free("other")
    assert _tokens(me.generate({"r": PROMPTS["p1"]}, GREEDY))["r"] == alone["p1"]
    de.unload_model("m")


def test_abort_mid_prefill_returns_blocks_and_pages_at_once(device, ckpt) -> None:
    me = _load(device, ckpt, "abort_pf", max_num_batched_tokens=8)
    try:
        me.add_request("r", PROMPTS["p3"], GREEDY)  # 30 prompt tokens: 4 chunks of 8
        assert me.step() == [] and me.step() == []
        seq = me.seqs["r"]
        assert seq.num_computed == 16 and len(seq.blocks) == 4 and me.kv.region.mapped_pages > 0
        assert me.abort("r")
        # no further step: the worker only steps while there is work
        assert not me.has_work() and me.kv.alloc.num_used == 0 and me.kv.region.mapped_pages == 0
    finally:
        device.unload_model("abort_pf")


def test_pages_of_a_finished_request_go_back_while_others_still_run(ckpt, weight_pages) -> None:
    """A short request above a long one finishes first: its pages return to the pool at
    once (another model may need them), not when the whole model goes idle."""
    de = DeviceEngine(kind="cpu", memory_bytes=(weight_pages + 32) * 4096, page_size=4096, kv_cache_pages=(0, 0))
    me = de.load_model(ModelConfig(name="m", checkpoint=ckpt, kv_cache_mib=1), EngineConfig(block_size=4))
    me.add_request("long", PROMPTS["p3"], GREEDY)  # blocks 0-7, then grows
    me.add_request("short", PROMPTS["p5"], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    pages, short_done = [], False
    while me.has_work():
        before = me.kv.region.mapped_pages
        done_now = any(o.req_id == "short" and o.finished for o in me.step())
        if done_now:
            pages = [before, me.kv.region.mapped_pages]
        short_done |= done_now
        if short_done and me.has_work():
            assert me.kv.region.mapped_pages == -(-me.kv.alloc.high_water() * me.kv.block_bytes // 4096)
    assert short_done and pages[1] < pages[0] and me.kv.region.mapped_pages == 0
    de.unload_model("m")

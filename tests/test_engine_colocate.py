"""Several models on one xTensor pool, and KV export/import between a prefill-role and
a decode-role engine (in process, by block ids and by global offsets)."""

from __future__ import annotations

import msgspec
import pytest

from engine_fixtures import write_hf_checkpoint
from janusd.config import EngineConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.runner import RequestError, SamplingParams

ARCHS = ("llama", "qwen2", "qwen3")
PROMPTS = {f"q{i}": [(11 * i + 5 * j) % 470 + 30 for j in range(n)] for i, n in enumerate([4, 13, 22])}
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
ENGINE = EngineConfig(block_size=4, max_num_batched_tokens=24, max_num_seqs=8)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("co")
    return {a: str(write_hf_checkpoint(root / a, a, seed=i)[0]) for i, a in enumerate(ARCHS)}


def _cfg(name: str, ck: str, role: str = "mixed") -> ModelConfig:
    return ModelConfig(name=name, checkpoint=ck, kv_cache_mib=1, max_model_len=128, role=role)


def _run_all(de: DeviceEngine, names: list[str]) -> dict[tuple[str, str], list[int]]:
    for n in names:
        for rid, p in PROMPTS.items():
            de.models[n].add_request(rid, p, GREEDY)
    out: dict[tuple[str, str], list[int]] = {}
    while de.has_work():
        for o in de.step():
            out.setdefault((o.model, o.req_id), []).extend(o.token_ids)
    return out


@pytest.fixture(scope="module")
def alone(ckpts) -> dict[tuple[str, str], list[int]]:
    ref = {}
    for a in ARCHS:
        de = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10, kv_cache_pages=(0, 0))
        de.load_model(_cfg(a, ckpts[a]), ENGINE)
        ref.update(_run_all(de, [a]))
    return ref


@pytest.mark.parametrize("n", [2, 3])
def test_colocated_models_match_each_alone_and_pool_returns_to_baseline(ckpts, alone, n) -> None:
    de = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10, kv_cache_pages=(0, 0))
    empty = de.pool.stats().free_pages
    names = list(ARCHS[:n])
    for a in names:
        de.load_model(_cfg(a, ckpts[a]), ENGINE)
    baseline = de.pool.stats()
    out = _run_all(de, names)
    assert out == {k: v for k, v in alone.items() if k[0] in names}
    # freed KV pages go back to the pool on the refill thread, off the step path
    assert de.pool.wait_maintenance(5.0)
    after = de.pool.stats()
    assert after.free_pages == baseline.free_pages and after.pages_by_owner == baseline.pages_by_owner
    assert after.kv_pages == 0
    de.pool.check_integrity()
    for a in names:
        de.unload_model(a)
    assert de.pool.stats().free_pages == empty


def test_kv_grows_into_pages_another_model_released(ckpts) -> None:
    de = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10, kv_cache_pages=(0, 0))
    a = de.load_model(_cfg("a", ckpts["llama"]), ENGINE)
    b = de.load_model(_cfg("b", ckpts["qwen2"]), ENGINE)
    a.add_request("x", PROMPTS["q2"], GREEDY)
    a.step()
    a_pages = set(a.kv.region.page_ids())
    assert a_pages
    while a.has_work():
        a.step()
    assert a.kv.region.mapped_pages == 0
    assert de.pool.wait_maintenance(5.0)  # a's freed pages reach the pool on the refill thread
    b.add_request("y", PROMPTS["q2"], GREEDY)
    b.step()
    assert set(b.kv.region.page_ids()) & a_pages  # lowest free pages: the ones a just gave back


def test_prefill_role_exports_and_decode_role_imports(ckpts) -> None:
    ck = ckpts["qwen3"]
    mixed = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10)
    m = mixed.load_model(_cfg("m", ck), ENGINE)
    ref = m.generate(PROMPTS, GREEDY)
    want = {rid: [t for o in os for t in o.token_ids] for rid, os in ref.items()}
    want_text = {rid: "".join(o.text for o in os) for rid, os in ref.items()}

    src_dev = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10)
    dst_dev = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10)
    p = src_dev.load_model(_cfg("p", ck, role="prefill"), ENGINE)
    d = dst_dev.load_model(_cfg("d", ck, role="decode"), ENGINE)
    for rid, prompt in PROMPTS.items():
        p.add_request(rid, prompt, GREEDY)
    first: dict[str, int] = {}
    text: dict[str, str] = {}
    while p.has_work():
        for o in p.step():
            assert o.kv_ready and not o.finished and len(o.token_ids) == 1
            first[o.req_id] = o.token_ids[0]
            text[o.req_id] = o.text
    assert set(first) == set(PROMPTS)
    with pytest.raises(RequestError, match="unknown request"):
        d.export_kv("nope")
    bad = p.export_kv("q1")
    with pytest.raises(RequestError, match="max_tokens"):  # the prefill side already used the only token
        d.import_kv(bad, SamplingParams(max_tokens=1, temperature=0.0), p)
    with pytest.raises(RequestError, match="prompt_len"):
        d.import_kv(msgspec.structs.replace(bad, prompt_len=len(bad.token_ids)), GREEDY, p)
    assert d.seqs == {} and d.kv.alloc.num_used == 0
    got: dict[str, list[int]] = {}
    g = src_dev.pool.global_tensor()
    for i, rid in enumerate(PROMPTS):
        meta = p.export_kv(rid)
        assert meta.token_ids == PROMPTS[rid] + [first[rid]] and meta.num_cached_tokens == len(PROMPTS[rid])
        ps = src_dev.pool.page_size
        assert meta.page_ids == sorted({off // ps for pieces in meta.global_offsets for off, _ in pieces})
        if i % 2:  # by global offsets, as a transfer engine reads them
            d.import_kv(meta, GREEDY, lambda off, n: g[off : off + n])
        else:  # by block ids, engine to engine
            d.import_kv(meta, GREEDY, p)
        assert p.release_kv(rid)
        got[rid] = [first[rid]]
    assert p.kv.alloc.num_used == 0
    while d.has_work():
        for o in d.step():
            got[o.req_id].extend(o.token_ids)
            text[o.req_id] += o.text
    assert got == want
    assert text == want_text


def test_missing_device_runtime_is_a_clear_error() -> None:
    import torch

    from janusd.engine.types import EngineError

    if not torch.cuda.is_available():
        with pytest.raises(EngineError, match="cuda"):
            DeviceEngine(kind="cuda")
    try:
        import torch_npu  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        with pytest.raises(EngineError, match="torch_npu"):
            DeviceEngine(kind="npu")
    with pytest.raises(EngineError, match="multiple of page_size"):
        DeviceEngine(memory_bytes=3 << 20, page_size=2 << 20)


def test_loading_beyond_the_pool_fails_cleanly(ckpts) -> None:
    from janusd.engine.types import EngineError

    de = DeviceEngine(memory_bytes=256 << 10, page_size=64 << 10)
    with pytest.raises(EngineError, match="device memory"):
        de.load_model(_cfg("big", ckpts["llama"]), ENGINE)
    assert de.models == {} and de.pool.stats().free_pages == 4


@pytest.mark.parametrize("field, value, message", [
    ("intermediate_size", 128, r"gate_proj\.weight' has shape \[96, 64\], expected \[128, 64\]"),
    ("num_hidden_layers", 3, r"missing tensor 'model\.layers\.2\."),
])
def test_checkpoint_disagreeing_with_its_config_is_refused_cleanly(ckpts, tmp_path, field, value, message) -> None:
    import json
    import shutil

    from janusd.engine.loader import CheckpointError

    bad = tmp_path / "bad"
    shutil.copytree(ckpts["llama"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg[field] = value
    (bad / "config.json").write_text(json.dumps(cfg))
    de = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10)
    with pytest.raises(CheckpointError, match=message):
        de.load_model(_cfg("bad", str(bad)), ENGINE)
    assert de.models == {} and de.pool.stats().free_pages == de.pool.num_pages


def test_pd_split_streams_the_same_text_when_the_first_token_is_held_back(ckpts) -> None:
    """With a stop string starting with the first token's text, the prefill side holds
    that text back; the decode side must emit it once it is safe (and report no second
    prefill time), so prefill + decode text equals the mixed engine's text."""
    ck = ckpts["qwen3"]
    de = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10)
    m = de.load_model(_cfg("m", ck), ENGINE)
    ref = m.generate({"r": PROMPTS["q1"]}, GREEDY)["r"]
    full = "".join(o.text for o in ref)
    assert ref[0].text and full.count(ref[0].text + "\u2603") == 0
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, stop=[ref[0].text + "\u2603"])
    p = de.load_model(_cfg("p", ck, role="prefill"), ENGINE)
    d = de.load_model(_cfg("d", ck, role="decode"), ENGINE)
    p.add_request("r", PROMPTS["q1"], params)
    outs = []
    while p.has_work():
        outs += p.step()
    assert len(outs) == 1 and outs[0].kv_ready and outs[0].text == ""  # held back: may start the stop string
    d.import_kv(p.export_kv("r"), params, p)
    p.release_kv("r")
    while d.has_work():
        outs += d.step()
    assert "".join(o.text for o in outs) == full and outs[-1].finish_reason == "length"
    assert all(o.prefill_s is None for o in outs[1:])


def test_seeded_sampling_continues_across_a_pd_split(ckpts) -> None:
    """The sampling RNG state travels with the KV, so a seeded request draws the same
    tokens after the split as in one mixed engine."""
    ck = ckpts["llama"]
    seeded = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.95, seed=77, ignore_eos=True)
    mixed = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10)
    m = mixed.load_model(_cfg("m", ck), ENGINE)
    want = [t for o in m.generate({"s": PROMPTS["q1"]}, seeded)["s"] for t in o.token_ids]

    p = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10).load_model(_cfg("p", ck, role="prefill"), ENGINE)
    d = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10).load_model(_cfg("d", ck, role="decode"), ENGINE)
    p.add_request("s", PROMPTS["q1"], seeded)
    got: list[int] = []
    while p.has_work():
        for o in p.step():
            got.extend(o.token_ids)
    meta = p.export_kv("s")
    assert meta.rng_state is not None
    d.import_kv(meta, seeded, p)
    while d.has_work():
        for o in d.step():
            got.extend(o.token_ids)
    assert got == want
    with pytest.raises(RequestError, match="rng_state"):
        d.import_kv(msgspec.structs.replace(meta, req_id="bad", rng_state=b"\x01\x02"), seeded, p)

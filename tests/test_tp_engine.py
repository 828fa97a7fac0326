"""Tensor parallelism (engine/tp/): a model at tp = 2 runs as 2 shard processes joined by a
gloo process group, and generates what tp = 1 (the single-device engine) generates.

The multi-process part spawns ONE group of 2 shards for the whole module (a shard
process costs an interpreter and a torch import) and loads several tiny models into it
(a group holds several models, as a device does): llama with its KV heads split, llama
with one KV head (replicated on both shards), qwen2 (q/k/v bias, tied embeddings), qwen3
(per-head q/k norm) and a Q8_0 GGUF llama (llama.cpp's q/k row permutation). Every
wait on the group is bounded (LocalGroup's reply timeout, the collectives' timeout).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from engine_fixtures import write_hf_checkpoint
from gguf_fixtures import demo_vocab, write_gguf
from janusd.config import EngineConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.loader import ModelArch, expected_tensor_shapes, open_checkpoint
from janusd.engine.tp.layout import ShardLayout, TPError, check_tp, sliced_shape
from janusd.engine.types import EngineError, SamplingParams

Q = gguf.GGMLQuantizationType
PAGE = 64 << 10  # small pages: a 300-token prompt maps several KV pages on every shard
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def _arch(**over: Any) -> ModelArch:
    base = dict(architecture="llama", vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0)
    base.update(over)
    return ModelArch(**base)


# ---- the layout (pure) --------------------------------------------------------------------
def test_heads_that_do_not_divide_are_refused_naming_the_numbers() -> None:
    with pytest.raises(TPError, match=r"num_attention_heads 9 is not divisible by tp 2"):
        check_tp(_arch(num_attention_heads=9, num_key_value_heads=3, hidden_size=144), 2, "smollm2")
    with pytest.raises(TPError, match=r"num_key_value_heads 3 and tp 2: neither divides the other"):
        check_tp(_arch(num_attention_heads=6, num_key_value_heads=3, hidden_size=96), 2)
    with pytest.raises(TPError, match=r"intermediate_size 98 is not divisible by tp 4"):
        check_tp(_arch(intermediate_size=98), 4)
    check_tp(_arch(num_attention_heads=9, num_key_value_heads=3, hidden_size=144), 3)  # SmolLM2's heads at tp 3
    check_tp(_arch(num_key_value_heads=1), 4)  # one KV head: replicated on all four


def test_layout_splits_heads_and_replicates_kv_heads_fewer_than_tp() -> None:
    a = _arch(num_key_value_heads=2)
    split = [ShardLayout(a, 2, r) for r in range(2)]
    assert [(s.q_heads, s.kv_heads, s.kv_head0, s.kv_replicas) for s in split] == [(2, 1, 0, 1), (2, 1, 1, 1)]
    rep = [ShardLayout(a, 4, r) for r in range(4)]
    # query head j uses KV head j // 2: shards 0, 1 hold heads 0 and 1 (KV head 0), 2, 3 heads 2 and 3 (KV head 1)
    assert [s.kv_head0 for s in rep] == [0, 0, 1, 1] and all(s.kv_replicas == 2 for s in rep)
    assert rep[3].slice_of("model.layers.1.self_attn.k_proj.weight") == (0, 16, 32)
    assert rep[3].slice_of("model.layers.1.self_attn.q_proj.weight") == (0, 48, 64)
    assert rep[3].slice_of("model.layers.1.self_attn.o_proj.weight") == (1, 48, 64)
    assert rep[1].slice_of("model.layers.0.mlp.down_proj.weight") == (1, 24, 48)
    assert rep[1].slice_of("model.layers.0.input_layernorm.weight") is None
    # vocabulary 512 over 3 shards: 171 rows each, the last holds 170 and one row of padding
    v = _arch(vocab_size=512, num_attention_heads=3, num_key_value_heads=1, hidden_size=48, intermediate_size=96)
    tri = [ShardLayout(v, 3, r) for r in range(3)]
    assert [s.slice_of("lm_head.weight") for s in tri] == [(0, 0, 171), (0, 171, 342), (0, 342, 512)]
    assert {s.local_shape("lm_head.weight", (512, 48)) for s in tri} == {(171, 48)}
    assert sum(s.vocab_rows for s in tri) == 512


def _sliced_reference(full: dict[str, torch.Tensor], lay: ShardLayout) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in full.items():
        sl = lay.slice_of(name)
        out[name] = t if sl is None else t.narrow(sl[0], sl[1], sl[2] - sl[1])
    return out


def test_hf_shard_reads_only_its_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each shard's tensors are exactly its slices of the full ones, read through
    safetensors' get_slice (whole-tensor reads only for replicated tensors), and the bytes
    it reads are its share of the file's."""
    import safetensors

    path, _ = write_hf_checkpoint(tmp_path / "ck", "qwen2", num_key_value_heads=1)
    full = dict(open_checkpoint(path).iter_tensors(torch.float32))
    total = sum(t.numel() * 4 for t in full.values())
    whole: list[str] = []
    real_open = safetensors.safe_open

    class Spy:
        def __init__(self, *a: Any, **k: Any) -> None:
            self.f = real_open(*a, **k)

        def __enter__(self) -> Spy:
            self.f.__enter__()
            return self

        def __exit__(self, *exc: Any) -> None:
            self.f.__exit__(*exc)

        def get_tensor(self, name: str) -> torch.Tensor:
            whole.append(name)
            return self.f.get_tensor(name)

        def get_slice(self, name: str) -> Any:
            return self.f.get_slice(name)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    reads = []
    for rank in range(2):
        ck = open_checkpoint(path)
        lay = ShardLayout(ck.arch, 2, rank)
        slices = lay.slices(ck.tensor_specs())
        whole.clear()
        got = dict(ck.iter_tensors(torch.float32, slices))
        assert sorted(whole) == sorted(n for n, s in slices.items() if s is None)  # norms only
        for name, t in _sliced_reference(full, lay).items():
            assert torch.equal(got[name], t), (rank, name)
        # exactly its slices' bytes (the one KV head is read by both shards: replicated)
        assert ck.bytes_read == sum(math.prod(sliced_shape(tuple(full[n].shape), s)) * 4 for n, s in slices.items())
        reads.append(ck.bytes_read)
    assert max(reads) < 0.6 * total


@pytest.mark.parametrize("tp", [2, 4])
def test_gguf_shard_reads_only_its_blocks(tmp_path: Path, tp: int) -> None:
    """Q8_0 rows and columns: a row slice is whole rows of blocks, a column slice the blocks
    covering it (tp 4 cuts o_proj's 64 columns into 16, half a 32-wide block); q/k come back
    unpermuted per head, so every shard's tensors equal the sliced HF tensors."""
    vocab = demo_vocab(tmp_path / "v")
    a = _arch(vocab_size=len(vocab["tokens"]), intermediate_size=128)
    rng = np.random.default_rng(5)
    orig = {n: (rng.standard_normal(s) * 0.02).astype(np.float32) for n, s in expected_tensor_shapes(a).items()}
    expected = write_gguf(tmp_path / "q.gguf", a, orig, Q.Q8_0, vocab)
    full = {n: torch.from_numpy(np.ascontiguousarray(x)) for n, x in expected.items()}
    whole_bytes = open_checkpoint(tmp_path / "q.gguf")
    for _ in whole_bytes.iter_tensors(torch.float32):
        pass
    for rank in range(tp):
        ck = open_checkpoint(tmp_path / "q.gguf")
        lay = ShardLayout(ck.arch, tp, rank)
        got = dict(ck.iter_tensors(torch.float32, lay.slices(ck.tensor_specs())))
        for name, t in _sliced_reference(full, lay).items():
            assert got[name].shape == sliced_shape(tuple(full[name].shape), lay.slice_of(name))
            assert torch.equal(got[name], t), (rank, name)
        assert ck.bytes_read < (1.0 / tp + 0.25) * whole_bytes.bytes_read, (rank, ck.bytes_read)


# ---- one group of 2 shard processes ----------------------------------------------------------
MODELS = {  # name -> (writer, kwargs)
    "llama": ("llama", {"num_key_value_heads": 2}),
    "llama-kv1": ("llama", {"num_key_value_heads": 1}),  # one KV head for 2 shards: replicated
    "qwen2": ("qwen2", {"num_key_value_heads": 2, "tie_word_embeddings": True}),
    "qwen3": ("qwen3", {"num_key_value_heads": 2}),
}
PROMPTS = {"short": [5, 6, 7, 8, 9, 10, 11], "long": [(7 * j) % 500 + 3 for j in range(300)]}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tp")
    out = {}
    for name, (arch, kw) in MODELS.items():
        out[name] = str(write_hf_checkpoint(root / name, arch, seed=len(out), **kw)[0])
    vocab = demo_vocab(root / "v")
    a = _arch(vocab_size=len(vocab["tokens"]), intermediate_size=128)
    rng = np.random.default_rng(9)
    orig = {n: (rng.standard_normal(s) * 0.05).astype(np.float32) for n, s in expected_tensor_shapes(a).items()}
    for n in orig:
        if n.endswith("norm.weight"):
            orig[n] += 1.0
    write_gguf(root / "q8.gguf", a, orig, Q.Q8_0, vocab)
    out["gguf-q8"] = str(root / "q8.gguf")
    a3 = _arch(num_attention_heads=3, num_key_value_heads=1, hidden_size=48, vocab_size=len(vocab["tokens"]))
    w3 = {n: (rng.standard_normal(s) * 0.05).astype(np.float32) for n, s in expected_tensor_shapes(a3).items()}
    write_gguf(root / "h3.gguf", a3, w3, Q.F32, vocab)
    out["heads3"] = str(root / "h3.gguf")
    return out


@pytest.fixture(scope="module")
def group(models: dict[str, str]) -> Any:
    from janusd.engine.tp.group import LocalGroup

    g = LocalGroup(2, threads=1, timeout_s=30.0, reply_timeout_s=120.0, memory_bytes=64 << 20, page_size=PAGE)
    try:
        loaded = {}
        for name, spec in models.items():
            if name != "heads3":
                loaded[name] = g.load(spec, name=name, kv_cache_mib=4, max_model_len=512)
        g.loaded = loaded  # type: ignore[attr-defined]
        yield g
    finally:
        g.close()


def _reference(spec: str) -> tuple[dict[str, list[int]], dict[str, np.ndarray]]:
    """Greedy tokens and every sampled row's logits on the single-device engine (tp 1)."""
    de = DeviceEngine(kind="cpu", memory_bytes=64 << 20, page_size=PAGE)
    me = de.load_model(ModelConfig(name="ref", checkpoint=spec, kv_cache_mib=4, max_model_len=512), EngineConfig())
    rows: dict[str, list[np.ndarray]] = {}
    me.logit_sink = lambda rid, r: rows.setdefault(rid, []).append(r.numpy().copy())
    outs = me.generate(dict(PROMPTS), GREEDY)
    return ({rid: [t for o in v for t in o.token_ids] for rid, v in outs.items()},
            {rid: np.stack(r) for rid, r in rows.items()})


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(MODELS) + ["gguf-q8"])
def test_tp2_generates_what_tp1_generates(group: Any, models: dict[str, str], name: str) -> None:
    """Greedy tokens equal token for token, and every sampled row's logits (the first is the
    prefill's last row) within float32 rounding of the single-device engine's, on a
    short prompt and a 300-token one (several KV pages, mapped on both shards)."""
    want_ids, want_logits = _reference(models[name])
    got = group.generate(dict(PROMPTS), GREEDY, model=name, logits=True)
    assert got.token_ids == want_ids
    vocab = group.loaded[name].vocab_size
    for rid in PROMPTS:
        logits = np.frombuffer(got.logits[rid], dtype=np.float32).reshape(-1, vocab)
        assert logits.shape == want_logits[rid].shape
        np.testing.assert_allclose(logits[0], want_logits[rid][0], rtol=0, atol=2e-5)  # the prefill's
        np.testing.assert_allclose(logits, want_logits[rid], rtol=0, atol=2e-5)
        assert np.abs(logits).max() > 0.05  # not a model of zeros


def test_each_shard_holds_and_read_its_half(group: Any, models: dict[str, str]) -> None:
    """The shards' own reports: each holds the layout's shapes (the replicated KV head of
    llama-kv1 on both), read about half the checkpoint, and keeps half the KV per token."""
    for name, loaded in group.loaded.items():
        ck = open_checkpoint(models[name])
        for _ in ck.iter_tensors(torch.float32):
            pass
        full = ck.bytes_read
        for info in loaded.shards:
            lay = ShardLayout(ck.arch, 2, info.rank)
            assert info.shapes == {n: list(s) for n, (s, _) in lay.local_specs(ck.tensor_specs()).items()}
            assert 0.4 * full < info.bytes_read < 0.65 * full, (name, info.rank, info.bytes_read, full)
        w = [i.weight_bytes for i in loaded.shards]
        assert w[0] == w[1]
        kv = {i.kv_bytes_per_token for i in loaded.shards}
        per_head = ck.arch.num_hidden_layers * 2 * ck.arch.head_dim * 4
        assert kv == {per_head * max(1, ck.arch.num_key_value_heads // 2)}
    kv1 = group.loaded["llama-kv1"].shards
    assert kv1[0].shapes["model.layers.0.self_attn.k_proj.weight"] == [16, 64]  # the one KV head, on both


def test_group_refuses_heads_that_do_not_divide_and_stays_usable(group: Any, models: dict[str, str]) -> None:
    with pytest.raises(EngineError, match=r"num_attention_heads 3 is not divisible by tp 2"):
        group.load(models["heads3"], name="heads3")
    got = group.generate({"a": PROMPTS["short"]}, GREEDY, model="llama")
    assert len(got.token_ids["a"]) == GREEDY.max_tokens


def test_group_bench_counts_the_collectives(group: Any) -> None:
    """Per decode step: the embedding's all-reduce, two per layer, the logits gather."""
    f = group.bench(model="llama", batch=2, prompt_len=8, decode_steps=3, prefill_reps=1, allreduce_reps=5)
    assert f["collectives_per_decode_step"] == 1 + 2 * 2 + 1
    assert f["decode_step_ms"] > 0 and f["allreduce_ms"] > 0 and f["comm_ms_per_decode_step"] > 0


def test_a_killed_shard_fails_the_request_not_hangs(group: Any) -> None:
    """The last test on `group` (it ends it): kill -9 of the follower makes the next request an
    error naming the shard within seconds."""
    follower = group.procs[1]
    os.kill(follower.pid, signal.SIGKILL)
    follower.wait(timeout=10)
    t = time.monotonic()
    with pytest.raises(EngineError, match=r"tp shard 1|Connection|closed|reset"):
        group.generate({"a": PROMPTS["short"]}, GREEDY, model="llama")
    assert time.monotonic() - t < 5.0


# ---- the commands ------------------------------------------------------------------------------
def _run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from janusd.cli import build_parser

    args = build_parser().parse_args(list(argv))
    rc = importlib.import_module(args._module).run(args)
    out = capsys.readouterr()
    return int(rc or 0), out.out, out.err


@pytest.mark.timeout(240)
def test_generate_tp2_prints_tp1s_tokens_and_refuses_tp3(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JANUSD_CACHE_DIR", str(tmp_path))
    base = ("generate", "--model", "demo:qwen3-tiny", "--prompt", "Once upon a time", "--max-tokens", "8", "--json")
    rc, out1, _ = _run_cli(capsys, *base)
    assert rc == 0
    rc, out2, err = _run_cli(capsys, *base, "--tp", "2")
    assert rc == 0, err
    one, two = json.loads(out1.strip().splitlines()[-1]), json.loads(out2.strip().splitlines()[-1])
    assert two["tp"] == 2 and two["token_ids"] == one["token_ids"] and two["text"] == one["text"]
    assert len(two["token_ids"]) == 8
    rc, out3, err = _run_cli(capsys, *base, "--tp", "3")  # refused before any process starts
    assert rc == 2 and out3 == ""
    assert "num_attention_heads 4 is not divisible by tp 3" in err


@pytest.mark.timeout(240)
def test_bench_tp_reports_both_degrees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run_cli(capsys, "bench", "tp", "--model", "demo:llama-tiny", "--cache-dir", str(tmp_path),
                            "--batches", "1,2", "--prompt-len", "8", "--decode-steps", "2", "--reps", "1", "--json")
    assert rc == 0, err
    r = json.loads(out.strip().splitlines()[-1])
    assert r["greedy_equal"] is True and r["tp"] == 2
    for k in ("b1", "b2"):
        assert r["tp1"][k]["decode_step_ms"] > 0 and r["tp1"][k]["comm_ms_per_decode_step"] == 0
        f = r["tp2"][k]
        assert f["collectives_per_decode_step"] == 1 + 2 * r["arch"]["layers"] + 1
        assert f["allreduce_ms_per_step"] == pytest.approx(f["allreduce_ms"] * (1 + 2 * r["arch"]["layers"]), abs=2e-3)
        # the bench prints ratios to 3 decimals: a slow gloo step (0.04x on a loaded CI machine) is off by < 5e-4
        assert r[f"decode_speedup_{k}"] == pytest.approx(r["tp1"][k]["decode_step_ms"] / f["decode_step_ms"],
                                                         rel=0.01, abs=6e-4)
        # the prior beside it (hw/spec.py tp_comm_s): collectives only at tp 2, a hop's latency each
        assert r["prior"]["tp1"][k]["comm_ms_per_decode_step"] == 0 < r["prior"]["tp2"][k]["comm_ms_per_decode_step"]
        hops_ms = (2 * r["arch"]["layers"] + 3) * 2 * r["device_spec"]["link_latency_s"] * 1e3
        assert r["prior"]["tp2"][k]["comm_ms_per_decode_step"] >= hops_ms - 1e-3 and hops_ms > 0

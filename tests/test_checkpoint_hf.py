"""HF checkpoint dirs: what transformers' save_pretrained writes reads back exactly, under our names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from janusd.engine.loader import ModelArch, expected_tensor_shapes, open_checkpoint

import transformers  # noqa: E402  (a test extra: missing must fail, not skip)

TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def _write_tokenizer(d: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {chr(ord("a") + i): i for i in range(26)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(d / "tokenizer.json"))


def _save(model, d: Path, shard: str | None = None) -> Path:
    model.save_pretrained(str(d), max_shard_size=shard) if shard else model.save_pretrained(str(d))
    _write_tokenizer(d)
    return d


def _model(cls_name: str, **extra):
    cfg_cls = getattr(transformers, cls_name)
    torch.manual_seed(1)
    return transformers.AutoModelForCausalLM.from_config(cfg_cls(**TINY, **extra))


CASES = {
    "llama3-rope": ("LlamaConfig", dict(max_position_embeddings=4096, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024})),
    "mistral": ("MistralConfig", dict(sliding_window=None)),
    "qwen2-tied": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=16)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("shard", [None, "12KB"])
def test_save_pretrained_round_trip(tmp_path: Path, case: str, shard: str | None) -> None:
    cls_name, extra = CASES[case]
    model = _model(cls_name, **extra)
    d = _save(model, tmp_path, shard)
    if shard:
        assert (d / "model.safetensors.index.json").exists() and len(list(d.glob("*.safetensors"))) > 2
    ck = open_checkpoint(d)
    assert ck.format == "hf" and ck.path == d
    state = {k: v for k, v in model.state_dict().items()}
    specs = ck.tensor_specs()
    tied = bool(extra.get("tie_word_embeddings"))
    # every parameter the model owns is served, except a tied lm_head which the engine ties itself
    assert set(specs) == set(state) - ({"lm_head.weight"} if tied else set())
    seen = []
    for name, tensor in ck.iter_tensors(torch.float32):
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, state[name]), name
        assert specs[name] == (tuple(state[name].shape), "float32")
        seen.append(name)
    assert sorted(seen) == sorted(specs)
    a = ck.arch
    assert (a.vocab_size, a.hidden_size, a.intermediate_size, a.num_hidden_layers) == (96, 32, 48, 2)
    assert (a.num_attention_heads, a.num_key_value_heads) == (4, 2)
    assert a.head_dim == (16 if case == "qwen3" else 8)
    assert a.tie_word_embeddings is tied
    assert a.attention_bias is (case == "qwen2-tied")
    assert a.qk_norm is (case == "qwen3")
    if case == "llama3-rope":
        assert a.architecture == "llama"
        assert a.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
        assert a.max_position_embeddings == 4096
    else:
        assert a.rope_scaling is None
    assert a.architecture == {"llama3-rope": "llama", "mistral": "mistral", "qwen2-tied": "qwen2", "qwen3": "qwen3"}[case]


def test_load_into_preallocated_views_and_dtype_conversion(tmp_path: Path) -> None:
    model = _model("Qwen3Config", head_dim=16)
    ck = open_checkpoint(_save(model, tmp_path, "12KB"))
    specs = ck.tensor_specs()
    sizes = {n: torch.Size(s).numel() for n, (s, _) in specs.items()}
    arena = torch.zeros(sum(sizes.values()), dtype=torch.bfloat16)  # one flat segment, like a weight region
    views, off = {}, 0
    for n, (shape, _) in specs.items():
        views[n] = arena[off : off + sizes[n]].view(shape)
        off += sizes[n]
    ck.load_into(lambda n: views[n], torch.bfloat16)
    state = model.state_dict()
    for n in specs:
        assert torch.equal(views[n], state[n].to(torch.bfloat16)), n
    # the views alias the arena: the arena now holds exactly the weights
    assert torch.count_nonzero(arena) > 0.9 * arena.numel()


def test_load_into_rejects_wrong_destination_shape(tmp_path: Path) -> None:
    from janusd.engine.loader import CheckpointError

    ck = open_checkpoint(_save(_model("LlamaConfig"), tmp_path))
    bufs = {n: torch.empty(s) for n, (s, _) in ck.tensor_specs().items()}
    bufs["model.layers.1.mlp.up_proj.weight"] = torch.empty(48, 31)
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*\[48, 31\]"):
        ck.load_into(bufs.__getitem__, torch.float32)


def test_expected_tensor_shapes_match_transformers_for_every_arch() -> None:
    """Our derived tensor set is the model's own parameter set (HF [out, in] layout)."""
    for cls_name, extra in CASES.values():
        model = _model(cls_name, **extra)
        cfg = model.config
        a = ModelArch(architecture=cfg.model_type, vocab_size=96, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=getattr(cfg, "head_dim", None) or 8, rms_norm_eps=1e-6, rope_theta=1e4,
                      tie_word_embeddings=bool(extra.get("tie_word_embeddings")),
                      attention_bias=cfg.model_type == "qwen2", qk_norm=cfg.model_type == "qwen3")
        want = {n: tuple(p.shape) for n, p in model.named_parameters()}
        assert expected_tensor_shapes(a) == want


def test_old_style_config_and_generation_defaults(tmp_path: Path) -> None:
    """transformers<5 config keys (rope_theta, rope_scaling with 'type', torch_dtype) read the same."""
    d = _save(_model("LlamaConfig"), tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.pop("dtype", None)
    cfg.update(rope_theta=500000.0, torch_dtype="bfloat16", eos_token_id=[7, 8],
               rope_scaling={"type": "linear", "factor": 2.0})
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9, "eos_token_id": 9}))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "c"}, "chat_template": [
        {"name": "default", "template": "D{{ messages[0]['content'] }}"},
        {"name": "tool_use", "template": "T{{ tools | length }}"}]}))
    ck = open_checkpoint(d)
    assert ck.arch.rope_theta == 500000.0 and ck.arch.torch_dtype == "bfloat16"
    assert ck.arch.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    # generation_config's eos first, then the tokenizer's eos token ("c" is id 2)
    assert ck.eos_token_ids == [9, 2] and ck.tokenizer.eos_token_ids == [9, 2]
    assert ck.generation_defaults == {"temperature": 0.6, "top_p": 0.9, "eos_token_id": [9, 2]}
    msgs = [{"role": "user", "content": "hi"}]
    assert ck.tokenizer.apply_chat_template(msgs) == "Dhi"
    assert ck.tokenizer.apply_chat_template(msgs, tools=[{"a": 1}, {"b": 2}]) == "T2"

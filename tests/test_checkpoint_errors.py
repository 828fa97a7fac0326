"""Every way a checkpoint can be broken gives a CheckpointError naming the file and the tensor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from janusd.engine.checkpoint.demo import make_demo
from janusd.engine.loader import CheckpointError, open_checkpoint


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_demo(tmp_path_factory.mktemp("demo") / "llama-tiny", "llama", "tiny")


@pytest.fixture
def ck_dir(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "ck"))


def _rewrite(d: Path, edit) -> None:
    tensors = load_file(str(d / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(d / "model.safetensors"))


def _cfg(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def test_error_is_a_value_error() -> None:
    assert issubclass(CheckpointError, ValueError)


def test_pristine_opens(pristine: Path) -> None:
    assert open_checkpoint(pristine).arch.architecture == "llama"


def test_missing_config(ck_dir: Path) -> None:
    (ck_dir / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: missing file"):
        open_checkpoint(ck_dir)


def test_corrupt_config_json(ck_dir: Path) -> None:
    (ck_dir / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: unreadable JSON"):
        open_checkpoint(ck_dir)


def test_missing_weights_file(ck_dir: Path) -> None:
    (ck_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing file"):
        open_checkpoint(ck_dir)


def test_pickle_only_checkpoint_is_refused(ck_dir: Path) -> None:
    (ck_dir / "model.safetensors").rename(ck_dir / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"missing file \(pickle \.bin checkpoints are not supported\)"):
        open_checkpoint(ck_dir)


def test_missing_tensor(ck_dir: Path) -> None:
    _rewrite(ck_dir, lambda t: t.pop("model.layers.1.self_attn.v_proj.weight"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing tensor 'model\.layers\.1\.self_attn\.v_proj\.weight'"):
        open_checkpoint(ck_dir)


def test_extra_tensor(ck_dir: Path) -> None:
    _rewrite(ck_dir, lambda t: t.update({"model.layers.5.mystery.weight": torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: unexpected tensor 'model\.layers\.5\.mystery\.weight'"):
        open_checkpoint(ck_dir)


def test_wrong_shape(ck_dir: Path) -> None:
    _rewrite(ck_dir, lambda t: t.update({"model.layers.0.mlp.down_proj.weight": torch.zeros(64, 127)}))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.down_proj\.weight' has shape \[64, 127\], expected \[64, 128\]"):
        open_checkpoint(ck_dir)


def test_wrong_dtype(ck_dir: Path) -> None:
    _rewrite(ck_dir, lambda t: t.update({"model.norm.weight": torch.ones(64, dtype=torch.int32)}))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'model\.norm\.weight' has dtype I32"):
        open_checkpoint(ck_dir)


def test_unsupported_architecture(ck_dir: Path) -> None:
    _cfg(ck_dir, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(CheckpointError, match=r"config\.json: unsupported architecture 'GPT2LMHeadModel'"):
        open_checkpoint(ck_dir)


def test_unsupported_features_are_refused(ck_dir: Path) -> None:
    _cfg(ck_dir, hidden_act="gelu")
    with pytest.raises(CheckpointError, match=r"unsupported hidden_act 'gelu'"):
        open_checkpoint(ck_dir)
    _cfg(ck_dir, hidden_act="silu", attention_bias=True)
    with pytest.raises(CheckpointError, match=r"attention_bias/mlp_bias on llama"):
        open_checkpoint(ck_dir)


def test_inconsistent_heads(ck_dir: Path) -> None:
    _cfg(ck_dir, num_key_value_heads=3)
    with pytest.raises(CheckpointError, match=r"num_attention_heads \(4\) is not a multiple of num_key_value_heads \(3\)"):
        open_checkpoint(ck_dir)


def test_missing_config_key(ck_dir: Path) -> None:
    cfg = json.loads((ck_dir / "config.json").read_text())
    del cfg["intermediate_size"]
    (ck_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json: missing key 'intermediate_size'"):
        open_checkpoint(ck_dir)


def test_garbage_safetensors_header(ck_dir: Path) -> None:
    (ck_dir / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{{{{{{{{{{{{{{{{")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt safetensors header"):
        open_checkpoint(ck_dir)


def test_truncated_safetensors(ck_dir: Path) -> None:
    f = ck_dir / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor '.+' lies outside the file \(truncated\?\)"):
        open_checkpoint(ck_dir)
    f.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt safetensors file"):
        open_checkpoint(ck_dir)


def test_sharded_index_problems(ck_dir: Path) -> None:
    tensors = load_file(str(ck_dir / "model.safetensors"))
    (ck_dir / "model.safetensors").unlink()
    names = sorted(tensors)
    first, second = names[: len(names) // 2], names[len(names) // 2 :]
    save_file({n: tensors[n] for n in first}, str(ck_dir / "model-00001-of-00002.safetensors"))
    save_file({n: tensors[n] for n in second}, str(ck_dir / "model-00002-of-00002.safetensors"))
    weight_map = {n: "model-00001-of-00002.safetensors" for n in first}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in second})
    index = ck_dir / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert len(open_checkpoint(ck_dir).tensor_specs()) == len(names)  # the good sharded case
    # a tensor the index places in the wrong shard
    bad = dict(weight_map, **{second[0]: "model-00001-of-00002.safetensors"})
    index.write_text(json.dumps({"weight_map": bad}))
    with pytest.raises(CheckpointError, match=rf"model-00001-of-00002\.safetensors: tensor '{second[0]}' listed in the index is not in this shard"):
        open_checkpoint(ck_dir)
    # a shard file that is gone
    index.write_text(json.dumps({"weight_map": weight_map}))
    (ck_dir / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors: missing file \(a shard named in model\.safetensors\.index\.json\)"):
        open_checkpoint(ck_dir)


def test_missing_and_corrupt_tokenizer(ck_dir: Path) -> None:
    (ck_dir / "tokenizer.json").write_text('{"model": 12}')
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: unreadable tokenizer"):
        open_checkpoint(ck_dir)
    (ck_dir / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: missing file"):
        open_checkpoint(ck_dir)


def test_file_replaced_after_open_is_caught_per_tensor(ck_dir: Path) -> None:
    ck = open_checkpoint(ck_dir)
    _rewrite(ck_dir, lambda t: t.update({"model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 32)}))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.self_attn\.q_proj\.weight' read with shape \[64, 32\], expected \[64, 64\]"):
        for _ in ck.iter_tensors(torch.float32):
            pass


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ("demo:llama-huge", r"bad demo spec 'demo:llama-huge'"),
        ("demo:gpt2-tiny", r"bad demo spec 'demo:gpt2-tiny'"),
        ("builtin:nope", r"builtin:nope: unknown builtin model"),
        ("/nonexistent/ckpt", r"/nonexistent/ckpt: no such checkpoint"),
        ("/nonexistent/model.gguf", r"/nonexistent/model\.gguf: missing file"),
        ("", r"bad checkpoint spec ''"),
    ],
)
def test_bad_spec_strings(spec: str, pattern: str) -> None:
    with pytest.raises(CheckpointError, match=pattern):
        open_checkpoint(spec)


def test_non_checkpoint_file_and_corrupt_gguf(tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(CheckpointError, match=r"notes\.txt: not a checkpoint"):
        open_checkpoint(other)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    with pytest.raises(CheckpointError, match=r"broken\.gguf: unreadable or corrupt GGUF file"):
        open_checkpoint(bad)
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(CheckpointError, match=r"broken\.gguf: unreadable or corrupt GGUF file"):
        open_checkpoint(bad)


def test_index_with_a_non_string_shard_name(ck_dir: Path) -> None:
    names = sorted(load_file(str(ck_dir / "model.safetensors")))
    weight_map: dict[str, object] = {n: "model.safetensors" for n in names}
    weight_map[names[0]] = 7
    (ck_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=rf"model\.safetensors\.index\.json: tensor '{names[0]}' has shard 7, expected a file name"):
        open_checkpoint(ck_dir)


def test_unsupported_rope_scaling_is_refused_when_opening(ck_dir: Path) -> None:
    # caught by `janus models inspect`/open, not only when the engine builds its rotary table
    _cfg(ck_dir, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(CheckpointError, match=r"config\.json: rope_scaling type 'yarn' is not supported"):
        open_checkpoint(ck_dir)
    _cfg(ck_dir, rope_scaling={"rope_type": "llama3", "factor": 8.0})  # lacks original_max_position_embeddings
    with pytest.raises(CheckpointError, match=r"config\.json: rope_scaling 'llama3' needs original_max_position_embeddings"):
        open_checkpoint(ck_dir)
    _cfg(ck_dir, rope_scaling={"rope_type": "linear", "factor": 0})
    with pytest.raises(CheckpointError, match=r"config\.json: rope_scaling factor must be a number > 0"):
        open_checkpoint(ck_dir)
    _cfg(ck_dir, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert open_checkpoint(ck_dir).arch.rope_scaling == {"rope_type": "linear", "factor": 2.0}

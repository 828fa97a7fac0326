"""Demo checkpoints: deterministic, HF-format files that transformers loads, cached race-free."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from janusd.cli import main as janus_main
from janusd.engine.checkpoint.demo import DEMO_SIZES, make_demo
from janusd.engine.loader import CheckpointError, open_checkpoint

import transformers  # noqa: E402  (a test extra: missing must fail, not skip)

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello. How can I help?"}, {"role": "user", "content": "Tell me a story, café-style 🙂"}],
]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_demo_loads_in_transformers_identically(tmp_path: Path, arch: str) -> None:
    d = make_demo(tmp_path / arch, arch, "tiny")
    ck = open_checkpoint(d)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(d))
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(d))
    assert type(model).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    state = model.state_dict()
    for name, t in ck.iter_tensors(torch.float32):
        assert torch.equal(state[name], t), name
    if ck.arch.tie_word_embeddings:
        assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
    s = DEMO_SIZES["tiny"]
    a = ck.arch
    assert (a.hidden_size, a.num_hidden_layers, a.num_attention_heads, a.num_key_value_heads, a.intermediate_size) == (
        s["hidden"], s["layers"], s["heads"], s["kv_heads"], s["intermediate"])
    assert a.vocab_size == ck.tokenizer.vocab_size == 512
    assert (a.attention_bias, a.qk_norm, a.tie_word_embeddings) == (arch == "qwen2", arch == "qwen3", arch == "qwen2")
    for conv in CONVERSATIONS:
        for gen in (True, False):
            ours = ck.tokenizer.apply_chat_template(conv, add_generation_prompt=gen)
            assert ours == hf_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
            assert ck.tokenizer.encode(ours) == hf_tok.encode(ours, add_special_tokens=False)
    prompt = ck.tokenizer.apply_chat_template(CONVERSATIONS[0])
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert prompt.endswith("What is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    ids = torch.tensor([ck.tokenizer.encode(prompt)])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 512) and torch.isfinite(logits).all()
    assert ck.eos_token_ids == [2, 0] and ck.tokenizer.decode([2, 0]) == ""


def test_llama_small_has_llama3_rope_and_loads(tmp_path: Path) -> None:
    d = make_demo(tmp_path / "ls", "llama", "small")
    ck = open_checkpoint(d)
    assert ck.arch.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 512}
    assert (ck.arch.hidden_size, ck.arch.num_hidden_layers, ck.arch.vocab_size) == (256, 4, 2048)
    assert ck.tokenizer.vocab_size == 2048
    cfg = transformers.AutoConfig.from_pretrained(str(d))
    assert cfg.rope_parameters["rope_type"] == "llama3" and cfg.rope_parameters["factor"] == 8.0


def test_demo_is_deterministic_and_seeded(tmp_path: Path) -> None:
    a = make_demo(tmp_path / "a", "qwen3", "tiny")
    b = make_demo(tmp_path / "b", "qwen3", "tiny")
    c = make_demo(tmp_path / "c", "qwen3", "tiny", seed=1)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    w = dict(open_checkpoint(a).iter_tensors(torch.float32))
    assert abs(float(w["model.layers.0.mlp.up_proj.weight"].std()) - 0.02) < 0.002
    assert torch.equal(w["model.layers.1.self_attn.q_norm.weight"], torch.ones(16))


def test_demo_tokenizer_is_a_real_bpe(tmp_path: Path) -> None:
    tok = open_checkpoint(make_demo(tmp_path / "d", "llama", "small")).tokenizer
    text = "Once upon a time, there was a little village at the edge of a great forest."
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) <= 24  # merged words (16 words, 2 marks), not bytes (77 characters)
    assert tok.encode("<|im_start|>") == [1] and tok.special_token_ids == frozenset({0, 1, 2})
    assert tok.encode("1234") == [tok.token_to_id(c) for c in "1234"]  # digits split individually


def test_demo_spec_is_made_once_and_races_safely(tmp_path: Path) -> None:
    code = ("import sys; from janusd.engine.loader import open_checkpoint; "
            "ck = open_checkpoint('demo:qwen2-tiny', cache_dir=sys.argv[1]); print(ck.path)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    target = tmp_path / "demo" / "qwen2-tiny"
    assert outs == [str(target)] * 3
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == ["qwen2-tiny"]  # no temp dirs left
    before = (target / "model.safetensors").stat().st_mtime_ns
    ck = open_checkpoint("demo:qwen2-tiny", cache_dir=tmp_path)
    assert ck.path == target and (target / "model.safetensors").stat().st_mtime_ns == before


def test_cli_make_demo_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli-demo"
    assert janus_main(["models", "make-demo", str(out), "--arch", "qwen3", "--size", "tiny"]) == 0
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json",
                                              "tokenizer_config.json", "generation_config.json"}
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    capsys.readouterr()
    assert janus_main(["models", "inspect", str(out)]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["arch"]["architecture"] == "qwen3" and info["num_tensors"] == 25 and info["format"] == "hf"
    assert janus_main(["models", "make-demo", str(out), "--arch", "qwen3"]) == 2  # not empty
    assert "directory is not empty" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="directory is not empty"):
        make_demo(out, "llama", "tiny")


def test_make_demo_into_an_unwritable_place_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # (a regular file as the parent: unwritable even for root, which ignores chmod)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match=r"file/demo: cannot write the demo checkpoint"):
        make_demo(blocker / "demo", "llama", "tiny")
    with pytest.raises(CheckpointError, match=r"file: cannot write the demo checkpoint"):
        make_demo(blocker, "llama", "tiny")  # the target itself is a file
    assert janus_main(["models", "make-demo", str(blocker / "demo")]) == 2
    assert "cannot write the demo checkpoint" in capsys.readouterr().err


def test_demo_spec_with_an_unusable_cache_dir_is_a_clean_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match=r"file/demo: cannot create the demo checkpoint cache"):
        open_checkpoint("demo:llama-tiny", cache_dir=blocker)


def test_demo_spec_with_a_broken_leftover_in_the_cache_is_a_clean_error(tmp_path: Path) -> None:
    leftover = tmp_path / "demo" / "llama-tiny"
    leftover.mkdir(parents=True)
    (leftover / "config.json").write_text("{}")  # an interrupted copy, no weights
    with pytest.raises(CheckpointError, match=r"demo/llama-tiny: cannot install the demo checkpoint there"):
        open_checkpoint("demo:llama-tiny", cache_dir=tmp_path)
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == ["llama-tiny"]  # temp dir cleaned up


def test_first_use_of_a_demo_spec_shows_progress_on_a_terminal(tmp_path, monkeypatch):
    """`make serve`'s first start makes the demo checkpoints with a progress bar; off a
    terminal (a log file) it stays quiet."""
    import io
    import sys

    from janusd.engine.checkpoint.demo import DEMO_STEPS, ensure_demo, make_demo

    steps: list[str] = []
    make_demo(tmp_path / "direct", "qwen3", "tiny", on_step=steps.append)
    assert tuple(steps) == DEMO_STEPS

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for tty, name in ((True, "c1"), (False, "c2")):
        out = Terminal() if tty else io.StringIO()
        monkeypatch.setattr(sys, "stderr", out)
        ensure_demo(tmp_path / name, "llama", "tiny")
        monkeypatch.undo()
        text = out.getvalue()
        if tty:
            assert "making demo checkpoint llama-tiny" in text and "written" in text
        else:
            assert text == ""

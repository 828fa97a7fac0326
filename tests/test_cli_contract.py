"""The `janus` command-line contract ([F]): every command that reports figures takes
--json and prints one JSON object as its last line; `janusd` is `janus serve`;
`janus generate` turns bad checkpoints and over-long prompts into its documented
one-line errors (exit status 2, nothing on stdout with --json); checkpoint loads
longer than a second show a progress bar on a terminal.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from janusd.cli import build_parser

# Leaf commands that report no figures: the daemon itself and the demo-checkpoint writer.
NO_FIGURES = {("serve",), ("models", "make-demo")}


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {path: parser}
    out: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for name, child in subs[0].choices.items():
        out.update(_leaves(child, (*path, name)))
    return out


def test_every_figure_reporting_command_takes_json() -> None:
    leaves = _leaves(build_parser())
    assert ("bench", "dispatch") in leaves and ("trace", "stats") in leaves  # the walk found the nested commands
    missing = [" ".join(p) for p, parser in leaves.items()
               if p not in NO_FIGURES and "--json" not in parser._option_string_actions]
    assert not missing, f"commands without --json: {missing}"


def _janus(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "janusd.cli", *argv], capture_output=True, text=True, timeout=240,
                          env=env)


def _last_json(out: str) -> dict:
    value = json.loads(out.strip().splitlines()[-1])
    assert isinstance(value, dict)
    return value


def test_cheap_commands_print_one_json_object_last(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    synth = _last_json(_janus("trace", "synth", "--apps", "8", "--hours", "0.02", "--seed", "3", "--out", str(trace),
                              "--json").stdout)
    assert synth["out"] == str(trace) and 1 <= synth["apps"] <= 8 and synth["requests"] > 0
    stats = _last_json(_janus("trace", "stats", str(trace), "--json").stdout)
    assert stats["requests"] == synth["requests"]
    half = tmp_path / "half.csv"
    sample = _last_json(_janus("trace", "sample", str(trace), "--fraction", "0.5", "--out", str(half), "--json").stdout)
    assert 0 < sample["requests"] < synth["requests"]
    bench = _last_json(_janus("bench", "dispatch", "--max-jobs", "100", "--json").stdout)
    assert [(c["jobs"], c["machines"]) for c in bench["cases"]] == [(100, 8), (100, 64)]


def test_janusd_is_janus_serve() -> None:
    janusd = Path(sys.executable).parent / "janusd"
    alias = subprocess.run([str(janusd), "--print-config", "--port", "9177"], capture_output=True, text=True,
                           timeout=60)
    direct = _janus("serve", "--print-config", "--port", "9177")
    assert alias.returncode == direct.returncode == 0, alias.stderr + direct.stderr
    assert alias.stdout == direct.stdout and 'port = 9177' in alias.stdout


def test_generate_bad_checkpoint_and_over_long_prompt_are_documented_errors(tmp_path: Path) -> None:
    from janusd.engine.checkpoint.demo import make_demo

    ck = make_demo(tmp_path / "ck", "llama", "tiny")
    env = dict(os.environ, JANUSD_CACHE_DIR=str(tmp_path / "cache"))
    max_pos = json.loads((ck / "config.json").read_text())["max_position_embeddings"]
    long = _janus("generate", "--model", str(ck), "--prompt", "hello world " * max_pos, "--max-tokens", "4",
                  "--threads", "1", "--json", env=env)
    assert long.returncode == 2 and long.stdout == ""
    assert long.stderr.startswith("janus generate: prompt: ") and f"exceed max_model_len {max_pos}" in long.stderr
    (ck / "tokenizer.json").unlink()
    broken = _janus("generate", "--model", str(ck), "--prompt", "hi", "--json", env=env)
    assert broken.returncode == 2 and broken.stdout == ""
    assert f"{ck / 'tokenizer.json'}: missing file" in broken.stderr
    missing = _janus("generate", "--model", str(tmp_path / "nope"), "--prompt", "hi", "--json", env=env)
    assert missing.returncode == 2 and missing.stdout == "" and "no such checkpoint" in missing.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_for_loads_over_a_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from janusd.engine.checkpoint.demo import make_demo
    from janusd.engine.loader import open_checkpoint

    ck = open_checkpoint(make_demo(tmp_path / "ck", "llama", "tiny"))
    shapes = {n: s for n, (s, _) in ck.tensor_specs().items()}
    per_tensor = 1.3 / len(shapes)

    def load(delay: float) -> str:
        term = _Terminal()
        monkeypatch.setattr(sys, "stderr", term)

        def dest(name: str) -> torch.Tensor:
            time.sleep(delay)
            return torch.empty(shapes[name])

        ck.load_into(dest, torch.float32)
        monkeypatch.undo()
        return term.getvalue()

    assert load(0.0) == ""
    slow = load(per_tensor)
    assert "loading ck" in slow and "tensor" in slow


@pytest.mark.slow
def test_generate_chat_json_with_the_real_model() -> None:
    """The documented headline: SmolLM2 in float32, greedy, through the chat template."""
    r = _janus("generate", "--model", "builtin:smollm2-135m-instruct", "--prompt", "What is the capital of France?",
               "--chat", "--max-tokens", "24", "--threads", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = _last_json(r.stdout)
    assert out["text"] == "The capital of France is Paris."
    assert out["completion_tokens"] == len(out["token_ids"]) and out["token_ids"][-1] == 2  # ends on <|im_end|>
    assert out["prompt_tokens"] > 20 and out["finish_reason"] == "stop"


def test_bench_engine_json_figures_are_consistent(tmp_path: Path) -> None:
    """A small `janus bench engine` run: the JSON last line carries the documented figures,
    and the derived ones follow from the measured ones."""
    env = dict(os.environ, JANUSD_CACHE_DIR=str(tmp_path))
    r = _janus("bench", "engine", "--skip-smollm2", "--batches", "1,2", "--decode-steps", "2", "--prompt-len", "8",
               "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = _last_json(r.stdout)
    demo = out["demo-llama-small"]
    assert set(demo) >= {"b1", "b2", "weight_MB_per_token", "b1_roofline_tok_s", "b1_roofline_ratio",
                         "outside_forward_share"}
    roofline = out["read_GB_s"] * 1e3 / demo["weight_MB_per_token"]
    assert demo["b1_roofline_tok_s"] == pytest.approx(roofline, rel=0.02)
    assert demo["b1_roofline_ratio"] == pytest.approx(demo["b1"]["decode_tok_s"] / demo["b1_roofline_tok_s"], rel=0.01)
    # The definition: (weight bytes / memcpy rate) / measured batch-1 step time.
    memcpy_ratio = (demo["weight_MB_per_token"] * 1e6 / (out["memcpy_GB_s"] * 1e9)) / (demo["b1"]["decode_step_ms"] / 1e3)
    assert demo["b1_roofline_ratio_memcpy"] == pytest.approx(memcpy_ratio, rel=0.03)
    assert demo["b1_roofline_tok_s_memcpy"] == pytest.approx(out["memcpy_GB_s"] * 1e3 / demo["weight_MB_per_token"],
                                                             rel=0.02)
    assert 0.0 <= demo["outside_forward_share"] < 1.0
    co = out["colocation"]
    for n in (2, 4):
        for mode in ("loop", "threads"):
            mean_alone = sum(co["alone_tok_s"][:n]) / n
            ratio = co[f"{n}_models_{mode}_tok_s"] / mean_alone
            assert co[f"{n}_models_{mode}_ratio"] == pytest.approx(ratio, rel=0.01)
    assert co["kv_pages_after"] == 0 and co["pool_free_after_unload"] is True


def test_building_the_parser_loads_no_heavy_library():
    """`janus` builds every subcommand's parser (benchmarks included) on each start, in
    each replay process too: a module-level torch or scipy import there made `janus --help`
    take 3 s and the replayer's processes fall a second behind their schedule."""
    import subprocess
    import sys

    code = ("import sys\nfrom janusd.cli import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in ('torch', 'scipy.optimize', 'sklearn', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout

"""Demo checkpoints: small, randomly initialised, deterministic, in exactly the HF format.

They let tests, benchmarks and the default run exercise the whole path (tokenizer,
chat template, loader, forward) without downloading a model. The tokenizer is a real
byte-level BPE trained by ``tokenizers`` on text shipped with the package
(engine/data/demo_corpus.txt), so prompts tokenize like English, not like noise.
Weights are normal(0, 0.02) from a seeded generator and norms are ones: the same
arguments always give byte-identical files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from janusd.engine.checkpoint.base import CheckpointError, ModelArch, expected_tensor_shapes

DEMO_ARCHS = ("llama", "qwen2", "qwen3")
DEMO_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 512, "max_pos": 2048},
    "small": {"hidden": 256, "layers": 4, "heads": 8, "kv_heads": 4, "intermediate": 512, "vocab": 2048, "max_pos": 4096},
}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
CORPUS = Path(__file__).resolve().parent.parent / "data" / "demo_corpus.txt"


DEMO_STEPS = ("tokenizer", "weights", "written")


def parse_demo_name(name: str) -> tuple[str, str]:
    """'llama-tiny' -> ('llama', 'tiny'); CheckpointError for anything else."""
    arch, _, size = name.partition("-")
    if arch not in DEMO_ARCHS or size not in DEMO_SIZES:
        raise CheckpointError(
            f"bad demo spec 'demo:{name}': expected demo:ARCH-SIZE with ARCH in {'|'.join(DEMO_ARCHS)} "
            f"and SIZE in {'|'.join(DEMO_SIZES)}"
        )
    return arch, size


def demo_arch(arch: str, size: str, dtype: str = "float32") -> ModelArch:
    s = DEMO_SIZES[size]
    return ModelArch(
        architecture=arch,
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["hidden"] // s["heads"],
        rms_norm_eps=1e-6,
        rope_theta=10000.0 if arch == "llama" else 1000000.0,
        # llama-small exercises llama3 rope scaling; the others use plain RoPE
        rope_scaling=(
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 512,
            }
            if (arch, size) == ("llama", "small")
            else None
        ),
        max_position_embeddings=s["max_pos"],
        tie_word_embeddings=arch == "qwen2",  # one tied family, like the small Qwen2 models
        attention_bias=arch == "qwen2",
        qk_norm=arch == "qwen3",
        torch_dtype=dtype,
    )


def _config_json(a: ModelArch) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": [_CLASS[a.architecture]],
        "model_type": a.architecture,
        "vocab_size": a.vocab_size,
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_hidden_layers": a.num_hidden_layers,
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": a.max_position_embeddings,
        "rms_norm_eps": a.rms_norm_eps,
        "rope_theta": a.rope_theta,
        "rope_scaling": a.rope_scaling,
        "tie_word_embeddings": a.tie_word_embeddings,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": a.torch_dtype,
        "attention_dropout": 0.0,
    }
    if a.architecture in ("llama", "qwen3"):
        cfg["attention_bias"] = False
    if a.architecture == "llama":
        cfg["mlp_bias"] = False
    if a.architecture in ("qwen2", "qwen3"):
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=a.num_hidden_layers)
    return cfg


def train_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE trained on the shipped corpus (deterministic for a given corpus)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def random_weights(a: ModelArch, seed: int) -> dict[str, Any]:
    import torch

    dtype = getattr(torch, a.torch_dtype)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    for name, shape in expected_tensor_shapes(a).items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=dtype)
        else:
            out[name] = (torch.randn(shape, generator=gen, dtype=torch.float32) * 0.02).to(dtype)
    return out


def make_demo(out_dir: Path, arch: str, size: str, dtype: str = "float32", seed: int = 0,
              on_step: Callable[[str], None] | None = None) -> Path:
    """Write a demo checkpoint into ``out_dir`` (created; must be empty if it exists).

    ``on_step(name)`` is called after each of the DEMO_STEPS, for a progress bar."""
    step = on_step or (lambda _name: None)
    import torch
    from safetensors.torch import save_file

    if arch not in DEMO_ARCHS or size not in DEMO_SIZES:
        parse_demo_name(f"{arch}-{size}")
    if dtype not in ("float32", "float16", "bfloat16") or not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise CheckpointError(f"demo dtype must be float32, float16 or bfloat16, got {dtype!r}")
    out_dir = Path(out_dir)
    a = demo_arch(arch, size, dtype)
    tok = train_tokenizer(a.vocab_size)
    step("tokenizer")
    if tok.get_vocab_size() > a.vocab_size:
        raise CheckpointError(f"demo tokenizer has {tok.get_vocab_size()} tokens, more than vocab_size {a.vocab_size}")
    from safetensors import SafetensorError

    try:
        _write_demo(out_dir, a, tok, seed, save_file, step)
    except (OSError, SafetensorError) as e:  # unwritable, not a directory, disk full: the CLI says so
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CheckpointError(f"{out_dir}: cannot write the demo checkpoint: {why}") from e
    return out_dir


def _write_demo(out_dir: Path, a: ModelArch, tok: Any, seed: int, save_file: Any,
                step: Callable[[str], None]) -> None:
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise CheckpointError(f"{out_dir}: directory is not empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "config.json").write_text(json.dumps(_config_json(a), indent=2) + "\n")
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": a.max_position_embeddings,
        "chat_template": CHATML_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    gen_cfg = {"bos_token_id": 0, "eos_token_id": [2, 0], "pad_token_id": 0, "do_sample": True,
               "temperature": 0.7, "top_p": 0.9, "top_k": 50}
    (out_dir / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    weights = random_weights(a, seed)
    step("weights")
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    step("written")


def ensure_demo(cache_dir: Path, arch: str, size: str) -> Path:
    """The cached demo checkpoint, made on first use: built in a temp dir, then renamed into place
    atomically, so concurrent callers either see a complete checkpoint or build their own and lose
    the rename race harmlessly."""
    target = Path(cache_dir) / "demo" / f"{arch}-{size}"
    if (target / "model.safetensors").exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{arch}-{size}.", dir=target.parent))
    except OSError as e:
        raise CheckpointError(f"{target.parent}: cannot create the demo checkpoint cache: {e.strerror or e}") from e
    from tqdm import tqdm

    try:
        # a progress bar on a terminal (`make serve`'s first start); quiet off a terminal
        with tqdm(total=len(DEMO_STEPS), desc=f"making demo checkpoint {arch}-{size}", unit="step",
                  disable=None, leave=False) as bar:
            make_demo(tmp, arch, size, on_step=lambda name: (bar.set_postfix_str(name), bar.update(1)))
        try:
            os.rename(tmp, target)
        except OSError as e:
            if not (target / "model.safetensors").exists():  # not a lost race: a leftover or a file
                raise CheckpointError(f"{target}: cannot install the demo checkpoint there ({e.strerror or e}); remove it") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target

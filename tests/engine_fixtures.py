"""Helpers for the engine tests: tiny HF checkpoints written by `transformers` itself
(the reference implementation), with a real byte-level BPE tokenizer, and the real
xTensor device pool."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

# One intra-op thread: on the shared 2-core CI VM two OpenMP threads wait at barriers for
# a descheduled peer and small matmuls get ~300x slower.
torch.set_num_threads(1)

VOCAB = 512
_TOKENIZER_CACHE: dict[int, Path] = {}


def _tokenizer_file(tmp_root: Path) -> Path:
    if VOCAB not in _TOKENIZER_CACHE:
        from janusd.engine.checkpoint.demo import train_tokenizer

        p = tmp_root / "tokenizer.json"
        train_tokenizer(VOCAB).save(str(p))
        _TOKENIZER_CACHE[VOCAB] = p
    return _TOKENIZER_CACHE[VOCAB]


def cuda_available() -> bool:
    """A CUDA driver (libcuda.so.1, what xTensor's VMM backend loads) and a device torch sees."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return torch.cuda.is_available()


def tiny_config(arch: str, **over: Any) -> Any:
    import transformers as tf

    common: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                  rms_norm_eps=1e-6, tie_word_embeddings=False)
    common.update(over)
    cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config}[arch]
    if arch == "qwen3":
        common.setdefault("head_dim", 16)
    return cls(**common)


def write_hf_checkpoint(out: Path, arch: str, seed: int = 0, **over: Any) -> tuple[Path, Any]:
    """save_pretrained a random tiny model of `arch` into `out`; returns (dir, hf_model)."""
    import transformers as tf

    cfg = tiny_config(arch, **over)
    cls = {"llama": tf.LlamaForCausalLM, "mistral": tf.MistralForCausalLM, "qwen2": tf.Qwen2ForCausalLM,
           "qwen3": tf.Qwen3ForCausalLM}[arch]
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():  # norms are ones at init; make them matter
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or n.endswith(".bias"):
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if n.endswith("norm.weight") else 0.0))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    shutil.copy(_tokenizer_file(out.parent), out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "add_bos_token": False, "add_eos_token": False,
    }))
    return out, model


def weight_pages(ckpt: str, page_size: int) -> int:
    """Pages the checkpoint's weights take on a pool of `page_size` pages (measured by loading it)."""
    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine

    probe = DeviceEngine(kind="cpu", memory_bytes=8 << 20, page_size=page_size, kv_cache_pages=(0, 0))
    probe.load_model(ModelConfig(name="probe", checkpoint=ckpt, kv_cache_mib=1), EngineConfig(block_size=4))
    n = probe.pool.stats().pages_by_owner["probe"]
    probe.unload_model("probe")
    return n


def advance(sched: Any, out: Any) -> list[Any]:
    """Scheduler-only tests: complete() the step and append a token to every sequence that
    sampled; finished sequences (max_tokens reached) are removed and returned."""
    sched.complete(out)
    done = []
    for it in out.items:
        if it.samples:
            it.seq.tokens.append(7)
            if it.seq.num_output >= it.seq.params.max_tokens:
                sched.remove(it.seq)
                done.append(it.seq)
    return done

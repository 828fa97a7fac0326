"""config.json / tokenizer files of an HF checkpoint dir -> ModelArch, Tokenizer, generation defaults.

Handles both config dialects in the wild: transformers < 5 (``rope_theta`` +
``rope_scaling``, ``torch_dtype``) and transformers 5 (``rope_parameters`` holding
``rope_theta``, ``dtype``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from janusd.engine.checkpoint.base import CheckpointError, ModelArch, validate_arch
from janusd.engine.tokenizer import Tokenizer

ARCH_BY_CLASS = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
GENERATION_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "do_sample", "max_new_tokens")


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable JSON: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "rope_type" not in params and all(isinstance(v, dict) for v in params.values()):
        raise CheckpointError("per-layer-type rope_parameters are not supported")
    scaling = dict(params) if isinstance(params, dict) else (dict(cfg["rope_scaling"]) if cfg.get("rope_scaling") else None)
    theta = cfg.get("rope_theta")
    if scaling is not None:
        theta = scaling.pop("rope_theta", theta)
        if "type" in scaling and "rope_type" not in scaling:
            scaling["rope_type"] = scaling.pop("type")
        if scaling.get("rope_type", "default") == "default":
            scaling = None
    return float(theta if theta is not None else 10000.0), scaling


def arch_from_config(cfg: dict[str, Any], where: Path) -> ModelArch:
    classes = cfg.get("architectures") or []
    arch_name = next((ARCH_BY_CLASS[c] for c in classes if c in ARCH_BY_CLASS), None)
    if arch_name is None:
        if classes:
            raise CheckpointError(
                f"{where}: unsupported architecture {classes[0]!r} (supported: {', '.join(ARCH_BY_CLASS)})"
            )
        model_type = cfg.get("model_type")
        if model_type not in ARCH_BY_CLASS.values():
            raise CheckpointError(f"{where}: unsupported model_type {model_type!r}")
        arch_name = str(model_type)
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{where}: unsupported hidden_act {act!r} (only silu)")
    bias = bool(cfg.get("attention_bias", arch_name == "qwen2"))
    if arch_name == "qwen2":
        bias = True  # Qwen2 always has q/k/v bias, whatever the config says
    elif bias or cfg.get("mlp_bias"):
        raise CheckpointError(f"{where}: attention_bias/mlp_bias on {arch_name} (o_proj/mlp bias) is not supported")
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        theta, scaling = _rope(cfg)
        sliding = cfg.get("sliding_window")
        if arch_name in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
            sliding = None
        arch = ModelArch(
            architecture=arch_name,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bias,
            qk_norm=arch_name == "qwen3",
            sliding_window=int(sliding) if sliding else None,
            torch_dtype=str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"),
        )
    except KeyError as e:
        raise CheckpointError(f"{where}: missing key {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: bad value: {e}") from e
    validate_arch(arch, str(where))
    return arch


def _token_str(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _eos_list(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int)]
    return []


def load_hf_tokenizer(root: Path, extra_eos: list[int]) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    tj = root / "tokenizer.json"
    if not tj.exists():
        raise CheckpointError(f"{tj}: missing file (only tokenizer.json tokenizers are supported)")
    try:
        backend = Backend.from_file(str(tj))
    except Exception as e:  # the Rust side raises plain Exception
        raise CheckpointError(f"{tj}: unreadable tokenizer: {e}") from e
    tc = read_json(root / "tokenizer_config.json") if (root / "tokenizer_config.json").exists() else {}
    template: Any = tc.get("chat_template")
    if isinstance(template, list):
        template = {t["name"]: t["template"] for t in template if isinstance(t, dict) and "name" in t}
    if template is None and (root / "chat_template.jinja").exists():
        template = (root / "chat_template.jinja").read_text(encoding="utf-8")
    if template is None and (root / "chat_template.json").exists():
        template = read_json(root / "chat_template.json").get("chat_template")
    special = {k: _token_str(tc.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    return Tokenizer(
        backend,
        bos_token=special["bos_token"],
        eos_token=special["eos_token"],
        extra_eos_token_ids=extra_eos,
        chat_template=template,
        special_tokens_map=special,
    )


def generation_defaults(root: Path, cfg: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """(defaults from generation_config.json, eos ids from it or config.json)."""
    gc = read_json(root / "generation_config.json") if (root / "generation_config.json").exists() else {}
    defaults = {k: gc[k] for k in GENERATION_KEYS if k in gc}
    eos = _eos_list(gc.get("eos_token_id")) or _eos_list(cfg.get("eos_token_id"))
    defaults["eos_token_id"] = eos
    return defaults, eos

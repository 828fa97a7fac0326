"""What the simulator serves: model presets, default SLOs, and `--models FILE`.

A trace names a model per request; the simulator resolves the name to a `SimModel`: the
costs the performance model needs (weight bytes, FLOPs per token, KV bytes per token),
a tensor-parallel degree and SLOs. Dense presets are HF config.json figures turned into
hw/model_spec.py's ModelSpec (the same counting rules the oracle's roofline prior uses);
deepseek-v3's figures come the same way from its config (ModelSpec counts multi-head latent
attention and its experts: every expert is stored, only the routed ones are multiplied by).

Default SLOs by size (a trace's per-request SLO columns win over them):
  <= 4 B parameters: TTFT 1000 ms, TPOT 50 ms   (qwen3-1.7b)
  <= 16 B:           TTFT 1500 ms, TPOT 75 ms   (qwen3-8b, llama3-8b)
  <= 100 B:          TTFT 3000 ms, TPOT 100 ms  (qwen3-32b, llama3-70b)
  larger:            TTFT 5000 ms, TPOT 150 ms  (deepseek-v3)

`--models FILE` is TOML, one table per name:
    [qwen-chat]                 # the model name the trace uses
    preset = "qwen3-8b"         # or: config = "path/to/config.json" (HF keys)
    tp = 2                      # optional: devices per instance (default: the preset's)
    ttft_slo_ms = 800           # optional
    tpot_slo_ms = 60            # optional
Every problem names the file, the table and the key.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec

from janusd.hw.model_spec import ModelSpec


class SpecError(ValueError):
    """A model name, preset or `--models` file the simulator cannot use; says why."""


@dataclass(frozen=True)
class SimModel:
    """The per-instance costs of a model; FLOPs and bytes are whole-model figures (an
    instance of tp devices splits them evenly)."""

    name: str
    params: float  # stored parameters
    weight_bytes: float
    matmul_flops_per_token: float  # 2 x parameters a token multiplies by (active experts only)
    attn_flops_per_ctx: float  # attention FLOPs per (new token, context token) pair
    kv_bytes_per_token: float
    tp: int = 1
    ttft_slo_ms: float = 1000.0
    tpot_slo_ms: float = 50.0
    max_model_len: int = 131072
    spec: ModelSpec | None = None  # the shape the oracle's roofline prior reads (None: figures only)
    # bytes a tp group all-reduces per token (2 per layer of one hidden vector: ModelSpec's);
    # perfmodel.comm_s charges them over the device link when tp > 1
    allreduce_bytes_per_token: float = 0.0
    # collectives per engine step of a tp group (ModelSpec.tp_collectives_per_step: 2 per layer + 3),
    # each paying the link's latency (hw/spec.py tp_comm_s)
    collectives_per_step: float = 0.0

    @classmethod
    def from_spec(cls, name: str, spec: ModelSpec, tp: int = 1, max_model_len: int = 131072) -> SimModel:
        ttft, tpot = default_slo_ms(spec.params)
        return cls(name=name, params=float(spec.params), weight_bytes=float(spec.weight_bytes),
                   matmul_flops_per_token=2.0 * spec.matmul_params,
                   attn_flops_per_ctx=float(spec.attn_flops_per_ctx),
                   kv_bytes_per_token=float(spec.kv_bytes_per_token), tp=tp, ttft_slo_ms=ttft, tpot_slo_ms=tpot,
                   max_model_len=max_model_len, spec=spec,
                   allreduce_bytes_per_token=float(spec.allreduce_bytes_per_token),
                   collectives_per_step=float(spec.tp_collectives_per_step))


def default_slo_ms(params: float) -> tuple[float, float]:
    """(TTFT, TPOT) in ms by model size; see the module doc."""
    if params <= 4e9:
        return 1000.0, 50.0
    if params <= 16e9:
        return 1500.0, 75.0
    if params <= 100e9:
        return 3000.0, 100.0
    return 5000.0, 150.0


def _dense(hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tied: bool,
           head_dim: int | None = None) -> ModelSpec:
    cfg: dict[str, Any] = {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                           "num_key_value_heads": kv, "intermediate_size": inter, "vocab_size": vocab,
                           "tie_word_embeddings": tied, "torch_dtype": "bfloat16"}
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    return ModelSpec.from_config(cfg)


# HF config.json figures of the public checkpoints (Qwen/Qwen3-*, meta-llama/Meta-Llama-3-*).
_DENSE: dict[str, tuple[ModelSpec, int, int]] = {  # name -> (spec, tp, context)
    "qwen3-1.7b": (_dense(2048, 28, 16, 8, 6144, 151936, True, 128), 1, 40960),
    "qwen3-8b": (_dense(4096, 36, 32, 8, 12288, 151936, False, 128), 1, 40960),
    "qwen3-32b": (_dense(5120, 64, 64, 8, 25600, 151936, False, 128), 2, 40960),
    "llama3-8b": (_dense(4096, 32, 32, 8, 14336, 128256, False), 1, 8192),
    "llama3-70b": (_dense(8192, 80, 64, 8, 28672, 128256, False), 4, 8192),
}

# DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): 61 layers of hidden 7168, MLA (q_lora_rank
# 1536, kv_lora_rank 512, q/k dim 128 + 64 rope, v dim 128, 128 heads), the first 3 layers
# dense (intermediate 18432), the other 58 of 256 routed experts (8 per token) plus 1 shared
# (intermediate 2048 each); weights stored in float8, activations and the latent KV in
# bfloat16. ModelSpec counts 671 B stored and 37 B multiplied per token from these, as the
# tech report gives. TP 16 as in the paper's §8 fork figures.
_DEEPSEEK_V3_CONFIG: dict[str, Any] = {
    "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "intermediate_size": 18432, "vocab_size": 129280, "tie_word_embeddings": False,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1, "moe_intermediate_size": 2048,
    "first_k_dense_replace": 3,
}  # fmt: skip
_DEEPSEEK_V3 = SimModel.from_spec(
    "deepseek-v3", msgspec.structs.replace(ModelSpec.from_config(_DEEPSEEK_V3_CONFIG, dtype="float8"), activation_bytes=2),
    tp=16, max_model_len=131072)


def presets() -> dict[str, SimModel]:
    """Every preset by name."""
    out = {name: SimModel.from_spec(name, spec, tp, ctx) for name, (spec, tp, ctx) in _DENSE.items()}
    out["deepseek-v3"] = _DEEPSEEK_V3
    return out


PRESET_NAMES = tuple(sorted([*_DENSE, "deepseek-v3"]))


def load_models_file(path: str | Path) -> dict[str, SimModel]:
    """Parse a `--models` TOML file (module doc); SpecError naming file, table and key."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as e:
        raise SpecError(f"{p}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{p}: not valid TOML: {e}") from None
    known = presets()
    out: dict[str, SimModel] = {}
    for name, table in data.items():
        where = f"{p}: [{name}]"
        if not isinstance(table, dict):
            raise SpecError(f"{where}: expected a table (preset = ... or config = ...)")
        extra = set(table) - {"preset", "config", "tp", "ttft_slo_ms", "tpot_slo_ms", "max_model_len"}
        if extra:
            raise SpecError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
        if ("preset" in table) == ("config" in table):
            raise SpecError(f"{where}: give exactly one of preset = NAME or config = PATH")
        if "preset" in table:
            base = known.get(str(table["preset"]))
            if base is None:
                raise SpecError(f"{where}: unknown preset {table['preset']!r} (known: {', '.join(PRESET_NAMES)})")
        else:
            cfg_path = (p.parent / str(table["config"])).resolve()
            try:
                cfg = json.loads(cfg_path.read_text())
                spec = ModelSpec.from_config(cfg)
            except OSError as e:
                raise SpecError(f"{where}: config {cfg_path}: cannot read: {e.strerror or e}") from None
            except (json.JSONDecodeError, ValueError) as e:
                raise SpecError(f"{where}: config {cfg_path}: {e}") from None
            base = SimModel.from_spec(name, spec, 1, int(cfg.get("max_position_embeddings", 131072)))
        fields: dict[str, Any] = {"name": name}
        for key, kind in (("tp", int), ("ttft_slo_ms", float), ("tpot_slo_ms", float), ("max_model_len", int)):
            if key in table:
                v = table[key]
                ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                if not ok or (kind is int and not isinstance(v, int)):
                    raise SpecError(f"{where}: {key} must be a positive {kind.__name__}, got {v!r}")
                fields[key] = kind(v)
        out[name] = replace(base, **fields)
    return out


def resolve(names: list[str] | tuple[str, ...], table: Mapping[str, SimModel] | None = None) -> dict[str, SimModel]:
    """Each trace model name -> its SimModel: from `table` (a --models file) when given,
    else from the presets. SpecError listing the known names for an unknown one."""
    known = dict(table) if table is not None else presets()
    out: dict[str, SimModel] = {}
    for n in names:
        m = known.get(n)
        if m is None:
            src = "the --models file" if table is not None else "the presets"
            raise SpecError(f"unknown model {n!r}: not in {src} (known: {', '.join(sorted(known))}); "
                            "map trace models with `janus trace remap` or a --models file")
        out[n] = m if m.name == n else replace(m, name=n)
    return out

"""ModelSpec counts mixtures of experts and multi-head latent attention (hw/model_spec.py),
checked against the parameter counts the model cards give, and against the dense rules
where the two must agree."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from janusd.hw.model_spec import ModelSpec
from janusd.sim.specs import presets

MIXTRAL_8X7B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "intermediate_size": 14336, "vocab_size": 32000, "tie_word_embeddings": False,
                "num_local_experts": 8, "num_experts_per_tok": 2, "torch_dtype": "bfloat16"}


def test_deepseek_v3_is_671b_stored_37b_active_with_a_576_wide_latent_kv():
    s = presets()["deepseek-v3"].spec
    assert s is not None
    assert s.params == pytest.approx(671e9, rel=0.002)  # the tech report: 671 B total
    assert s.matmul_params + s.vocab * s.hidden == pytest.approx(37e9, rel=0.03)  # 37 B activated (embedding in)
    assert s.weight_bytes == s.params  # float8
    assert s.kv_bytes_per_token == 61 * (512 + 64) * 2  # the latent and the rope key, bfloat16
    assert s.attn_flops_per_ctx == 2 * 61 * 128 * (192 + 128)
    assert s.allreduce_bytes_per_token == 2 * 61 * 7168 * 2


def test_mixtral_8x7b_is_46_7b_stored_12_9b_active():
    s = ModelSpec.from_config(MIXTRAL_8X7B)
    assert s.params == pytest.approx(46.7e9, rel=0.005)  # Mistral's model card
    assert s.matmul_params + s.vocab * s.hidden == pytest.approx(12.9e9, rel=0.01)
    assert s.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


@given(experts=st.integers(1, 16), hidden=st.integers(1, 64), inter=st.integers(1, 64), layers=st.integers(1, 8))
def test_routing_to_every_expert_multiplies_by_every_stored_mlp_weight(experts, hidden, inter, layers):
    """With k = E the token multiplies by all that is stored (but the input embedding, a
    lookup); a one-expert MoE without a router would be the dense model."""
    cfg = {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": 1, "intermediate_size": inter,
           "vocab_size": 7, "num_local_experts": experts, "num_experts_per_tok": experts}
    s = ModelSpec.from_config(cfg)
    norms = layers * 2 * hidden + hidden
    assert s.matmul_params == s.params - norms - s.vocab * s.hidden
    dense = ModelSpec.from_config({k: v for k, v in cfg.items() if "expert" not in k})
    assert s.params - layers * hidden * experts == dense.params + layers * (experts - 1) * 3 * hidden * inter


def test_a_dense_spec_keeps_its_stored_identity():
    """The new fields are left out of the builtins form at their defaults, so profiles and
    refit state written before them still name the same model."""
    s = ModelSpec.from_config({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                               "intermediate_size": 128, "vocab_size": 100})
    assert set(s.identity()) == {"layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab",
                                 "tied_embeddings", "dtype_bytes", "params", "weight_bytes", "kv_bytes_per_token"}
    assert ModelSpec(**{k: v for k, v in s.identity().items() if k in ModelSpec.__struct_fields__}) == s


@pytest.mark.parametrize("change, words", [({"num_experts_per_tok": 9}, "exceeds the 8 experts"),
                                           ({"first_k_dense_replace": 32}, "leaves no expert layer"),
                                           ({"num_experts_per_tok": None}, "num_experts_per_tok")])
def test_bad_expert_keys_are_named(change, words):
    with pytest.raises(ValueError, match=words):
        ModelSpec.from_config({**MIXTRAL_8X7B, **change})

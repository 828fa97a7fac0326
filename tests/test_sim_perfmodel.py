"""sim/specs.py and sim/perfmodel.py: presets, --models files, roofline monotonicity."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.hw import device_spec
from janusd.sim.perfmodel import PAGE_BYTES, PerfModel
from janusd.sim.specs import PRESET_NAMES, SpecError, load_models_file, presets, resolve

PM = PerfModel(device_spec("ascend-910c-die"))
MODELS = presets()


def test_presets_match_the_public_parameter_counts():
    # the model cards: Qwen3-8B 8.2 B, Llama-3-8B 8.0 B, Llama-3-70B 70.6 B, Qwen3-1.7B 1.7 B
    assert MODELS["qwen3-8b"].params == pytest.approx(8.19e9, rel=0.01)
    assert MODELS["llama3-8b"].params == pytest.approx(8.03e9, rel=0.01)
    assert MODELS["llama3-70b"].params == pytest.approx(70.55e9, rel=0.01)
    assert MODELS["qwen3-1.7b"].params == pytest.approx(1.72e9, rel=0.01)
    # Llama-3-8B: 32 layers x 8 kv heads x 128 x 2 (k, v) x 2 bytes
    assert MODELS["llama3-8b"].kv_bytes_per_token == 32 * 8 * 128 * 2 * 2
    assert MODELS["deepseek-v3"].tp == 16
    assert set(MODELS) == set(PRESET_NAMES)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(SpecError) as e:
        resolve(["gpt-5"])
    for name in PRESET_NAMES:
        assert name in str(e.value)


def test_models_file(tmp_path):
    cfg = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 512, "vocab_size": 1000, "torch_dtype": "bfloat16"}
    (tmp_path / "tiny.json").write_text(json.dumps(cfg))
    f = tmp_path / "m.toml"
    f.write_text('[chat]\npreset = "qwen3-8b"\ntp = 2\nttft_slo_ms = 700\n\n[tiny]\nconfig = "tiny.json"\n')
    table = load_models_file(f)
    got = resolve(["chat", "tiny"], table)
    assert got["chat"].tp == 2 and got["chat"].ttft_slo_ms == 700.0
    assert got["chat"].weight_bytes == MODELS["qwen3-8b"].weight_bytes
    assert got["tiny"].kv_bytes_per_token == 2 * 4 * 2 * 64 * 2
    with pytest.raises(SpecError, match="not in the --models file"):
        resolve(["qwen3-8b"], table)


@pytest.mark.parametrize("text, needle", [
    ('[a]\npreset = "nope"\n', "unknown preset 'nope'"),
    ('[a]\npreset = "qwen3-8b"\ntp = 0\n', "tp must be a positive int"),
    ('[a]\npreset = "qwen3-8b"\nconfig = "x.json"\n', "exactly one of"),
    ('[a]\npreset = "qwen3-8b"\ncolour = 1\n', "unknown key(s) colour"),
    ('[a]\nconfig = "missing.json"\n', "cannot read"),
    ("a = [", "not valid TOML"),
])
def test_bad_models_file_says_why(tmp_path, text, needle):
    f = tmp_path / "m.toml"
    f.write_text(text)
    with pytest.raises(SpecError) as e:
        load_models_file(f)
    assert needle in str(e.value) and str(f) in str(e.value)


names = st.sampled_from(sorted(MODELS))


@settings(max_examples=60, deadline=None)
@given(names, st.integers(1, 512), st.integers(1, 512), st.integers(1, 8000))
def test_decode_step_grows_with_batch(name, b1, b2, ctx):
    m = MODELS[name]
    lo, hi = sorted((b1, b2))
    assert PM.decode_step_s(m, lo, ctx) <= PM.decode_step_s(m, hi, ctx)


@settings(max_examples=60, deadline=None)
@given(names, st.integers(1, 32000), st.integers(1, 32000))
def test_prefill_grows_with_tokens(name, t1, t2):
    m = MODELS[name]
    lo, hi = sorted((t1, t2))
    assert PM.prefill_s(m, lo) <= PM.prefill_s(m, hi)


def test_roofline_regimes_and_sharing():
    m = MODELS["llama3-8b"]
    dev = PM.device
    # a one-sequence decode step is memory bound: weights / (bandwidth x efficiency) + overhead
    assert PM.decode_step_s(m, 1, 0) == pytest.approx(
        PM.overhead_s + (m.weight_bytes + m.kv_bytes_per_token) / (dev.hbm_bw * PM.bandwidth_eff))
    # a long prefill is compute bound
    t = 8000
    f, b = PM.work(m, t, t * (t + 1) / 2, 0, 0)
    assert f / (dev.peak_flops * PM.compute_eff) > b / (dev.hbm_bw * PM.bandwidth_eff)
    # two co-located models sharing a step take longer than either alone, less than both in turn
    w1 = PM.work(m, 0, 0, 16, 16 * 1000)
    w2 = PM.work(MODELS["qwen3-8b"], 0, 0, 16, 16 * 1000)
    both = PM.step_s(w1[0] + w2[0], w1[1] + w2[1])
    assert max(PM.step_s(*w1), PM.step_s(*w2)) < both < PM.step_s(*w1) + PM.step_s(*w2)
    # tp halves the per-device work
    m2 = type(m)(**{**m.__dict__, "tp": 2})
    assert PM.work(m2, 100, 5050, 4, 400)[1] == pytest.approx(PM.work(m, 100, 5050, 4, 400)[1] / 2)


def test_kv_capacity_from_pages_left_after_weights():
    m = MODELS["llama3-8b"]
    free = PM.device.hbm_bytes * PM.usable_frac - m.weight_bytes
    assert PM.kv_capacity_tokens(m, [m]) == int(int(free // PAGE_BYTES) * PAGE_BYTES // m.kv_bytes_per_token)
    # a neighbour takes pages: less KV each; a too-large neighbour does not fit
    q = MODELS["qwen3-8b"]
    assert PM.kv_capacity_tokens(m, [m, q]) < PM.kv_capacity_tokens(m, [m])
    assert PM.weights_fit([m, q])
    assert not PM.weights_fit([MODELS["qwen3-32b"], MODELS["qwen3-32b"], m, q])
    assert not PM.weights_fit([type(m)(**{**MODELS["llama3-70b"].__dict__, "tp": 1})])

"""hw/: model costs counted from a config, device presets, the cached cpu peaks."""

from __future__ import annotations

import json

import msgspec
import pytest

from janusd.engine.checkpoint.demo import _config_json, demo_arch
from janusd.hw import ModelSpec, device_spec
from janusd.hw import cpu_peaks

SMOLLM2_135M = {  # config.json of HuggingFaceTB/SmolLM2-135M-Instruct (the keys used)
    "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}


def test_smollm2_parameter_count_and_kv_bytes():
    s = ModelSpec.from_config(SMOLLM2_135M)
    assert s.params == 134_515_008  # the published parameter count of SmolLM2-135M
    assert s.weight_bytes == 2 * 134_515_008
    assert s.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2  # K and V, layers, kv heads, head_dim, bf16
    assert ModelSpec.from_config(SMOLLM2_135M, dtype="float32").weight_bytes == 4 * 134_515_008


def test_engine_arch_and_config_json_give_the_same_spec():
    for arch, size in (("llama", "tiny"), ("qwen3", "small")):
        a = demo_arch(arch, size)
        assert ModelSpec.from_config(msgspec.to_builtins(a)) == ModelSpec.from_config(_config_json(a))


def test_flops_match_a_brute_force_count():
    s = ModelSpec.from_config(SMOLLM2_135M)
    per_ctx = 4 * s.layers * s.heads * s.head_dim
    # prefill of 5 tokens after 3 cached ones: token i (1-based) attends to 3 + i positions;
    # every token goes through the decoder layers, only the last (the one that samples) through the LM head
    h, d = s.hidden, s.head_dim
    layers = s.layers * (h * s.heads * d * 2 + h * s.kv_heads * d * 2 + 3 * h * s.intermediate)  # q, o; k, v; MLP
    head = s.vocab * s.hidden
    brute = sum(2 * layers + per_ctx * (3 + i) for i in range(1, 6)) + 2 * head
    assert s.prefill_flops(5, context=3) == pytest.approx(brute)
    # a decode step of 2 sequences at contexts 10 and 20
    assert s.decode_step_flops(2, 30) == pytest.approx(2 * 2 * s.matmul_params + per_ctx * 30)
    assert s.decode_step_bytes(2, 30) == s.weight_bytes + s.kv_bytes_per_token * 32


@pytest.mark.parametrize("cfg,msg", [({**SMOLLM2_135M, "hidden_size": 0}, "hidden_size"),
                                     ({k: v for k, v in SMOLLM2_135M.items() if k != "vocab_size"}, "vocab_size"),
                                     ({**SMOLLM2_135M, "torch_dtype": "int3"}, "dtype")])
def test_bad_config_is_refused_by_name(cfg, msg):
    with pytest.raises(ValueError, match=msg):
        ModelSpec.from_config(cfg)


def test_presets_and_the_papers_links():
    die = device_spec("ascend-910c-die")
    assert (die.d2d_bw, die.h2d_bw) == (163.6e9, 59.0e9)
    assert device_spec("h200").hbm_bytes == 141e9 and device_spec("h100").hbm_bytes == 80e9
    assert device_spec("h100", hbm_bytes=40e9).hbm_bytes == 40e9
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        device_spec("tpu")


def test_cpu_peaks_are_measured_once_and_a_bad_or_foreign_cache_is_replaced(tmp_path, monkeypatch):
    calls = []

    def fake_measure(threads=1, seconds=0.3):
        calls.append(threads)
        return {"peak_flops": 1e11, "mem_bw": 2e10}

    monkeypatch.setattr(cpu_peaks, "measure", fake_measure)
    spec = device_spec("cpu", hbm_bytes=2**30, cache_dir=tmp_path)
    assert (spec.peak_flops, spec.hbm_bw, spec.hbm_bytes) == (1e11, 2e10, 2**30)
    device_spec("cpu", hbm_bytes=2**30, cache_dir=tmp_path)
    assert calls == [1]  # cached
    path = tmp_path / "hw" / "cpu-peaks.json"
    path.write_text("{not json")
    device_spec("cpu", cache_dir=tmp_path)
    assert calls == [1, 1]
    data = json.loads(path.read_text())
    data["machine"]["host"] = "another-host"
    path.write_text(json.dumps(data))
    device_spec("cpu", cache_dir=tmp_path)
    assert calls == [1, 1, 1]
    assert json.loads(path.read_text())["machine"] == cpu_peaks.machine_identity()


def test_host_time_per_step_adds_up_and_bad_figures_are_refused():
    spec = msgspec.structs.replace(device_spec("h100"), step_overhead_s=1e-3, layer_overhead_s=2e-4,
                                   seq_overhead_s=5e-5)
    assert spec.step_time_floor(30, 8) == pytest.approx(1e-3 + 30 * 2e-4 + 8 * 5e-5)
    assert spec.step_time_floor(4, 0) == pytest.approx(1e-3 + 4 * 2e-4)
    with pytest.raises(ValueError, match="seq_overhead_s must be a finite number >= 0"):
        msgspec.structs.replace(spec, seq_overhead_s=-1e-6).check()
    with pytest.raises(ValueError, match="step_overhead_s"):
        msgspec.structs.replace(spec, step_overhead_s=float("nan")).check()
    for name in ("h100", "h200", "ascend-910c-die"):  # documented estimates, not zero
        assert device_spec(name).step_time_floor(1, 1) > 0
    # a prefill: one step's floor for its one sequence, plus its prompt tokens through every layer
    pf = msgspec.structs.replace(spec, prefill_token_overhead_s=1.5e-4)
    assert pf.prefill_time_floor(30, 96) == pytest.approx(1e-3 + 30 * 2e-4 + 5e-5 + 30 * 96 * 1.5e-4)
    assert spec.prefill_time_floor(30, 96) == pytest.approx(spec.step_time_floor(30, 1))
    with pytest.raises(ValueError, match="prefill_token_overhead_s"):
        msgspec.structs.replace(spec, prefill_token_overhead_s=-1.0).check()


def test_cpu_host_time_is_probed_once_and_cached_beside_the_peaks(tmp_path, monkeypatch):
    peaks_calls, probe_calls = [], []

    def fake_measure(threads=1, seconds=0.3):
        peaks_calls.append(threads)
        return {"peak_flops": 1e11, "mem_bw": 2e10}

    def probe(threads, peaks):  # the engine's step_probe.measure, faked at the edge (hw/ never imports engine/)
        probe_calls.append((threads, peaks))
        return {"step_overhead_s": 1e-4, "layer_overhead_s": 2e-4, "seq_overhead_s": 3e-5,
                "prefill_token_overhead_s": 4e-5}

    monkeypatch.setattr(cpu_peaks, "measure", fake_measure)
    plain = device_spec("cpu", hbm_bytes=2**30, cache_dir=tmp_path)  # no probe: the plain roofline
    assert plain.step_time_floor(4, 1) == 0.0 and "no host time per step" in plain.source
    spec = device_spec("cpu", hbm_bytes=2**30, cache_dir=tmp_path, overhead_probe=probe)
    assert (spec.step_overhead_s, spec.layer_overhead_s, spec.seq_overhead_s) == (1e-4, 2e-4, 3e-5)
    assert probe_calls == [(1, {"peak_flops": 1e11, "mem_bw": 2e10})] and peaks_calls == [1]  # peaks reused
    again = device_spec("cpu", hbm_bytes=2**30, cache_dir=tmp_path, overhead_probe=probe)
    assert again == spec and len(probe_calls) == 1
    assert device_spec("cpu", hbm_bytes=2**30, cache_dir=tmp_path).layer_overhead_s == 2e-4  # cached: any caller

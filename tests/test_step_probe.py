"""engine/step_probe.py: the engine's host time per step, measured on the real engine."""

from __future__ import annotations

from janusd.engine import step_probe
from janusd.hw import device_spec
from daemon_harness import SHARED_CACHE


def test_probe_finds_a_cost_per_layer_and_per_sequence_on_the_real_engine():
    import msgspec

    peaks = {"peak_flops": 1e11, "mem_bw": 3e10}  # this VM's order; the roofline is a small part of a demo step
    over = step_probe.measure(1, peaks, "cpu", SHARED_CACHE)
    assert set(over) == {"step_overhead_s", "layer_overhead_s", "seq_overhead_s", "prefill_token_overhead_s"}
    assert all(v >= 0 for v in over.values())
    spec = msgspec.structs.replace(device_spec("h100"), **over)
    # a 4-layer demo model decodes one sequence in ~1.7 ms on this VM when quiet (bench/RESULTS.md
    # "engine"), ~0.4 ms of it roofline: the host time is most of a step, and batching adds to it
    assert 2e-4 < spec.step_time_floor(4, 1) < 0.05, over
    assert spec.step_time_floor(4, 16) > spec.step_time_floor(4, 1), over
    assert spec.step_time_floor(30, 1) > spec.step_time_floor(4, 1), over
    # a prefill's rows cost host time beyond their FLOPs on some machines, a few microseconds per
    # token and layer (4.8e-6 s measured with MKL products, bench/RESULTS.md "oracle"; 3.2e-6 s once
    # products of 2+ rows went through oneDNN), and none on others: on the Zen 5 VM of 2026-12-06
    # a prefill ran faster than its FLOPs at the 512^3 matmul peak and the fit was 0. What must
    # hold on any machine: never negative, never a step's worth per token ...
    assert 0.0 <= over["prefill_token_overhead_s"] < 2e-3, over


def test_the_probed_figures_predict_a_prefill_they_were_not_fitted_on():
    """... and the prior's prefill time from the probed figures (host floor + roofline at the
    machine's measured peaks) lands within 3x of a real prefill of a length the probe never
    ran (96 tokens; it fits 32 and 192)."""
    import msgspec

    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.loader import open_checkpoint
    from janusd.hw import cpu_peaks
    from janusd.hw.model_spec import ModelSpec

    peaks = cpu_peaks.measure(1)
    spec = msgspec.structs.replace(device_spec("h100"), peak_flops=peaks["peak_flops"], hbm_bw=peaks["mem_bw"],
                                   **step_probe.measure(1, peaks, "cpu", SHARED_CACHE))
    ck = open_checkpoint("demo:llama-small", SHARED_CACHE)
    model = ModelSpec.from_config(msgspec.to_builtins(ck.arch), dtype="float32")
    de = DeviceEngine(kind="cpu", memory_bytes=step_probe.POOL_BYTES)
    me = de.load_model(ModelConfig(name="p", checkpoint="demo:llama-small", kv_cache_mib=16, max_model_len=256),
                       EngineConfig(max_num_seqs=4, max_num_batched_tokens=512), checkpoint=ck)
    try:
        measured = step_probe._fastest_prefill(me, 96, 3)
    finally:
        de.unload_model("p")
    predicted = spec.prefill_time_floor(model.layers, 96) + max(model.prefill_flops(96) / spec.peak_flops,
                                                                model.prefill_bytes(96) / spec.hbm_bw)
    print(f"prefill of 96 tokens: predicted {predicted * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms")
    # 2026-12-06 (Zen 5 VM): predicted 4.6 ms, measured 2.5 ms (the engine's GEMMs beat the 512^3 peak)
    assert 1 / 3 < predicted / measured < 3.0, (predicted, measured, spec)

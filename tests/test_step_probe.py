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
    # a prefill's rows cost host time beyond their FLOPs, a few microseconds per token and layer:
    # 4.8e-6 s measured quiet with MKL products (bench/RESULTS.md "oracle", 20:45), 3.2e-6 s once
    # products of 2+ rows went through oneDNN (engine/models/linear.py, 2026-12-04 CI run); zero
    # (nothing beyond the roofline) or a step's worth per token would be wrong
    assert 1e-6 < over["prefill_token_overhead_s"] < 2e-3, over
    assert spec.prefill_time_floor(4, 128) > spec.step_time_floor(4, 1) + 4 * 128 * 1e-6, over

"""sim/calibrate.py: the performance model fitted to measured engine steps; the --perf file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from janusd.hw.devices import DeviceSpec
from janusd.hw.model_spec import ModelSpec
from janusd.sim.calibrate import (CalibrationError, decode_point, fit, points_from_bench, prefill_point,
                                  settings_from_mapping)
from janusd.sim.perfmodel import PerfModel
from janusd.sim.specs import SimModel
from janusd.sim.worker import EngineLimits

# demo:llama-small's config.json (janus models demo) and the cpu peaks cached on the
# 2-core VM (hw/cpu_peaks.py, one thread): fixed here so the test needs no measurement
LLAMA_SMALL = SimModel.from_spec("llm", ModelSpec.from_config({
    "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
    "intermediate_size": 512, "vocab_size": 2048, "tie_word_embeddings": False, "torch_dtype": "float32"}))
CPU = DeviceSpec(name="cpu", hbm_bytes=2**30, peak_flops=1.024e11, hbm_bw=3.0e10, d2d_bw=1e10, h2d_bw=3e10,
                 source="test")


def _steps(perf: PerfModel, batches=(1, 8, 32), prompt_len=32, ctx=41):
    """The bench's points, timed by `perf` instead of an engine."""
    pts = []
    for b in batches:
        shape = prefill_point(b, prompt_len, 0.0)
        steps = round(b * prompt_len / shape.prefill_tokens)
        pts.append(prefill_point(b, prompt_len, steps * shape.predict(perf, LLAMA_SMALL)))
        pts.append(decode_point(b, ctx, decode_point(b, ctx, 0.0).predict(perf, LLAMA_SMALL)))
    return pts


@pytest.mark.parametrize("truth", [
    PerfModel(CPU, overhead_s=0.0015, seq_overhead_s=0.00015, compute_eff=0.8, bandwidth_eff=0.5),
    PerfModel(CPU, overhead_s=0.004, seq_overhead_s=0.0, compute_eff=0.3, bandwidth_eff=0.9),
])
def test_fit_recovers_the_step_times_of_a_known_model(truth):
    pts = _steps(truth)
    f = fit(pts, LLAMA_SMALL, PerfModel(CPU))
    assert f.max_rel_error < 0.01
    # and predicts steps it was not fitted on
    for b, ctx in ((16, 300), (4, 1000)):
        assert f.perf.decode_step_s(LLAMA_SMALL, b, ctx) == pytest.approx(truth.decode_step_s(LLAMA_SMALL, b, ctx),
                                                                           rel=0.05)
    assert f.perf.prefill_s(LLAMA_SMALL, 400) == pytest.approx(truth.prefill_s(LLAMA_SMALL, 400), rel=0.05)


def test_the_recorded_engine_bench_fits_within_a_fifth():
    # bench/RESULTS.md "engine" (2026-12-03, this VM): demo-llama-small's steps
    result = {"bench": "engine", "prompt_len": 32, "decode_steps": 16, "demo-llama-small": {
        "b1": {"prefill_tok_s": 7673.7, "decode_step_ms": 1.71},
        "b8": {"prefill_tok_s": 15618.5, "decode_step_ms": 2.96},
        "b32": {"prefill_tok_s": 14789.9, "decode_step_ms": 6.45}}}
    pts = points_from_bench(result, "demo-llama-small")
    assert len(pts) == 6
    # b32's prefill of 1024 tokens ran as two steps of the bench's 512-token budget
    assert [p.prefill_tokens for p in pts if p.decode_batch == 0] == [32, 256, 512]
    f = fit(pts, LLAMA_SMALL, PerfModel(CPU))
    assert f.max_rel_error < 0.2
    # most of a small decode step is per-step and per-sequence host work, not the roofline
    assert f.perf.overhead_s + 32 * f.perf.seq_overhead_s > 0.5 * 6.45e-3


@pytest.mark.parametrize("result, needle", [
    ({"bench": "api"}, "not a `janus bench engine` result"),
    ({"bench": "engine", "prompt_len": 32, "decode_steps": 16, "x": {"b1": {}}}, "models: x"),
    ({"bench": "engine", "demo-llama-small": {"b1": {}}}, "prompt_len"),
    ({"bench": "engine", "prompt_len": 32, "decode_steps": 16, "demo-llama-small": {"b1": {"prefill_tok_s": 1}}},
     "needs prefill_tok_s and decode_step_ms"),
    ({"bench": "engine", "prompt_len": 32, "decode_steps": 16,
      "demo-llama-small": {"b1": {"prefill_tok_s": 1, "decode_step_ms": 1}}}, "at least 4"),
])
def test_bench_results_the_fit_cannot_use_say_why(result, needle):
    with pytest.raises(CalibrationError) as e:
        points_from_bench(result, "demo-llama-small")
    assert needle in str(e.value)


def test_perf_settings_from_a_json_object():
    perf, eng = settings_from_mapping(json.loads('{"overhead_s": 0.002, "seq_overhead_s": 1e-4, '
                                                 '"max_num_seqs": 32, "max_batched_tokens": 512}'), PerfModel(CPU))
    assert (perf.overhead_s, perf.seq_overhead_s, perf.compute_eff) == (0.002, 1e-4, 0.6)
    assert (eng.max_num_seqs, eng.max_batched_tokens) == (32, 512)
    assert eng.kv_wait_timeout_s == EngineLimits().kv_wait_timeout_s
    for bad, needle in (({"overhead": 1}, "unknown key(s) overhead"), ({"compute_eff": 2.0}, "compute_eff"),
                        ({"max_num_seqs": 1.5}, "max_num_seqs must be an integer"),
                        ({"overhead_s": "x"}, "overhead_s must be a finite number"), ([], "expected a JSON object")):
        with pytest.raises(CalibrationError) as e:
            settings_from_mapping(bad, PerfModel(CPU))
        assert needle in str(e.value)


def test_host_scale_finds_the_multiplier_behind_a_measured_tpot():
    import numpy as np

    from janusd.sim.calibrate import scale_host
    from janusd.sim.compare import figures
    from janusd.sim.run import simulate
    from janusd.trace.formats import Trace

    rng = np.random.default_rng(0)
    n = 120
    tr = Trace.build(np.sort(rng.uniform(0, 20, n)), ["chat"] * n, ["llm"] * n, rng.integers(50, 500, n),
                     rng.integers(5, 80, n), np.full(n, 500.0), np.full(n, 50.0))
    base = PerfModel(CPU, overhead_s=0.0013, seq_overhead_s=0.0001, compute_eff=0.9, bandwidth_eff=1.0)

    def tpot(perf):
        c, _ = simulate(tr, {"llm": LLAMA_SMALL}, 2, "static", perf=perf, keep_times=True,
                        engine=EngineLimits(max_num_seqs=32, max_batched_tokens=512))
        return figures(c.result_rows(), tr.duration_s)["tpot_p50_ms"]

    truth = PerfModel(CPU, overhead_s=0.0039, seq_overhead_s=0.0003, compute_eff=0.9, bandwidth_eff=1.0)
    perf, k = scale_host(base, tpot, tpot(truth))
    assert k == pytest.approx(3.0, rel=0.03)
    assert tpot(perf) == pytest.approx(tpot(truth), rel=0.01)
    with pytest.raises(CalibrationError, match="no host scale"):
        scale_host(base, tpot, 1e-6)


# --------------------------------------------------- the cpu side by side (recorded run)
DATA = Path(__file__).parent / "data"
# the cpu peaks hw/cpu_peaks.py measured on the machine of the recorded run (one thread)
RECORDED_CPU = DeviceSpec(name="cpu", hbm_bytes=1024 * 2**20, peak_flops=1.0238e11, hbm_bw=2.996e10, d2d_bw=1e10,
                          h2d_bw=2.996e10, source="2-core VM, 2026-12-03")
# how far the simulation may be from the real run (module doc of the test below)
ATTAINMENT_TOL = 0.10  # absolute, on token / TTFT / TPOT attainment
LATENCY_TOL = 0.5  # relative, on TTFT p50 / p90 and TPOT p90


def _cpu_sim(trace, perf):
    from janusd.sim.compare import figures
    from janusd.sim.run import simulate

    cluster, _ = simulate(trace, {"llm": LLAMA_SMALL}, 2, "static", perf=perf, keep_times=True,
                          engine=EngineLimits(max_num_seqs=32, max_batched_tokens=512))
    return figures(cluster.result_rows(), trace.duration_s)


def test_the_cpu_simulation_predicts_a_recorded_real_replay():
    """tests/data/sim_calib_*: `janus bench engine --skip-smollm2 --json` and two real
    `janus replay` runs (traces _lo at 3 req/s and _hi at 5.5 req/s, ~0.5x and ~0.95x the
    5.77 req/s capacity dispatch-replay measured) against `janus serve`
    (demo:llama-small on 2 cpu devices, one torch thread each, TTFT 500 ms / TPOT 50 ms,
    the daemon's dispatch defaults), recorded on the 2-core VM in a quiet window
    (bench/RESULTS.md "sim, second pass"). The performance model is fitted to the engine
    bench, its host figures scaled to the _lo run's median TPOT (scale_host, the one
    figure taken from the run); the rest of the _lo run must then follow: attainment
    within ATTAINMENT_TOL, TTFT p50 / p90 and TPOT p90 within LATENCY_TOL (relative).

    Not asserted, measured: the _hi run. The real system is at its knee there (token
    attainment 0.62, 54 of 249 refused) while the simulation serves it all on time: the
    daemon's, the stream's and the replayer's host work shares the 2 cores with the two
    workers and grows with load, which one constant scale cannot follow (RESULTS.md)."""
    from janusd.sim.calibrate import scale_host
    from janusd.trace.formats import Trace, read_trace

    lo = read_trace(DATA / "sim_calib_trace_lo.csv")
    real = json.loads((DATA / "sim_calib_real_lo.json").read_text())
    bench = json.loads((DATA / "sim_calib_engine.json").read_text())
    f = fit(points_from_bench(bench, "demo-llama-small"), LLAMA_SMALL, PerfModel(RECORDED_CPU))
    assert f.max_rel_error < 0.2
    perf, k = scale_host(f.perf, lambda p: _cpu_sim(lo, p)["tpot_p50_ms"], real["tpot_p50_ms"])
    assert 1.0 <= k <= 10.0  # the replay's stack adds host work to the engine's, within reason
    sim = _cpu_sim(lo, perf)
    assert sim["requests"] == real["requests"] == len(lo)
    assert sim["tpot_p50_ms"] == pytest.approx(real["tpot_p50_ms"], rel=0.02)  # what was fitted
    for key in ("token_attainment", "ttft_attainment", "tpot_attainment"):
        assert abs(sim[key] - real[key]) <= ATTAINMENT_TOL, (key, sim[key], real[key])
    for key in ("ttft_p50_ms", "ttft_p90_ms", "tpot_p90_ms"):
        assert abs(sim[key] - real[key]) <= LATENCY_TOL * real[key], (key, sim[key], real[key])
    # what a wrong model fails: the engine fit alone (host work not scaled in) misses the
    # run's latencies by more than the tolerance, so the tolerance is not a pass for anything
    raw = _cpu_sim(lo, f.perf)
    assert any(abs(raw[key] - real[key]) > LATENCY_TOL * real[key] for key in ("tpot_p50_ms", "tpot_p90_ms"))
    # and a load where attainment is below 1: the same requests at 6x the rate (18 req/s, ~3x
    # the 5.77 req/s dispatch-replay measured) are often late on the calibrated model (0.37
    # on 2026-12-07, 0.63 once the decode guard yields where it pays, 0.75 once its trade
    # counts a refused request's whole loss, [Q] session 5), where the engine fit alone
    # still serves 0.89 of the tokens on time; at
    # 2x (6 req/s, the real _hi run's knee: 0.62 there) both still say 1.0 (the docstring's gap)
    fast = Trace.build(lo.arrival_s / 6.0, list(lo.apps[k] for k in lo.app_id), ["llm"] * len(lo),
                       lo.input_tokens, lo.output_tokens, lo.ttft_slo_ms, lo.tpot_slo_ms)
    over, over_raw = _cpu_sim(fast, perf), _cpu_sim(fast, f.perf)
    assert over["token_attainment"] < 0.8 < over_raw["token_attainment"], (over, over_raw)
    assert over_raw["token_attainment"] - over["token_attainment"] > 0.1, (over, over_raw)

"""Online points from telemetry windows, bounded buffers, and a refit that follows a shift."""

from __future__ import annotations

import logging

import msgspec
import numpy as np
import pytest

from janusd.hw import ModelSpec
from janusd.hw.devices import DeviceSpec
from janusd.oracle import refit_job, store
from janusd.oracle.dataset import encode
from janusd.oracle.fit import monotone_predictions
from janusd.oracle.online import OnlinePoints, window_usage
from janusd.oracle.oracle import Oracle
from janusd.telemetry import Telemetry

SPEC = ModelSpec.from_config({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512})
DEV = DeviceSpec(name="t", hbm_bytes=1e9, peak_flops=1e10, hbm_bw=1e10, d2d_bw=1e9, h2d_bw=1e9, source="test")


def truth(rate_per_instance: float, out_len: float) -> float:
    """The fake server's attainment: falls with the decode work each instance is asked for."""
    return 1.0 / (1.0 + (rate_per_instance * out_len / 150.0) ** 4)


def windows(rng: np.random.Generator, rate: float, out_len: float, m: int, seconds: float = 80.0):
    """Telemetry windows of a fake server at one load: Poisson arrivals, each request ends
    0.5 s later with the truth's share of its tokens on time."""
    tel = Telemetry(window_s=20.0, bucket_s=1.0)
    t, rid, out = 0.0, 0, []
    next_sample = 20.0
    ends: list[tuple[float, int, int]] = []
    while t < seconds:
        t += rng.exponential(1.0 / rate)
        while ends and ends[0][0] <= t:
            te, r, n = ends.pop(0)
            on = int(round(truth(rate / m, out_len) * n))
            tel.on_tokens(r, te, n)
            tel.on_end(r, te, True, n, on, n)
        while t >= next_sample:
            out.append(tel.model("m", next_sample))
            next_sample += 10.0  # windows overlap by half, as sample_s < window_s in the daemon
        n_out = max(1, int(rng.normal(out_len, out_len * 0.2)))
        tel.on_arrival(rid, "m", t, int(rng.integers(20, 80)), n_out)
        ends.append((t + 0.5, rid, n_out))
        rid += 1
    return out


def collect(buf: OnlinePoints, rng, loads) -> None:
    for rate, out_len, m in loads:
        for w in windows(rng, rate, out_len, m)[1:]:  # the first window is still filling
            buf.add(w, m, SPEC, DEV, 0.0)


def test_window_usage_counts_from_the_config():
    rng = np.random.default_rng(0)
    w = windows(rng, 4.0, 50, 1)[-1]
    hbm, compute, bw = window_usage(w, 2, SPEC, DEV, kv_used_bytes=1e6)
    assert hbm == pytest.approx((SPEC.weight_bytes + 1e6) / 1e9)
    attn = 4 * SPEC.layers * SPEC.heads * SPEC.head_dim
    head = 2 * SPEC.vocab * SPEC.hidden  # once per prefill, not per prompt token
    flops = (w.input_token_rate * (2 * SPEC.matmul_params - head + attn * w.input_len_mean / 2) + w.request_rate * head
             + w.output_token_rate * (2 * SPEC.matmul_params + attn * (w.input_len_mean + w.output_len_mean / 2)))
    assert compute == pytest.approx(flops / 2 / 1e10)
    assert bw > 0


def test_window_usage_on_a_cpu_adds_the_host_seconds_the_prior_counts():
    """[W]: on a cpu the engine's host work runs on the computing cores, so an online point's
    compute share carries it as the prior's does (a fitted GP would otherwise see a small
    model as nearly free again); an accelerator's point is the FLOPs share alone."""
    w = windows(np.random.default_rng(0), 4.0, 50, 1)[-1]
    host = dict(step_overhead_s=1e-4, layer_overhead_s=1e-3, seq_overhead_s=2e-4, prefill_token_overhead_s=1e-5)
    cpu = msgspec.structs.replace(DEV, name="cpu", **host)
    accel = msgspec.structs.replace(DEV, name="h100", **host)
    _, c_cpu, bw_cpu = window_usage(w, 2, SPEC, cpu, 0.0)
    _, c_acc, bw_acc = window_usage(w, 2, SPEC, accel, 0.0)
    assert bw_cpu == bw_acc and c_acc == pytest.approx(window_usage(w, 2, SPEC, DEV, 0.0)[1])
    seqs = max(1.0, w.in_flight / 2)
    want = (w.request_rate / 2 * cpu.prefill_time_floor(SPEC.layers, w.input_len_mean)
            + w.output_token_rate / 2 / seqs * cpu.step_time_floor(SPEC.layers, seqs))
    assert want > 0.01 and c_cpu - c_acc == pytest.approx(want, rel=1e-9)


def test_buffer_is_bounded_keeps_the_newest_and_skips_idle_windows():
    buf = OnlinePoints({"model": "m"}, max_points=5)
    rng = np.random.default_rng(1)
    collect(buf, rng, [(2.0, 20, 1)] * 4)
    assert len(buf.points) == 5 and buf.new_since_fit > 5
    assert list(buf.points.point_id) == sorted(buf.points.point_id)  # arrival order
    assert buf.points.point_id[0] > 0  # the oldest were dropped
    idle = Telemetry().model("m", 5.0)
    assert not buf.add(idle, 1, SPEC, DEV, 0.0)  # no traffic, no point
    assert buf.due(min_points=5, min_new=1) and not buf.due(min_points=6, min_new=1)


def test_online_refit_reduces_the_error_after_a_load_shift(tmp_path):
    rng = np.random.default_rng(2)
    buf = OnlinePoints({"model": "m", "source": "online"}, max_points=2000)
    # the profile: short outputs only
    collect(buf, rng, [(r, 20, m) for r in (1.0, 3.0, 6.0, 9.0, 12.0) for m in (1, 2)])
    log = logging.getLogger("test")

    def fit_and_load() -> Oracle:
        refit_job.fit_and_store(encode(buf.points), "m", str(tmp_path), SPEC.identity(), "t", 0.0)
        o = Oracle()
        assert store.load_into(o, tmp_path, "m", SPEC.identity(), log)[0] == "gp"
        return o

    before = fit_and_load()
    # the load shifts to long outputs; fresh windows of the new regime are the test set
    shifted = [(r, 120, m) for r in (0.5, 1.0, 1.5, 2.5) for m in (1, 2)]
    test = OnlinePoints({"model": "m"}, 2000)
    collect(test, np.random.default_rng(99), shifted)

    def error(o: Oracle) -> float:
        pred = monotone_predictions(o.entry("m").elasticity, test.points)
        return float(np.mean(np.abs(pred - test.points.attainment)))

    err_before = error(before)
    collect(buf, rng, shifted)  # the daemon samples the shifted traffic
    err_after = error(fit_and_load())
    print(f"mean abs error before {err_before:.3f}, after {err_after:.3f}")
    assert err_after < 0.5 * err_before, (err_before, err_after)
    assert err_after < 0.15  # the window features are noisy (10 s of Poisson arrivals), the truth is not

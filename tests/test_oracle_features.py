"""oracle/features.py: a replay's results seen through telemetry's windows; usage counts."""

from __future__ import annotations

import pytest

from janusd.hw import ModelSpec
from janusd.hw.devices import DeviceSpec
from janusd.oracle.features import features_from_results, token_attainment, usage_from_results
from janusd.trace.results import RequestResult

SPEC = ModelSpec.from_config({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512})
DEV = DeviceSpec(name="t", hbm_bytes=1e9, peak_flops=1e9, hbm_bw=1e9, d2d_bw=1e9, h2d_bw=1e9, source="test")


def row(i, arrival, inp, out, times, status="ok"):
    return RequestResult(index=i, arrival_s=arrival, app="a", model="m", input_tokens=inp, output_tokens=out,
                         ttft_slo_ms=500.0, tpot_slo_ms=100.0, send_lag_ms=0.0, token_times_s=times, status=status)


def test_features_follow_telemetrys_rules():
    rows = [row(0, 0.0, 10, 2, [0.1, 0.2]), row(1, 1.0, 30, 4, [0.1, 0.2, 0.3, 0.4]),
            row(2, 3.5, 20, 8, [0.3, 0.7]),  # still decoding at t=4: its max_tokens 8 is the prior
            row(3, 2.0, 40, 6, [], status="error")]  # failed: censored, no length
    z = features_from_results(rows, span_s=4.0)
    assert z.request_rate == pytest.approx(4 / 4.0)
    assert z.input_token_rate == pytest.approx(100 / 4.0)
    assert z.input_len_mean == pytest.approx(25.0)
    assert z.input_len_var == pytest.approx(((10 - 25) ** 2 + 5**2 + 5**2 + 15**2) / 4)
    assert z.output_len_mean == pytest.approx((2 + 4 + 8) / 3)  # two ended ok + one in flight at max_tokens
    assert z.output_token_rate == pytest.approx(z.request_rate * z.output_len_mean)


def test_attainment_counts_failures_as_misses():
    rows = [row(0, 0.0, 10, 2, [0.1, 0.2]), row(1, 0.0, 10, 2, [0.9, 1.0]), row(2, 0.0, 10, 2, [], status="error")]
    assert token_attainment(rows) == pytest.approx(2 / 6)  # request 1 is late on both tokens


def test_usage_counts_flops_and_bytes_from_the_config():
    # one request: prompt 10, 3 tokens at 0.1, 0.2, 0.3 (decode step 0.1 s, busy 0.2 s) over 1 s
    rows = [row(0, 0.0, 10, 3, [0.1, 0.2, 0.3])]
    compute, bw = usage_from_results(rows, wall_s=1.0, instances=1, spec=SPEC, device=DEV)
    flops = SPEC.prefill_flops(10) + SPEC.decode_step_flops(2, 11 + 12)
    assert compute == pytest.approx(flops / 1e9)
    nbytes = SPEC.prefill_bytes(10) + SPEC.kv_bytes_per_token * (23 + 2) + 2 * SPEC.weight_bytes
    assert bw == pytest.approx(nbytes / 1e9)
    c2, b2 = usage_from_results(rows, wall_s=1.0, instances=2, spec=SPEC, device=DEV)
    assert c2 == pytest.approx(compute / 2)  # per instance

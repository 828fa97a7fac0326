"""oracle/features.py: a replay's results seen through telemetry's windows; usage counts."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.hw import ModelSpec
from janusd.hw.devices import DeviceSpec
from janusd.oracle.features import features_from_results, in_window, token_attainment, usage_in_window
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
    # one request: prompt 10, 3 tokens at 0.1, 0.2, 0.3 (two decode steps) over a 1 s window
    rows = [row(0, 0.0, 10, 3, [0.1, 0.2, 0.3])]
    compute, bw = usage_in_window(rows, 0.0, 1.0, instances=1, spec=SPEC, device=DEV)
    flops = SPEC.prefill_flops(10) + SPEC.decode_step_flops(2, 11 + 12)
    assert compute == pytest.approx(flops / 1e9)
    nbytes = SPEC.prefill_bytes(10) + SPEC.kv_bytes_per_token * (23 + 2) + 2 * SPEC.weight_bytes
    assert bw == pytest.approx(nbytes / 1e9)
    c2, b2 = usage_in_window(rows, 0.0, 1.0, instances=2, spec=SPEC, device=DEV)
    assert c2 == pytest.approx(compute / 2) and b2 == pytest.approx(bw / 2)  # per instance


def test_usage_counts_only_the_work_done_inside_the_window():
    # the prefill (first token at 0.1) and the first decode token (0.2) fall before the window
    rows = [row(0, 0.0, 10, 4, [0.1, 0.2, 0.3, 0.4])]
    compute, bw = usage_in_window(rows, 0.25, 0.75, instances=1, spec=SPEC, device=DEV)
    assert compute == pytest.approx(SPEC.decode_step_flops(2, 12 + 13) / 0.5 / 1e9)
    assert bw == pytest.approx((SPEC.kv_bytes_per_token * (25 + 2) + 2 * SPEC.weight_bytes) / 0.5 / 1e9)
    assert in_window([row(0, 0.1, 1, 1, []), row(1, 0.5, 1, 1, []), row(2, 0.75, 1, 1, [])], 0.25, 0.75)[0].index == 1


def lockstep(starts, lengths, step_s, rng):
    """Requests decoding on one instance in lockstep: step k at k * step_s; a request joins
    at step starts[i] (its prefill's token) for lengths[i] tokens, each reaching the client
    up to 2 ms late (a fifth of a step)."""
    rows = []
    for i, (s0, n) in enumerate(zip(starts, lengths, strict=True)):
        t = (np.arange(s0, s0 + n) + 1) * step_s + rng.uniform(0, 2e-3, n)
        rows.append(row(i, 0.0, 0, n, np.sort(t).tolist()))
    return rows


# starts <= 59 and lengths <= 40: the last token (step 99) reaches the client by 0.992 s, inside
# the 1 s window (a start of 60 put it at 1.000-1.002 s, past the window: hypothesis found it)
@given(st.lists(st.tuples(st.integers(0, 59), st.integers(1, 40)), min_size=1, max_size=12),
       st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_decode_steps_are_counted_exactly_on_one_instance_whatever_the_batch(reqs, seed):
    """On one instance every decode step reads the weights once: the counted weight reads
    equal the number of distinct decode steps, however the batch grows and shrinks and
    however late each token reaches the client (within a fraction of a step)."""
    rows = lockstep(*zip(*reqs, strict=True), 0.01, np.random.default_rng(seed))
    steps = len({k for s0, n in reqs for k in range(s0 + 1, s0 + n)})  # decode steps (after each first token)
    # bandwidth with KV free and empty prompts: only weight reads remain, one per bandwidth unit
    free_kv = msgspec.structs.replace(SPEC, kv_heads=0)
    dev = DeviceSpec(name="t", hbm_bytes=1e9, peak_flops=1e9, hbm_bw=float(free_kv.weight_bytes), d2d_bw=1e9,
                     h2d_bw=1e9, source="test")
    _, bw = usage_in_window(rows, 0.0, 1.0, 1, free_kv, dev)
    assert bw == pytest.approx(steps + len(rows), rel=1e-9)  # + one prefill read each


def test_two_instances_each_decoding_alone_count_a_step_per_token():
    rows = [row(0, 0.0, 0, 5, [0.1, 0.2, 0.3, 0.4, 0.5]), row(1, 0.0, 0, 5, [0.15, 0.25, 0.35, 0.45, 0.55])]
    free_kv = msgspec.structs.replace(SPEC, kv_heads=0)
    dev = DeviceSpec(name="t", hbm_bytes=1e9, peak_flops=1e9, hbm_bw=float(free_kv.weight_bytes), d2d_bw=1e9,
                     h2d_bw=1e9, source="test")
    _, bw2 = usage_in_window(rows, 0.0, 1.0, 2, free_kv, dev)
    assert bw2 * 2 == pytest.approx(2 + 8)  # two prefills + eight decode steps on two instances
    _, bw1 = usage_in_window(rows, 0.0, 1.0, 1, free_kv, dev)
    assert bw1 == pytest.approx(2 + 8 / 2)  # read as one instance: both decode throughout, each step serves both


def test_a_schedule_start_before_the_first_arrival_spreads_the_rates_over_the_whole_span():
    rows = [row(0, 1.0, 10, 2, [0.1, 0.2]), row(1, 3.0, 30, 2, [0.1, 0.2])]
    assert features_from_results(rows, span_s=4.0).request_rate == pytest.approx(2 / 4.0)  # first arrival 1.0 to 5.0
    z = features_from_results(rows, span_s=4.0, t0=0.0)
    assert z.request_rate == pytest.approx(2 / 4.0) and z.input_token_rate == pytest.approx(40 / 4.0)
    assert features_from_results(rows, span_s=8.0, t0=0.0).request_rate == pytest.approx(2 / 8.0)

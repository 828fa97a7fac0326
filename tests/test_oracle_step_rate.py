"""The Capacity GP's saturating bandwidth mean (oracle/step_rate.py, capacity.py "step-rate")."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.hw import ModelSpec, device_spec
from janusd.oracle import step_rate
from janusd.oracle.capacity import CapacityModel
from janusd.oracle.prior import RooflinePrior
from janusd.oracle.types import LoadFeatures

DEMO = ModelSpec.from_config({"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
                              "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 2048})
# a CPU of this VM's order (bench/RESULTS.md "oracle": 98 GFLOP/s, 28 GB/s, 0.38 ms per layer per step)
CPU = msgspec.structs.replace(device_spec("h100"), hbm_bytes=1 << 30, peak_flops=1e11, hbm_bw=2.8e10,
                              step_overhead_s=0.0, layer_overhead_s=3.8e-4, seq_overhead_s=6e-5,
                              prefill_token_overhead_s=5e-6)
PRIOR = RooflinePrior(DEMO, CPU, ttft_slo_s=0.5, tpot_slo_s=0.05)


def rows(rates: np.ndarray, lin: float = 96.0, lout: float = 32.0) -> np.ndarray:
    r = np.asarray(rates, dtype=np.float64)
    return np.stack([r, r * lin, r * lout, np.full_like(r, lin), np.full_like(r, (0.5 * lin) ** 2),
                     np.full_like(r, lout), np.full_like(r, (0.5 * lout) ** 2)], axis=1)


def t_step1() -> float:
    return float(step_rate.step_time(DEMO, CPU, np.array([1.0]), np.array([96.0 + 16.0]))[0])


def test_steps_follow_the_token_rate_at_light_load_and_saturate_at_one_over_tau():
    f = rows(np.array([0.01, 2.0, 50.0, 5000.0]))
    s = step_rate.steps_per_s(DEMO, CPU, f, 3.0)
    tok = f[:, 0] * f[:, 5]
    assert s[0] == pytest.approx(tok[0], rel=0.01)  # a lone request: one step per token
    assert s[1] < tok[1]  # tokens share steps
    tau1 = 3.0 * t_step1()
    assert s[2] < 1.0 / tau1  # bounded by one step per tau (tau grows with the batch)
    assert s[2] > 0.2 / tau1  # and close to it, not collapsing
    # past overload (tokens/s x factor x per-sequence time > 1) the batch diverges to B_CAP
    assert s[3] == pytest.approx(tok[3] / (step_rate.B_CAP - 1.0))  # (1 - e^-N) / N at N = B_CAP - 1 others


@settings(max_examples=60, deadline=None)
@given(st.floats(0.01, 500.0), st.floats(0.1, 100.0))
def test_steps_per_second_are_bounded_by_the_token_rate_and_one_over_tau(rate, factor):
    """steps = tokens / (1 + tokens x tau(b)) < min(tokens, 1 / tau(1)) for any load: a
    token is never more than one step, and a request waits at least tau(1) per token."""
    f = rows(np.array([rate]))
    s = float(step_rate.steps_per_s(DEMO, CPU, f, factor)[0])
    assert 0.0 < s <= f[0, 0] * f[0, 5] * (1 + 1e-12)
    assert s <= 1.0 / (factor * t_step1()) * (1 + 1e-9)


def test_fit_factor_recovers_the_factor_from_noiseless_bandwidth():
    f = rows(np.linspace(1.0, 12.0, 8))
    for truth in (0.5, 2.0, 7.0):
        meas = step_rate.bandwidth(DEMO, CPU, f, truth)
        got = step_rate.fit_factor(DEMO, CPU, f, meas)
        assert got == pytest.approx(truth, rel=0.035)  # the grid's step is 6%


def test_step_rate_mean_extrapolates_a_saturating_bandwidth_beyond_the_training_rates():
    """The mechanism of the fix: the truth is a saturating step rate with a time per token
    3x the device's step time (the demo models' profiles); trained on 1-6 req/s, asked at
    9-27 req/s where the steps have bent over. The saturating mean predicts it within 10%;
    the prior's bandwidth with a trended GP correction extrapolates the low rates' slope."""
    rng = np.random.default_rng(7)
    train = rows(np.repeat(np.array([1.0, 2.0, 3.0, 4.5, 6.0]), 2))
    truth = lambda f: step_rate.bandwidth(DEMO, CPU, f, 3.0)  # noqa: E731
    meas_bw = truth(train) * np.exp(rng.normal(0.0, 0.03, len(train)))
    base = np.array([PRIOR.capacity("", LoadFeatures(*r.tolist())).mean for r in train])
    measured = np.column_stack([base[:, 0], base[:, 1], meas_bw])
    test = rows(np.array([9.0, 13.5, 18.0, 27.0]))
    new = CapacityModel.fit(train, measured, PRIOR, bw_form="step-rate")
    old = CapacityModel.fit(train, measured, PRIOR, bw_form="prior")
    err_new = np.abs(new.predict(test)[0][:, 2] / truth(test) - 1)
    err_old = np.abs(old.predict(test)[0][:, 2] / truth(test) - 1)
    assert new.step_factor == pytest.approx(3.0, rel=0.1)
    assert err_new.max() < 0.10, err_new
    assert err_old.max() > 0.05 and err_old.max() > 5 * err_new.max(), (err_old, err_new)


def test_bad_forms_and_factors_are_refused():
    f = rows(np.array([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="factor"):
        step_rate.steps_per_s(DEMO, CPU, f, 0.0)
    with pytest.raises(ValueError, match="unknown bandwidth mean"):
        CapacityModel.fit(f, np.full((3, 3), 0.1), PRIOR, bw_form="linear")
    with pytest.raises(ValueError, match="needs a prior"):
        CapacityModel.fit(f, np.full((3, 3), 0.1), None, bw_form="step-rate")
    with pytest.raises(ValueError, match="one measured bandwidth per row"):
        step_rate.fit_factor(DEMO, CPU, f, np.ones(2))


@settings(max_examples=80, deadline=None)
@given(st.floats(0.0, 300.0), st.integers(1, 12))
def test_step_fraction_is_the_measurements_count_under_poisson_arrivals(others, m):
    """step_fraction's closed form equals E[1 / max(1, (1 + K) / m)] summed term by term
    over K ~ Poisson(others): how features.usage_in_window counts a token's share of a step
    when it sees its own request plus K others decoding on m instances."""
    from scipy.stats import poisson

    k = np.arange(0, int(others + 40 * np.sqrt(others + 1) + 50))
    ref = float((poisson.pmf(k, max(others, 1e-12)) / np.maximum(1.0, (1.0 + k) / m)).sum())
    got = float(step_rate.step_fraction(np.array([others]), np.array([m]))[0])
    assert got == pytest.approx(ref, abs=1e-9)


def test_a_load_spread_over_more_instances_takes_more_steps_per_instance():
    """The same per-instance load on m = 1, 2, 4 instances: with fewer decoding requests
    than instances each gets a step of its own, so the steps per instance rise with m and
    stay within one step per token."""
    f = rows(np.array([3.0, 3.0, 3.0]))
    s = step_rate.steps_per_s(DEMO, CPU, f, 3.0, np.array([1, 2, 4]))
    tok = f[0, 0] * f[0, 5]
    assert s[0] < s[1] < s[2] <= tok
    one = step_rate.steps_per_s(DEMO, CPU, f[:1], 3.0)
    assert one[0] == pytest.approx(s[0])  # None means one instance
    with pytest.raises(ValueError, match="instance count"):
        step_rate.steps_per_s(DEMO, CPU, f, 3.0, np.array([1, 0, 2]))


def test_fit_factor_recovers_the_factor_of_rows_measured_on_several_instances():
    f = rows(np.linspace(1.0, 12.0, 8))
    m = np.array([1, 2, 1, 2, 1, 2, 1, 2])
    meas = step_rate.bandwidth(DEMO, CPU, f, 2.0, m)
    assert step_rate.fit_factor(DEMO, CPU, f, meas, m) == pytest.approx(2.0, rel=0.035)
    cap = CapacityModel.fit(f, np.column_stack([np.full(8, 0.1), np.full(8, 0.1), meas]), PRIOR,
                            bw_form="step-rate", instances=m)
    pred = cap.predict(f, m)[0][:, 2]
    assert np.abs(pred / meas - 1).max() < 0.05  # the mean alone carries it; the GP has nothing left


def engine_rows(truth: step_rate.StepTime, feats: np.ndarray, batch: np.ndarray, noise: float, seed: int = 0
                ) -> np.ndarray:
    """dataset.py engine rows (steps, decode tokens, forward s, wall s) of 30 s replays at
    the given tokens per step, forward time from `truth` with multiplicative noise."""
    rng = np.random.default_rng(seed)
    wall = np.full(len(feats), 30.0)
    dec = feats[:, 0] * feats[:, 5] * wall
    steps = dec / batch
    ctx = feats[:, 3] + feats[:, 5] / 2.0
    fwd = steps * truth.seconds(batch, ctx) * np.exp(rng.normal(0.0, noise, len(feats)))
    return np.stack([steps, dec, fwd, wall], axis=1)


def test_fit_step_time_recovers_the_engine_step_time_from_its_counters():
    truth = step_rate.StepTime(per_step=4e-4, per_seq=5e-4, per_seq_ctx=2e-6)
    rates = np.array([2.0, 4, 8, 16, 32, 2, 4, 8, 16])
    lin = np.array([96.0] * 5 + [381.0] * 4)
    feats = np.concatenate([rows(rates[i:i + 1], lin[i], lin[i] / 4) for i in range(len(rates))])
    batch = np.array([1.0, 1.1, 1.3, 1.8, 2.7, 1.2, 1.6, 4.0, 21.0])
    got = step_rate.fit_step_time(feats, engine_rows(truth, feats, batch, noise=0.03))
    assert got is not None
    b, ctx = np.array([1.0, 4.0, 20.0, 20.0]), np.array([112.0, 112.0, 112.0, 430.0])
    assert got.seconds(b, ctx) == pytest.approx(truth.seconds(b, ctx), rel=0.1)
    # too few rows with counters, or one batch size only: nothing to read a step time off
    eng = engine_rows(truth, feats, batch, noise=0.0)
    eng[step_rate.MIN_ENGINE_ROWS - 1:] = np.nan
    assert step_rate.fit_step_time(feats, eng) is None
    assert step_rate.fit_step_time(feats, engine_rows(truth, feats, np.full(len(feats), 2.0), 0.0)) is None
    with pytest.raises(ValueError, match="per_seq must be finite"):
        step_rate.StepTime(1e-3, float("nan"), 0.0)


def test_a_measured_per_sequence_cost_makes_the_batch_climb_to_the_engine_limit():
    """Step time c x b: by Little's law b = 1 + tok x factor x c x b, so b = 1 / (1 - rho),
    rho = tok x factor x c, and steps/s = tok x (1 - e^-N) / N, N = b - 1 (step_fraction,
    m = 1): the steps per second rise, peak and fall as rho goes to 1, where the device's
    step time (cheap sequences) keeps them rising."""
    c, factor = 1e-3, 1.5
    per_seq = step_rate.StepTime(per_step=0.0, per_seq=c, per_seq_ctx=0.0)
    tok_cap = 1.0 / (factor * c)
    lout = 32.0
    rates = np.array([0.1, 0.3, 0.5, 0.7, 0.9, 0.95]) * tok_cap / lout
    f = rows(rates, 96.0, lout)
    got = step_rate.steps_per_s(DEMO, CPU, f, factor, measured=per_seq)
    tok = rates * lout
    n = 1.0 / (1.0 - tok * factor * c) - 1.0
    assert got == pytest.approx(tok * -np.expm1(-n) / n, rel=1e-6)
    assert np.argmax(got) not in (0, len(got) - 1) and got[-1] < 0.6 * got.max()
    device = step_rate.steps_per_s(DEMO, CPU, f, factor)
    assert np.all(np.diff(device) > 0)

"""The logistic calibration of the prior's pressure (oracle/pressure_link.py) and the
"calibrated" Elasticity input set built on it."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.hw import ModelSpec, device_spec
from janusd.oracle.dataset import Points
from janusd.oracle.elasticity import ElasticityModel
from janusd.oracle.fit import choose_input_set, monotone_predictions
from janusd.oracle.pressure_link import PressureLink
from janusd.oracle.prior import RooflinePrior
from janusd.oracle.types import LoadFeatures

SPEC = ModelSpec.from_config({"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                              "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
                              "tie_word_embeddings": True, "torch_dtype": "bfloat16"})


def test_the_link_recovers_a_known_knee_and_slope_from_noisy_fractions():
    rng = np.random.default_rng(3)
    x = rng.uniform(-3, 1, 200)
    truth = PressureLink(-1.2, 4.0)
    a = np.clip(truth.attainment(x) + rng.normal(0, 0.03, len(x)), 0, 1)
    fit = PressureLink.fit(x, a)
    assert fit.knee == pytest.approx(-1.2, abs=0.05)
    assert fit.slope == pytest.approx(4.0, rel=0.15)


def test_separable_points_give_a_finite_slope_and_a_knee_between_them():
    """Every served point below every failed one (the usual profile): the likelihood alone
    would make a step; the slope's ridge keeps it a curve, its knee between the two groups."""
    x = np.array([-3.0, -2.5, -2.0, -1.9, -1.0, -0.8])
    a = np.array([1.0, 1.0, 1.0, 1.0, 0.2, 0.0])
    fit = PressureLink.fit(x, a)
    assert -1.9 < fit.knee < -1.0
    assert 1.0 < fit.slope < 60.0
    assert fit.attainment(np.array([-2.0]))[0] > 0.9 and fit.attainment(np.array([-0.8]))[0] < 0.2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-6, 3), st.floats(0, 1)), min_size=1, max_size=25))
def test_any_data_gives_a_finite_decreasing_curve(rows):
    """Adversarial labels (rising with pressure, constant, one row): still a finite knee and a
    slope > 0, so the calibrated attainment never rises with pressure (hence never falls with m)."""
    x, a = map(np.array, zip(*rows, strict=True))
    fit = PressureLink.fit(x, a)
    assert np.isfinite(fit.knee) and np.isfinite(fit.slope) and fit.slope > 0
    curve = fit.attainment(np.linspace(-8, 5, 50))
    assert np.all(np.diff(curve) <= 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-6, 3), st.floats(-9, 0), st.floats(0, 1)), min_size=1, max_size=25))
def test_any_data_gives_a_curve_falling_in_both_pressure_and_stall(rows):
    """The two-column fit (interference learnt): slope > 0 and interference >= 0 whatever
    the labels, so the attainment falls with the pressure and with the stall alike, both
    of which fall as m grows."""
    x0, x1, a = map(np.array, zip(*rows, strict=True))
    fit = PressureLink.fit(np.stack([x0, x1], axis=1), a, interference=True)
    assert fit.slope > 0 and fit.interference >= 0 and np.isfinite(fit.knee)
    grid = np.linspace(-8, 5, 30)
    for fixed in (-5.0, 0.0):
        assert np.all(np.diff(fit.attainment(np.stack([grid, np.full(30, fixed)], axis=1))) <= 0)
        assert np.all(np.diff(fit.attainment(np.stack([np.full(30, fixed), grid], axis=1))) <= 0)


def test_the_interference_weight_is_recovered_where_stalls_decide():
    """Long prompts failing at a pressure where short ones are served (the 2026-12-06
    profiles): a truth with interference 1.5 is recovered from noisy fractions, and the
    one-column fit, which cannot tell the two apart, errs several times more."""
    rng = np.random.default_rng(4)
    x = np.stack([rng.uniform(-3, 0, 300), rng.uniform(-7, -2, 300)], axis=1)
    truth = PressureLink(-8.0, 3.0, 1.5)
    a = np.clip(truth.attainment(x) + rng.normal(0, 0.03, len(x)), 0, 1)
    fit = PressureLink.fit(x, a, interference=True)
    assert fit.interference == pytest.approx(1.5, rel=0.15)  # the slope comes out flatter (2.2): noise clipped at 0 and 1
    xt = np.stack([rng.uniform(-3, 0, 200), rng.uniform(-7, -2, 200)], axis=1)
    err2 = np.abs(fit.attainment(xt) - truth.attainment(xt)).mean()
    err1 = np.abs(PressureLink.fit(x[:, 0], a).attainment(xt[:, 0]) - truth.attainment(xt)).mean()
    assert err2 < 0.03 and err1 > 3 * err2, (err1, err2)


def test_bad_link_states_are_refused():
    assert PressureLink.from_state({"knee": -1, "slope": 2}).to_state() == {"knee": -1.0, "slope": 2.0,
                                                                            "interference": 0.0}
    for bad in ({"knee": 1.0}, {"knee": "a", "slope": 1}, {"knee": 0.0, "slope": 0.0}, [1, 2], None,
                {"knee": float("nan"), "slope": 1.0}, {"knee": 0.0, "slope": 1.0, "interference": -0.5},
                {"knee": 0.0, "slope": 1.0, "interference": "x"}):
        with pytest.raises(ValueError):
            PressureLink.from_state(bad)
    with pytest.raises(ValueError, match="matching finite"):
        PressureLink.fit(np.array([0.0, np.inf]), np.array([1.0, 0.0]))


def _mix(rate: float, lin: float) -> list[float]:
    lout = lin / 3.0
    return [rate, rate * lin, rate * lout, lin, (0.2 * lin) ** 2, lout, (0.2 * lout) ** 2]


def test_a_held_out_knee_is_found_from_another_mix_and_instance_count():
    """The cpu profiles' situation (bench/oracle/llama-small-steady.npz's design): rates on a
    3x grid, two length mixes, m = 1 and 2, one failed point in training; the prior orders
    the points right but puts the knee 4x too far out (truth: its pressure through a knee
    at 0.25, a little noise). Held out: the long mix at m = 1 and 6 req/s, past the knee,
    where no training point of its mix and m failed. The calibrated model puts it past the
    knee from the failure of the short mix at m = 2; the 9-input GP does not."""
    dev = msgspec.structs.replace(device_spec("h100"), peak_flops=2e12, hbm_bw=2e11)
    prior = RooflinePrior(SPEC, dev, ttft_slo_s=1.0, tpot_slo_s=0.05)

    def rho(f: np.ndarray, m: np.ndarray) -> np.ndarray:
        return np.array([prior.pressure(LoadFeatures(*r.tolist()), int(k)) for r, k in zip(f, m, strict=True)])

    design = [(2, 96, 1), (6, 96, 1), (2, 384, 1), (6, 96, 2), (18, 96, 2), (54, 96, 2), (2, 384, 2), (6, 384, 2)]
    f = np.array([_mix(r, lin) for r, lin, _ in design])
    m = np.array([k for *_, k in design])
    test_f, test_m = np.array([_mix(6, 384)]), np.array([1])
    # the knee: between the hardest served training point (6 req/s, long, m = 2: 0.21) and
    # the held-out one (0.42); the short mix at m = 2 and 54 req/s (0.57) is past it
    held_rho = rho(test_f, test_m)[0]
    truth = PressureLink(float(np.log(0.3)), 8.0)
    a = np.clip(truth.attainment(np.log(rho(f, m))) + np.random.default_rng(0).normal(0, 0.03, len(f)), 0, 1)
    test_a = truth.attainment(np.log([held_rho]))
    assert test_a[0] < 0.1 and np.sort(a)[1] > 0.85  # past the knee; one training point failed
    held = Points({}, test_f, test_m, np.zeros((1, 3)), test_a, np.arange(1))
    err = {}
    for name in ("calibrated", "full", "pressure"):
        model = ElasticityModel.fit(f, m, a, prior=prior, input_set=name)
        err[name] = float(np.abs(monotone_predictions(model, held) - test_a)[0])
    assert err["calibrated"] < 0.15 and err["full"] > 2 * err["calibrated"], err

"""The synthetic production-like trace meets its calibration targets (PAPER.md §1)."""

import argparse
import hashlib
import json

import numpy as np
import pytest

from janusd import trace_cli
from janusd.trace.formats import read_trace
from janusd.trace.stats import max_burst_ratio, trace_stats
from janusd.trace.synth import SynthParams, app_profiles, synthesize, top_k


def test_top_k_definition():
    assert (top_k(62, 0.12), top_k(62, 0.30), top_k(3, 0.12), top_k(10, 0.3)) == (7, 19, 1, 3)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_skew_targets_hold_for_several_seeds(seed):
    t = synthesize(SynthParams(seed=seed, hours=1, rate=20))
    s = trace_stats(t)
    assert s["apps"] == 62
    assert abs(s["requests"] - 72000) < 72000 * 0.03
    assert s["top12pct_request_share"] == pytest.approx(0.80, abs=0.02)
    assert s["top30pct_token_share"] == pytest.approx(0.80, abs=0.03)
    assert 3590 < s["duration_s"] <= 3600


def test_popular_apps_are_short_and_some_tail_apps_long_context():
    t = synthesize(SynthParams(seed=5, hours=1, rate=20))
    reqs = np.bincount(t.app_id, minlength=62)
    toks = np.bincount(t.app_id, weights=t.input_tokens + t.output_tokens, minlength=62) / reqs
    order = np.argsort(-reqs)
    head, tail = order[:7], order[7:]
    assert np.average(toks[head], weights=reqs[head]) < 0.6 * toks[tail].mean()
    kinds = [p.kind for p in app_profiles(SynthParams(seed=5))]
    rag = [a for a in range(62) if kinds[a] == "rag"]
    assert rag and max(toks[a] for a in rag) > 4 * toks[order[0]]
    assert t.input_tokens.min() >= 1 and t.input_tokens.max() <= 32000 and t.output_tokens.max() <= 4096


def test_diurnal_shape():
    t = synthesize(SynthParams(seed=0, hours=24, rate=1))
    per_hour = np.bincount((t.arrival_s // 3600).astype(int), minlength=24)
    assert per_hour[12:16].sum() > 1.8 * per_hour[0:4].sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bursts_raise_an_apps_rate_several_fold(seed):
    calm = synthesize(SynthParams(seed=seed, hours=0.5, rate=50, bursts_per_app_hour=0))
    bursty = synthesize(SynthParams(seed=seed, hours=0.5, rate=50, bursts_per_app_hour=2))
    assert max_burst_ratio(calm) < 2.5
    assert max_burst_ratio(bursty) > 4.5


def test_deterministic_for_a_seed():
    a, b = (synthesize(SynthParams(seed=7, hours=0.5)) for _ in range(2))
    c = synthesize(SynthParams(seed=8, hours=0.5))
    for col in ("arrival_s", "app_id", "input_tokens", "output_tokens", "ttft_slo_ms"):
        assert np.array_equal(getattr(a, col), getattr(b, col))
    assert not np.array_equal(a.input_tokens[:100], c.input_tokens[:100])
    assert np.all(np.diff(a.arrival_s) >= 0)


def test_bad_params():
    for kw in ({"apps": 0}, {"hours": 0}, {"rate": -1}, {"top12_request_share": 1.0}, {"rate": 1e6}):
        with pytest.raises(ValueError):
            synthesize(SynthParams(**kw))


def test_cli_synth_is_byte_deterministic(tmp_path, capsys):
    def run(out):
        p = argparse.ArgumentParser()
        trace_cli.add_arguments(p)
        return trace_cli.run(p.parse_args(["synth", "--apps", "12", "--hours", "0.25", "--seed", "4", "--out", str(out)]))

    assert run(tmp_path / "a.csv") == 0 and run(tmp_path / "b.csv") == 0
    digest = [hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() for n in ("a.csv", "b.csv")]
    assert digest[0] == digest[1]
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    t = read_trace(tmp_path / "a.csv")
    assert line["requests"] == len(t) and line["apps"] == 12 and t.has_slo


def test_clipped_lognormal_mean_matches_monte_carlo():
    from janusd.trace.synth import clipped_lognormal_mean

    rng = np.random.default_rng(0)
    for mean, sigma, hi in ((1000.0, 1.0, 2048), (300.0, 0.6, 32000), (20.0, 1.2, 16)):
        x = np.clip(rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, 400_000), 1, hi)
        assert clipped_lognormal_mean(np.array([mean]), np.array([sigma]), 1, hi)[0] == pytest.approx(x.mean(), rel=0.01)

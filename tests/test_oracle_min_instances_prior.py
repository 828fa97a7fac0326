"""min_instances on the roofline prior: the galloping search over single counts gives the
grid's answer (oracle/elasticity.py), count for count and estimate for estimate."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.hw import ModelSpec, device_spec
from janusd.oracle import elasticity
from janusd.oracle.elasticity import min_instances
from janusd.oracle.prior import RooflinePrior
from janusd.oracle.types import LoadFeatures

SPEC = ModelSpec.from_config({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                              "torch_dtype": "bfloat16"})


class Delegate:
    """The same raw curve behind a type min_instances does not know as monotone: it takes
    the grid path (the reference)."""

    def __init__(self, prior: RooflinePrior) -> None:
        self.prior = prior
        self.asked: list[int] = []

    def raw_attainment(self, load, instances):
        self.asked.extend(int(m) for m in instances)
        return self.prior.raw_attainment(load, instances)


class Counting(RooflinePrior):
    asked: list[int]

    def raw_attainment(self, load, instances):
        self.asked.extend(int(m) for m in instances)
        return super().raw_attainment(load, instances)


def _prior(ttft: float, tpot: float, device: str = "ascend-910c-die") -> Counting:
    p = Counting(SPEC, device_spec(device), ttft, tpot)
    p.asked = []
    return p


@settings(max_examples=300, deadline=None)
@given(rate=st.floats(0.01, 3000), lin=st.floats(16, 8000), lout=st.floats(4, 2000), cv=st.floats(0, 1.5),
       ttft=st.floats(0.2, 5), tpot=st.floats(0.02, 0.2), target=st.floats(0.5, 0.999),
       limit=st.integers(1, 200), device=st.sampled_from(["ascend-910c-die", "h100"]))
def test_search_agrees_with_the_grid(rate, lin, lout, cv, ttft, tpot, target, limit, device):
    prior = _prior(ttft, tpot, device)
    z = LoadFeatures(rate, rate * lin, rate * lout, lin, (cv * lin) ** 2, lout, (cv * lout) ** 2)
    got = min_instances(prior, z, target, 1.0, limit, "prior")
    want = min_instances(Delegate(prior), z, target, 1.0, limit, "prior")
    assert got == want  # m, the estimate's mean and std, and the reason, exactly


def test_search_asks_few_counts():
    """m* = 1 costs one pressure, a large m* about 2 log2(m*), none reachable about
    log2(limit); the grid asked 64 every time."""
    z = LoadFeatures(1.0, 500.0, 200.0, 500.0, 0.0, 200.0, 0.0)
    p = _prior(1.0, 0.05)
    assert min_instances(p, z, 0.95, 1.0, 64, "prior").m == 1 and p.asked == [1]
    ms = {}
    for rate in (20.0, 100.0, 300.0):
        zl = LoadFeatures(rate, rate * 2000, rate * 300, 2000.0, 0.0, 300.0, 0.0)
        p = _prior(1.0, 0.05)
        ms[rate] = min_instances(p, zl, 0.95, 1.0, 64, "prior").m
        assert ms[rate] is not None and len(p.asked) <= 2 * int(np.log2(ms[rate])) + 2, (ms[rate], p.asked)
    assert ms[20.0] < ms[100.0] < ms[300.0]
    zh = LoadFeatures(1e6, 1e6 * 8000, 1e6 * 2000, 8000.0, 0.0, 2000.0, 0.0)
    p = _prior(0.2, 0.02)
    r = min_instances(p, zh, 0.95, 1.0, 64, "prior")
    assert r.m is None and "below the target" in r.reason and len(p.asked) <= 8


def test_grid_is_still_used_for_other_sources():
    ref = Delegate(_prior(1.0, 0.05))
    min_instances(ref, LoadFeatures(1.0, 500.0, 200.0, 500.0, 0.0, 200.0, 0.0), 0.95, 1.0, 10, "x")
    assert ref.asked == list(range(1, elasticity.grid(10) + 1))

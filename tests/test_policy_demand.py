"""Predictions into demands (policy/demand.py), through the closed-form predictors of
policy_fakes.py that satisfy oracle/types.py's Protocols."""

from __future__ import annotations

import pytest

from janusd.oracle.types import CapacityPredictor, ElasticityPredictor
from janusd.policy.demand import SteadyModel, elastic_demand, prefill_share, scaled, steady_items
from janusd.policy.policy_config import DemandConfig
from policy_fakes import LinearCapacity, LogisticAttainment, load


def test_fakes_satisfy_the_protocols():
    cap: CapacityPredictor = LinearCapacity()
    ela: ElasticityPredictor = LogisticAttainment()
    assert cap.capacity("m", load(1.0)).mean[1] == 0.1 and ela.attainment("m", load(1.0), 1).mean > 0.9


def test_a_model_too_big_for_one_device_is_split_into_the_fewest_replicas():
    # rate 25: compute 2.5 * 1.1 = 2.75 -> 3 replicas at 0.917 each
    (d,) = steady_items([SteadyModel(model="big", load=load(25.0))], LinearCapacity(), DemandConfig())
    assert [i.key for i in d.items] == ["big", "big#1", "big#2"]
    assert d.items[0].vector == pytest.approx((0.33, 0.1 * 25 / 3 * 1.1, 0.08 * 25 / 3 * 1.1))
    (small,) = steady_items([SteadyModel(model="s", load=load(2.0))], LinearCapacity(), DemandConfig())
    assert [i.key for i in small.items] == ["s"] and small.items[0].vector == pytest.approx((0.33, 0.22, 0.176))


def test_a_change_in_replica_count_keeps_the_first_replicas_key_and_placement():
    """r going 1 -> 2 -> 1 must not rename the first replica: the placement would remove
    the serving instance and place a "new" one, and the model would not serve meanwhile."""
    from janusd.policy import placement
    from janusd.policy.policy_config import PlacementConfig
    from janusd.policy.snapshot import PlacementSnapshot

    cfg = DemandConfig()
    (one,) = steady_items([SteadyModel(model="m", load=load(8.0))], LinearCapacity(), cfg)
    (two,) = steady_items([SteadyModel(model="m", load=load(12.0))], LinearCapacity(), cfg)
    assert [i.key for i in one.items] == ["m"] and [i.key for i in two.items] == ["m", "m#1"]
    for before, after in ((one, two), (two, one)):
        cur = placement.plan(PlacementSnapshot(pool=tuple(range(4)), items=before.items, current=()),
                             PlacementConfig(), consolidate=False, migrations_left=0).assignment
        first = next(a for a in cur if a.key == "m")
        plan = placement.plan(PlacementSnapshot(pool=tuple(range(4)), items=after.items, current=cur),
                              PlacementConfig(), consolidate=False, migrations_left=0)
        assert not [mv for mv in plan.moves if mv.key == "m"], plan.moves  # the first replica stays put
        assert next(a for a in plan.assignment if a.key == "m").device == first.device


def test_margin_is_applied_and_pinned_models_keep_their_devices():
    (d,) = steady_items([SteadyModel(model="p", load=load(4.0), devices=(3, 1))], LinearCapacity(),
                        DemandConfig(capacity_margin=0.0))
    assert [(i.key, i.pinned_device, i.vector) for i in d.items] == [("p#1", 1, (0.3, 0.2, 0.16)),
                                                                     ("p#3", 3, (0.3, 0.2, 0.16))]


def test_a_model_beyond_the_replica_limit_has_no_items_and_says_why():
    (d,) = steady_items([SteadyModel(model="huge", load=load(1000.0))], LinearCapacity(),
                        DemandConfig(max_steady_replicas=4))
    assert d.items == () and "even at 4 replicas" in d.reason


def test_elastic_demand_is_m_star_or_the_limit():
    m, why = elastic_demand("a", load(10.0), LogisticAttainment(), DemandConfig(attainment_target=0.95))
    assert m == 9 and why.startswith("m=9")  # x = 0.9: 1/(1+e^-3.2) = 0.961 - 0.01 >= 0.95; m=8: 0.832
    m, why = elastic_demand("a", load(100.0), LogisticAttainment(), DemandConfig(max_elastic_instances=8))
    assert m == 8 and "no count up to 8" in why


def test_scaled_divides_rates_not_lengths():
    s = scaled(load(10.0), 0.25)
    assert (s.request_rate, s.input_token_rate, s.output_token_rate, s.input_len_mean) == (2.5, 250.0, 125.0, 100.0)


def test_prefill_share_is_prefill_time_over_all_device_time():
    # 1000 input tok/s at 0.1 ms each = 0.1 s/s; 500 output tok/s at 0.6 ms each = 0.3 s/s
    assert prefill_share(load(10.0), 1e-4, 6e-4) == pytest.approx(0.25)
    assert prefill_share(load(0.0), 1e-4, 6e-4) == 0.5
    with pytest.raises(ValueError, match="per-token costs"):
        prefill_share(load(1.0), -1.0, 1e-3)

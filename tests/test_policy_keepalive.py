"""Keep-alive (policy/keepalive.py): Active -> Warm -> Cold by idle time, back to Active
on a request, pinned models kept."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.policy.keepalive import KeepAliveError, residency
from janusd.policy.policy_config import KeepAliveConfig
from janusd.policy.snapshot import ModelActivity

CFG = KeepAliveConfig(warm_after_s=300.0, cold_after_s=3600.0)


def one(now, **kw):
    kw.setdefault("model", "m")
    kw.setdefault("residency", "active")
    kw.setdefault("since", 0.0)
    kw.setdefault("last_request_at", None)
    (d,) = residency([ModelActivity(**kw)], now, CFG)
    return d


def test_idle_model_goes_warm_then_cold():
    assert one(299.0, last_request_at=0.0).residency == "active"
    d = one(300.0, last_request_at=0.0)
    assert (d.residency, d.changed, d.reason) == ("warm", True, "idle 300 s >= 300 s")
    assert one(3599.0, residency="warm", since=300.0, last_request_at=0.0).residency == "warm"
    assert one(3600.0, residency="warm", since=300.0, last_request_at=0.0).residency == "cold"
    assert one(4000.0, last_request_at=0.0).residency == "cold"  # a late tick skips Warm


def test_a_request_brings_it_back_and_a_restore_restarts_the_clock():
    d = one(5000.0, residency="cold", since=3600.0, last_request_at=4999.0)
    assert (d.residency, d.changed) == ("active", True) and "arrived while cold" in d.reason
    assert one(5000.0, residency="warm", since=400.0, last_request_at=0.0, in_flight=1).residency == "active"
    # restored at 5001 for a request at 4999: a full warm_after_s from the restore
    assert one(5300.0, since=5001.0, last_request_at=4999.0).residency == "active"
    assert one(5301.0, since=5001.0, last_request_at=4999.0).residency == "warm"


def test_pinned_models_stay_unless_allowed_and_in_flight_blocks_demotion():
    assert one(10_000.0, pinned=True).residency == "active"
    (d,) = residency([ModelActivity(model="m", residency="active", since=0.0, last_request_at=None, pinned=True)],
                     10_000.0, KeepAliveConfig(demote_pinned=True))
    assert d.residency == "cold"
    assert one(10_000.0, in_flight=2).residency == "active"


@given(st.lists(st.floats(0.0, 10_000.0), min_size=1, max_size=20), st.floats(0.0, 20_000.0))
@settings(max_examples=200)
def test_residency_only_deepens_with_idle_time_and_never_restores_without_a_request(reqs, now):
    last = max(r for r in reqs if r <= now) if any(r <= now for r in reqs) else None
    for res, since in (("active", 0.0), ("warm", 0.0), ("cold", 0.0)):
        d = one(now, residency=res, since=since, last_request_at=last)
        if last is None:
            assert d.residency != "active" or res == "active"
        rank = {"active": 0, "warm": 1, "cold": 2}
        if not (res != "active" and last is not None and last >= since):
            assert rank[d.residency] >= rank[res]


def test_bad_input_is_refused():
    with pytest.raises(KeepAliveError, match="'m' appears twice"):
        residency([ModelActivity(model="m", residency="active", since=0.0, last_request_at=None)] * 2, 1.0, CFG)
    with pytest.raises(KeepAliveError, match="now"):
        residency([], float("inf"), CFG)
    with pytest.raises(msgspec.ValidationError, match="cold_after_s"):
        msgspec.convert({"warm_after_s": 10.0, "cold_after_s": 5.0}, KeepAliveConfig)

"""control/counts.py's scale-in order ([W]): a surplus instance whose device it leaves
empty goes first, so that the device stops counting Active device-seconds; among
instances that share their devices, the steady pool's device goes first, then the least
busy. Pure: a scripted ModelView, no core."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from janusd.control.counts import meet_count
from janusd.control.ops import Rest
from janusd.control.snapshot import InstanceView, ModelView
from janusd.lifecycle.states import InstanceState
from janusd.telemetry.telemetry import ModelWindow

S = InstanceState


def _model(devices: list[int]) -> ModelView:
    window = ModelWindow("m", *([0.0] * 8), 0, 0, 0, 0.0, 0, 0)
    return ModelView("m", {d: InstanceView(d, S.ACTIVE) for d in devices}, window, devices=tuple(devices))


def test_the_replica_alone_on_its_device_rests_before_the_one_beside_the_steady_models():
    """The bench cluster's case: the bursty model serves on device 0 (the steady pool's,
    four other models there) and on device 1 (alone). Resting device 0's instance kept
    device 1 Active for nothing; device 1's goes Warm."""
    others = {0: 4, 1: 0}
    ops = meet_count(_model([0, 1]), 1, "m*=1", {}, lambda d: 0, {0}, others.__getitem__, False)
    assert ops == [Rest(model="m", device=1, reason="scale in: m*=1", target="warm")]


def test_when_every_device_is_shared_the_steady_one_then_the_least_busy_goes_first():
    ops = meet_count(_model([0, 1, 2]), 1, "x", {}, {0: 5, 1: 9, 2: 1}.__getitem__, {1}, lambda d: 2, False)
    assert [o.device for o in ops] == [1, 2]


@given(st.lists(st.integers(0, 3), min_size=4, max_size=4), st.integers(1, 4))
def test_a_scale_in_frees_as_many_devices_as_its_rests_can(others: list[int], keep: int) -> None:
    """Whatever the other models' spread, the rests take the lone devices first: the
    devices left empty are min(rests, lone devices), and one instance always serves."""
    ops = meet_count(_model([0, 1, 2, 3]), keep, "x", {}, lambda d: 0, set(), others.__getitem__, False)
    rested = [o.device for o in ops]
    assert len(rested) == 4 - keep and all(isinstance(o, Rest) and o.target == "warm" for o in ops)
    lone = [d for d in range(4) if others[d] == 0]
    assert sum(1 for d in rested if others[d] == 0) == min(len(rested), len(lone))


def test_a_budget_the_steady_pool_compressed_takes_its_device_back_first():
    """m* asks 4, the budget gives 3 (a steady model took device 3): the instance beside
    the steady model goes, though the others are alone on theirs (tests/
    test_controller_steady.py checks the same through the room)."""
    others = {0: 0, 1: 0, 2: 0, 3: 1}
    ops = meet_count(_model([0, 1, 2, 3]), 3, "x", {}, lambda d: 0, {3}, others.__getitem__, True)
    assert [o.device for o in ops] == [3]
    assert [o.device for o in meet_count(_model([0, 1, 2, 3]), 3, "x", {}, lambda d: 0, {3}, others.__getitem__,
                                         False)] == [2]

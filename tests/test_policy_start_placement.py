"""The first placement at start (policy/start_placement.py): models without `devices`
are packed by the placement policy on their zero-load vectors (pinned models' vectors
counting on their devices, elastic devices taken last), so that the first slow tick,
planning from where they came up, moves nothing; a model the oracle cannot size or that
fits no device is left to round robin, with the reason."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.oracle.types import LoadFeatures, ResourceEstimate
from janusd.policy.demand import SteadyModel
from janusd.policy.placement import pack, plan
from janusd.policy.policy_config import DemandConfig, PlacementConfig
from janusd.policy.snapshot import PlacementSnapshot, SteadyItem
from janusd.policy.start_placement import NO_LOAD, start_placement

DEMAND, PLACEMENT = DemandConfig(), PlacementConfig()


class FixedVectors:
    """Each model's capacity vector at any load (KeyError for a model it does not know:
    what the oracle says before it has read a checkpoint)."""

    def __init__(self, vectors: dict[str, tuple[float, float, float]]) -> None:
        self.vectors = vectors

    def capacity(self, model: str, features: LoadFeatures) -> ResourceEstimate:
        if model not in self.vectors:
            raise KeyError(f"the oracle knows nothing of model {model!r}")
        return ResourceEstimate(mean=self.vectors[model], std=(0.0, 0.0, 0.0), source="fixed")


def test_models_without_devices_are_packed_not_spread():
    pred = FixedVectors({"a": (0.3, 0.1, 0.1), "b": (0.3, 0.2, 0.1), "c": (0.3, 0.1, 0.2), "d": (0.5, 0.1, 0.1)})
    res = start_placement(["a", "b", "c", "d"], [], (0, 1, 2, 3), pred, DEMAND, PLACEMENT)
    used = {d for ds in res.placed.values() for d in ds}
    assert set(res.placed) == {"a", "b", "c", "d"} and all(len(ds) == 1 for ds in res.placed.values())
    assert len(used) == 2 == len(set(pack([pred.vectors[m] for m in "abcd"])))  # round robin would use 4
    for dev in used:  # every device fits in all three dimensions
        load = [sum(pred.vectors[m][k] for m, ds in res.placed.items() if dev in ds) for k in range(3)]
        assert max(load) <= 1.0 + 1e-9, (dev, load)
    assert res.notes == ()


def test_a_pinned_model_counts_on_its_device_and_elastic_devices_go_last():
    pred = FixedVectors({"pinned": (0.8, 0.1, 0.1), "a": (0.3, 0.1, 0.1), "b": (0.3, 0.1, 0.1)})
    res = start_placement(["a", "b"], [SteadyModel(model="pinned", load=NO_LOAD, devices=(0,))], (0, 1, 2, 3),
                          pred, DEMAND, PLACEMENT, elastic_devices=(1,))
    assert res.placed == {"a": (2,), "b": (2,)}  # not on 0 (0.8 + 0.3 > 1), not on the elastic 1


def test_what_the_oracle_cannot_size_or_no_device_holds_is_left_to_round_robin():
    pred = FixedVectors({"a": (0.3, 0.1, 0.1), "huge": (1.5, 0.1, 0.1)})
    res = start_placement(["a", "huge", "unknown"], [SteadyModel(model="pinned-unknown", load=NO_LOAD, devices=(0,))],
                          (0, 1), pred, DEMAND, PLACEMENT)
    assert res.placed == {"a": (0,)}  # an unknown pinned model counts as nothing, as in the slow tick
    assert any(n.startswith("unknown: ") and "round robin" in n for n in res.notes), res.notes
    assert any(n.startswith("huge: exceeds one device") for n in res.notes), res.notes
    # nothing to place at all: no plan
    assert start_placement(["unknown"], [], (0, 1), pred, DEMAND, PLACEMENT).plan is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 0.7), st.floats(0.0, 0.7), st.floats(0.0, 0.7)), min_size=1, max_size=8),
       st.integers(0, 2))
def test_the_first_slow_tick_moves_nothing_it_placed(vectors, pinned):
    """Planning again (consolidation and its budget, as the slow tick does) from where the
    start placement put the models gives no move and no more devices."""
    names = [f"m{i}" for i in range(len(vectors))]
    pred = FixedVectors(dict(zip(names, vectors)))
    pins = [SteadyModel(model=n, load=NO_LOAD, devices=(k,)) for k, n in enumerate(names[:pinned])]
    res = start_placement(names[pinned:], pins, tuple(range(8)), pred, DEMAND, PLACEMENT)
    if res.plan is None:
        return
    items = [SteadyItem(key=n, model=n, vector=pred.vectors[n], pinned_device=p.devices[0])
             for n, p in ((p.model, p) for p in pins)]
    items += [SteadyItem(key=n, model=n, vector=pred.vectors[n]) for n in res.placed]
    current = tuple(a for a in res.plan.assignment if a.key in res.placed)
    again = plan(PlacementSnapshot(pool=tuple(range(8)), items=tuple(sorted(items, key=lambda i: i.key)),
                                   current=current), PLACEMENT, consolidate=True)
    assert again.moves == () and again.bins_used == res.plan.bins_used, (res.plan, again.moves)

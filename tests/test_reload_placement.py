"""Models a SIGHUP reload adds, placed by server/steady.py added_placement (through
policy/start_placement.py) around what serves now, instead of round robin: the real
ServingCore (registry, telemetry) with fake workers, a table CapacityPredictor (fakes at
the edge). The serving models count where they serve, at their load now."""

from __future__ import annotations

import asyncio

from janusd.config import ControlConfig, DevicesConfig, JanusConfig, ModelConfig
from janusd.policy.pinned import place
from janusd.server.steady_start import added_placement

from core_fakes import Rig
from test_controller_steady import FixedCapacity


def _cfg(managed: bool = True) -> JanusConfig:
    models = [ModelConfig(name="pinned", checkpoint="demo:llama-tiny", devices=[0]),
              ModelConfig(name="a", checkpoint="demo:llama-tiny"),
              ModelConfig(name="b", checkpoint="demo:llama-tiny"),
              ModelConfig(name="new", checkpoint="demo:llama-tiny")]
    return JanusConfig(devices=DevicesConfig(count=3), control=ControlConfig(managed=managed), models=models)


def _rig() -> Rig:
    """pinned on 0; a and b (the controller's) both serve on 1, where it packed them."""
    rig = Rig(devices=3)
    rig.model("pinned", [0])
    rig.activate("pinned", 0)
    for name in ("a", "b"):
        rig.model(name, [1])
        rig.activate(name, 1)
    return rig


VECTORS = {"pinned": (0.9, 0.9, 0.9), "a": (0.3, 0.1, 0.1), "b": (0.2, 0.2, 0.2), "new": (0.4, 0.1, 0.1)}


def _place(rig: Rig, cfg: JanusConfig, pred: FixedCapacity, elastic: tuple[str, ...] = ()) -> dict[str, list[int]]:
    added = [m for m in cfg.models if m.name == "new"]
    described: list[list[str]] = []

    def describe(models):
        described.append([m.name for m in models])
        return []

    out = asyncio.run(added_placement(cfg, added, rig.core, describe, pred, elastic,
                                      rig.now))
    assert described == [["new"]]  # the oracle reads the new model's checkpoint first
    return out


def test_a_model_added_by_a_reload_is_packed_beside_what_serves_not_round_robin():
    cfg = _cfg()
    assert place(cfg.models, 3)["new"] == [2]  # round robin: a -> 0, b -> 1, new -> 2
    rig = _rig()
    assert _place(rig, cfg, FixedCapacity(VECTORS)) == {"new": [1]}  # fits beside a and b: no new device


def test_the_serving_models_count_at_their_load_now():
    rig = _rig()
    pred = FixedCapacity({**VECTORS, "a": (0.3, 0.5, 0.5)})
    pred.per_rps = {"a"}
    for _ in range(30):
        rig.submit("a", ttft_ms=100_000)
    rate = rig.core.telemetry.model("a", rig.now).request_rate
    assert 0.5 * rate + 0.2 + 0.1 > 1.0  # a's traffic leaves no room for new on device 1
    assert _place(rig, _cfg(), pred) == {"new": [2]}


def test_elastic_devices_are_taken_last_and_unsized_or_unmanaged_fall_back_to_round_robin():
    rig = _rig()
    # a and b elastic: device 1 is the elastic pool's, so new opens device 2 (taken before it)
    assert _place(rig, _cfg(), FixedCapacity(VECTORS), elastic=("a", "b")) == {"new": [2]}
    unsized = {k: v for k, v in VECTORS.items() if k != "new"}
    assert _place(rig, _cfg(), FixedCapacity(unsized)) == {"new": [2]}  # no prior: round robin
    added = [m for m in _cfg(managed=False).models if m.name == "new"]
    out = asyncio.run(added_placement(_cfg(managed=False), added, rig.core,
                                      lambda ms: [], FixedCapacity(VECTORS), (), rig.now))
    assert out == {"new": [2]}  # not managed: policy/pinned.py as before

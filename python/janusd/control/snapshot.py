"""What the control room sees: one frozen snapshot of the models, their instances and
their traffic, built by a shell (control/observe.py reads a ServingCore for both) and
never changed by the room. Its own module so that every rule of the room reads the
same nouns, and so that a test can script a world without a core."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from janusd.lifecycle.states import COMING_UP, InstanceState
from janusd.oracle.types import CapacityPredictor, ElasticityPredictor, LoadFeatures
from janusd.telemetry.telemetry import ModelWindow

S = InstanceState


class Predictor(CapacityPredictor, ElasticityPredictor, Protocol):
    """The oracle as the room asks it: capacity vectors (steady) and m* (elastic)."""


@dataclass(frozen=True)
class InstanceView:
    """One instance: a model on a device, in a state of lifecycle/states.py."""

    device: int
    state: InstanceState
    role: str = "mixed"
    error: str = ""

    @property
    def serving(self) -> bool:
        """Active, or on its way there: counts toward a model's instances."""
        return self.state is S.ACTIVE or self.state in COMING_UP


@dataclass(frozen=True)
class ModelView:
    """One model as the room sees it. `devices`: the operator's devices (empty: the
    controller places it); `pool`: its config's pin (auto, steady, elastic);
    `own_load`: its requests in flight per device (the length of a drain there);
    `prefill_share`: prefill's part of its device time (P/D models; observe.py); `tp`: the
    devices of one instance, a group led by the device its instance is keyed by
    (control/groups.py)."""

    name: str
    instances: Mapping[int, InstanceView]
    window: ModelWindow
    devices: tuple[int, ...] = ()
    pd: bool = False
    pool: str = "auto"
    requests: int = 0
    own_load: Mapping[int, int] = field(default_factory=dict)
    prefill_share: float = 0.5
    tp: int = 1

    @property
    def load(self) -> LoadFeatures:
        return LoadFeatures.from_window(self.window)

    def serving_devices(self) -> list[int]:
        """Devices where the model is Active or on its way there: where it serves."""
        return sorted(d for d, i in self.instances.items() if i.serving)


@dataclass(frozen=True)
class ControlSnapshot:
    """The world at one tick. `models` in the registry's order; `device_load`: requests
    in flight per device, any model's; `pool`: the devices the controller may place on
    (control.pool_devices, else all); `managed`: the controller places and scales."""

    models: Mapping[str, ModelView]
    n_devices: int
    pool: tuple[int, ...]
    predictor: Predictor
    managed: bool = True
    device_load: Mapping[int, int] = field(default_factory=dict)

    def placed_by_controller(self, m: ModelView) -> bool:
        """A model the steady placement moves: managed mode, no `devices`, not P/D."""
        return self.managed and not m.devices and not m.pd

    def load_on(self, device: int) -> int:
        return self.device_load.get(device, 0)

    def others_on(self, device: int, model: str) -> int:
        """How many models besides `model` serve on `device` (what an instance there shares)."""
        return sum(1 for o in self.models.values()
                   if o.name != model and device in o.instances and o.instances[device].serving)

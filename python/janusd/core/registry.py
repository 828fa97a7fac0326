"""What is served: models, and their instances with one state each.

A Model exists independently of its instances: it owns its config (SLOs, checkpoint,
roles) and the facts learnt from its instances (context length). An Instance is a model
on a device; its `state` (lifecycle/states.py) is the single record of whether it
serves. The registry only stores; ServingCore changes states (core/instance_moves.py, so
the Dispatcher and the telemetry follow every change) and server/model_ops.py talks to
workers.

Admission asks, per request, which instances of the model are Active, whether the model
serves and its context length: at 768 devices a model has ~13 instances and each of those
walks them again. So a Model keeps those answers (`view()`) until the instances change:
every write of an instance's `state`, `role`, `paired` or `max_model_len`, of a model's
`cfg`, and every instance added or dropped bumps one counter (`EPOCH`), and a Model's
view is rebuilt when the counter moved since it was made. The writes stay plain
attribute writes (core/instance_moves.py is still the one place that changes states).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from janusd.config import ModelConfig
from janusd.lifecycle.states import InstanceState, takes_new_work


class _Epoch:
    """A counter of changes to what Model.view() reads (module doc)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


EPOCH = _Epoch()
_WATCHED = frozenset({"state", "role", "paired", "max_model_len"})  # Instance fields a view reads


@dataclass
class Instance:
    """A model on a device. `role`: mixed (whole requests), or prefill / decode for a P/D
    model: set at creation from the config's `prefill_devices`, and changed only while the
    instance rests (ServingCore.set_role: the controller chooses an elastic P/D app's
    roles at activation). `paired`: a prefill instance has an Active decode instance of
    its model to hand its KV to (ServingCore keeps it; always True for other roles)."""

    instance_id: int
    model: str
    device: int
    role: str = "mixed"
    state: InstanceState = InstanceState.UNLOADED
    error: str = ""  # why the last load failed or the worker went away
    load_s: float = 0.0
    max_model_len: int = 0
    served: int = 0  # requests ever assigned to this instance
    saturated: bool = False  # Active, but its device decodes too slowly to take new prefill work
    decoding: dict[int, int] = field(default_factory=dict)  # P/D decode: request -> tokens still to come
    paired: bool = True

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name in _WATCHED:
            EPOCH.n += 1

    @property
    def dispatched(self) -> bool:
        """Takes prefill work from the Dispatcher (every role but a P/D decode instance)."""
        return self.role != "decode"

    @property
    def active(self) -> bool:
        return takes_new_work(self.state)

    @property
    def takes_prefill(self) -> bool:
        """Active, takes prefill work, and (a prefill instance) has a decode instance to
        hand to: what makes a model serve (a saturated one still counts, it frees up)."""
        return self.active and self.dispatched and self.paired


class ModelView(NamedTuple):
    """What admission reads of a model's instances, as of one EPOCH value."""

    epoch: int
    active: tuple[Instance, ...]  # takes new work, in instance order
    prefill: tuple[Instance, ...]  # takes prefill work (takes_prefill), in instance order
    max_model_len: int


@dataclass
class Model:
    cfg: ModelConfig
    instances: dict[int, Instance] = field(default_factory=dict)  # device -> instance
    _view: ModelView | None = field(default=None, repr=False, compare=False)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "cfg":
            EPOCH.n += 1

    def view(self) -> ModelView:
        """Active and prefill-taking instances and the context length, rebuilt only after a
        change (module doc)."""
        v = self._view
        if v is not None and v.epoch == EPOCH.n:
            return v
        insts = list(self.instances.values())
        active = tuple(i for i in insts if i.active)
        lens = [i.max_model_len for i in active if i.max_model_len]
        v = ModelView(EPOCH.n, active, tuple(i for i in insts if i.takes_prefill),
                      min(lens) if lens else self.cfg.max_model_len)
        object.__setattr__(self, "_view", v)
        return v

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def pd(self) -> bool:
        """A P/D model (config `prefill_devices`): its instances' roles may differ."""
        return bool(self.cfg.prefill_devices)

    def role_on(self, device: int) -> str:
        """The configured role on `device` (an instance's role when it is made)."""
        if not self.cfg.prefill_devices:
            return "mixed"
        return "prefill" if device in self.cfg.prefill_devices else "decode"

    def engine_cfg(self, device: int) -> ModelConfig:
        """The ModelConfig sent to the worker: its role is the instance's role (the
        configured one for a device without an instance yet)."""
        inst = self.instances.get(device)
        role = inst.role if inst is not None else self.role_on(device)
        return self.cfg if role == "mixed" else msgspec.structs.replace(self.cfg, role=role)

    @property
    def active(self) -> list[Instance]:
        return list(self.view().active)

    @property
    def serving(self) -> bool:
        """Some instance takes new prefill work and can finish it (a mixed one, or a
        prefill one with an Active decode partner): queued requests can be dispatched."""
        return bool(self.view().prefill)

    @property
    def max_model_len(self) -> int:
        return self.view().max_model_len


class Registry:
    def __init__(self) -> None:
        self.models: dict[str, Model] = {}
        self.instances: dict[int, Instance] = {}
        self._by_device: dict[int, dict[int, Instance]] = {}  # device -> instance id -> instance
        self._next_id = 1

    def add_model(self, cfg: ModelConfig) -> Model:
        if cfg.name in self.models:
            raise ValueError(f"model {cfg.name!r} exists already")
        m = Model(cfg)
        self.models[cfg.name] = m
        return m

    def model(self, name: str) -> Model | None:
        return self.models.get(name)

    def new_instance(self, model: Model, device: int) -> Instance:
        if device in model.instances:
            raise ValueError(f"model {model.name!r} has an instance on device {device} already")
        inst = Instance(self._next_id, model.name, device, role=model.role_on(device))
        self._next_id += 1
        model.instances[device] = inst
        EPOCH.n += 1
        self.instances[inst.instance_id] = inst
        self._by_device.setdefault(device, {})[inst.instance_id] = inst
        return inst

    def _unindex(self, inst: Instance) -> None:
        self.instances.pop(inst.instance_id, None)
        on = self._by_device.get(inst.device)
        if on is not None:
            on.pop(inst.instance_id, None)
            if not on:
                del self._by_device[inst.device]

    def drop_instance(self, inst: Instance) -> None:
        self._unindex(inst)
        m = self.models.get(inst.model)
        if m is not None and m.instances.get(inst.device) is inst:
            del m.instances[inst.device]
            EPOCH.n += 1

    def drop_model(self, name: str) -> Model | None:
        m = self.models.pop(name, None)
        if m is not None:
            EPOCH.n += 1
            for inst in list(m.instances.values()):
                self._unindex(inst)
        return m

    def on_device(self, device: int) -> list[Instance]:
        """The instances on `device`, oldest first (an index: the decode guard and device
        events look up a few devices among hundreds)."""
        return list(self._by_device.get(device, {}).values())

"""The controller's vocabulary, apart from its loops: the operations a plan asks for, a
finished one as `ctl plan` shows it, what the controller needs of the daemon, and how
an instance counts toward a model's instances. Its own module so that the plan helpers
(server/controller_*.py) share it without importing the controller."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from janusd.config import JanusConfig
from janusd.core.registry import Instance
from janusd.core.serving import ServingCore
from janusd.lifecycle.states import COMING_UP, InstanceState
from janusd.oracle.types import CapacityPredictor, ElasticityPredictor

S = InstanceState


class Predictor(CapacityPredictor, ElasticityPredictor, Protocol):
    """The oracle as the controller asks it: capacity vectors (steady) and m* (elastic)."""


class ControllerHost(Protocol):
    """What the controller needs of the daemon (server/daemon.py implements it)."""

    core: ServingCore

    @property
    def cfg(self) -> JanusConfig: ...

    def predictor(self) -> Predictor: ...

    async def set_state(self, name: str, device: int, target: str, probe: bool = True,
                        role: str | None = None) -> dict[str, Any]: ...

    async def fork(self, name: str, src: int, dst: int) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Op:
    """One lifecycle operation a plan asks for, with the reason shown by `ctl plan`."""

    model: str
    device: int
    target: str  # "active" | "warm" | "cold"
    reason: str
    role: str | None = None  # P/D: the engine role an activation comes up in (None: the instance's own)
    reassign: bool = False  # P/D: an Active instance drains to Warm first, then comes up as `role`


@dataclass
class Done:
    """A finished operation, kept for `ctl plan`'s recent list."""

    op: Op
    started: float
    seconds: float
    outcome: str  # "ok" or the error
    phases: dict[str, float] = field(default_factory=dict)


def serving(i: Instance) -> bool:
    """Active, or on its way there: counts toward a model's instances."""
    return i.state is S.ACTIVE or i.state in COMING_UP


def role_state(i: Instance) -> str:
    """An instance's state in policy/roles.py's words (RoleState)."""
    if i.state in COMING_UP:
        return "coming_up"
    if i.state is S.UNLOADED:
        return "failed" if i.error else "unloaded"
    return i.state.value

"""The room's words to its shells: the operations a plan asks for, and a finished one as
`ctl plan` shows it. Its own module so that every rule of the room and both shells
share them without importing the room.

An Op names its path where the room chose one: `source` is the Active peer a new
instance forks from (D2D), None for the lifecycle's own path (H2D from a Warm copy, a
Cold load, or a full load of an Unloaded instance). `then` is the second half of a
steady migration (make before break): the shell runs it only once the first half
succeeded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from janusd.control.snapshot import InstanceView
from janusd.lifecycle.states import COMING_UP, COMING_UP_WORD, FAILED_WORD, InstanceState, TargetWord

S = InstanceState

# the states a plan moves an instance to: the lifecycle's own words (lifecycle/states.py)
Target = TargetWord
# a scale-out or scale-in of elastic scaling: the reasons' first words (metrics, extras)
SCALE_OUT = "scale out"
SCALE_IN = "scale in"


@dataclass(frozen=True)
class Op:
    """One lifecycle operation a plan asks for, with the reason shown by `ctl plan`."""

    model: str
    device: int
    target: Target
    reason: str
    role: str | None = None  # P/D: the engine role an activation comes up in (None: the instance's own)
    reassign: bool = False  # P/D: an Active instance drains to Warm first, then comes up as `role`
    source: int | None = None  # a fork's Active peer (D2D); None: the lifecycle's own path
    then: Op | None = None  # a migration's second half, run once this one succeeded
    steady: bool = False  # a move of the steady placement (the room's executor tracks it)

    @property
    def scales_out(self) -> bool:
        """An operation of elastic scaling that brings up a replica."""
        return self.target == "active" and self.reason.startswith(SCALE_OUT)

    @property
    def scales(self) -> bool:
        return self.reason.startswith(SCALE_OUT) or self.reason.startswith(SCALE_IN)


@dataclass
class Done:
    """A finished operation, kept for `ctl plan`'s recent list."""

    op: Op
    started: float
    seconds: float
    outcome: str  # "ok" or the error
    phases: dict[str, float] = field(default_factory=dict)


InFlight = Mapping[tuple[str, int], tuple[Op, float]]


def role_state(i: InstanceView) -> str:
    """An instance's state in policy/roles.py's words (RoleState)."""
    if i.state in COMING_UP:
        return COMING_UP_WORD
    if i.state is S.UNLOADED:
        return FAILED_WORD if i.error else i.state.value
    return i.state.value


def fork_source(instances: Mapping[int, InstanceView], device: int, prefer: int | None = None) -> int | None:
    """The Active peer a new instance on `device` forks from (the preferred one first,
    then the lowest device), or None when none is Active."""
    peers = sorted((d for d, i in instances.items() if i.state is S.ACTIVE and d != device),
                   key=lambda d: (d != prefer, d))
    return peers[0] if peers else None

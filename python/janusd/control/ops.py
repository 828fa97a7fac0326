"""The room's words to its shells: the operations a plan asks for, and a finished one as
`ctl plan` shows it. Its own module so that every rule of the room and both shells
share them without importing the room.

An Op is a msgspec tagged union of three kinds (Activate, Rest, Reassign); it names its
path where the room chose one: an Activate's `source` is the Active peer a new instance
forks from (D2D), None for the lifecycle's own path. An Activate's `then` is the second
half of a steady migration (make before break): the shell runs it only once the first
half succeeded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from janusd.control.snapshot import InstanceView
from janusd.lifecycle.states import COMING_UP, COMING_UP_WORD, FAILED_WORD, InstanceState, TargetWord

S = InstanceState

# the states a plan moves an instance to: the lifecycle's own words (lifecycle/states.py)
Target = TargetWord
# a scale-out or scale-in of elastic scaling: the reasons' first words (metrics, extras)
SCALE_OUT = "scale out"
SCALE_IN = "scale in"
KEEPALIVE = "keep-alive"
WOKEN = "woken by a request"
# each rule by the first words of its Ops' reasons (steady placement Ops are `steady`)
_RULE_HEADS = (("scale_out", SCALE_OUT), ("scale_in", SCALE_IN), ("keepalive", KEEPALIVE), ("wake", WOKEN),
               ("reassign", "reassign"))
RULES = ("scale_out", "scale_in", "keepalive", "wake", "reassign", "steady", "other")


class _OpBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="op"):
    """What every operation names: the instance (model, device), why, and whether it is
    a steady placement move (the room's SteadyPlanner paces it). `reason` is short text
    that starts with the rule that decided (SCALE_OUT, SCALE_IN, "keep-alive", "steady
    placement", "woken by a request", ...) and carries the figures behind it ("keep-alive:
    warm after idle 312 s >= 300 s"); `ctl plan`, `ctl events`, `janus top` and the log
    show it as it is."""

    model: str
    device: int
    reason: str
    steady: bool = False

    @property
    def kind(self) -> str:
        """The operation's tag: activate | rest | reassign."""
        return str(self.__struct_config__.tag)

    @property
    def reassign(self) -> bool:
        return False

    @property
    def scales_out(self) -> bool:
        """An operation of elastic scaling that brings up a replica."""
        return self.target == "active" and self.reason.startswith(SCALE_OUT)  # type: ignore[attr-defined]

    @property
    def scales(self) -> bool:
        return self.reason.startswith(SCALE_OUT) or self.reason.startswith(SCALE_IN)

    @property
    def rule(self) -> str:
        """The rule that decided it, read from the reason's first words (RULES; the label
        of `janusd_controller_decisions_total`)."""
        if self.steady:
            return "steady"
        return next((rule for rule, head in _RULE_HEADS if self.reason.startswith(head)), "other")


class Activate(_OpBase, frozen=True, kw_only=True, tag="activate"):
    """Bring the instance to Active: a fork from `source` (an Active peer, D2D) when given,
    else the lifecycle's own path (H2D from a Warm copy, a Cold load, a full load of an
    Unloaded instance); `role`: the P/D role it comes up in (None: its own); `then`: a
    migration's second half, run once this one succeeded (make before break)."""

    role: str | None = None
    source: int | None = None
    then: Rest | None = None

    @property
    def target(self) -> TargetWord:
        return "active"


class Rest(_OpBase, frozen=True, kw_only=True, tag="rest"):
    """Drain the instance and rest it Warm (host copy kept) or Cold (nothing kept)."""

    target: TargetWord

    @property
    def role(self) -> None:
        return None


class Reassign(_OpBase, frozen=True, kw_only=True, tag="reassign"):
    """P/D: an Active instance drains to Warm and comes back as `role` (one operation)."""

    role: str

    @property
    def target(self) -> TargetWord:
        return "active"

    @property
    def reassign(self) -> bool:
        return True


# One lifecycle operation a plan asks for: a msgspec tagged union (field "op")
Op = Activate | Rest | Reassign


def group(lead: int, tp: int) -> range:
    """The devices of a tp-device instance keyed by its lead device (control/groups.py:
    aligned groups; an Op's `device` is the lead, the model's tp gives the rest)."""
    return range(lead, lead + max(1, tp))


def halves(op: Op) -> list[Op]:
    """The op and, for a migration, its second half: the instances it holds while in flight."""
    return [op, op.then] if isinstance(op, Activate) and op.then is not None else [op]


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

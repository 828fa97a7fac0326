"""The one state of a model instance, and the one table of moves between states.

An instance is a model on a device (a device group later, with tensor parallelism). Its
state is the only record of whether it serves: Dispatcher membership, /v1/models,
`janus ctl instances` and /metrics are all derived from it (core/registry.py owns the
instances; ServingCore.set_state, in core/instance_moves.py, is the one place that changes
a state). Pure: the daemon and the simulator share it.

Resting states (PAPER.md §8):
- Active: weights in a device weight segment, routable.
- Warm: weights in a host copy on the worker (page-locked where the device kind has it),
  with everything needed to come back without re-parsing the checkpoint; nothing on the
  device. Comes back by H2D (or a D2D fork).
- Cold: only the model's config (and, on disk, a converted image of the weights when one
  was written); comes back by reading the checkpoint or image, then H2D (or a D2D fork).
- Unloaded: the model is known but not placed on this device at all.
Moving states: Loading (a full load, at start or after a worker restart), Restoring
(Warm/Cold -> Active by H2D), Forking (-> Active by a D2D pull from a peer serving the
model), Draining (no new work; in-flight requests finish before leaving Active).
"""

from __future__ import annotations

import enum
from typing import Literal, get_args


class InstanceState(enum.Enum):
    LOADING = "loading"
    ACTIVE = "active"
    DRAINING = "draining"
    UNLOADED = "unloaded"
    WARM = "warm"
    COLD = "cold"
    RESTORING = "restoring"
    FORKING = "forking"

    def __str__(self) -> str:
        return self.value


S = InstanceState

# Allowed moves. Why each exists:
# - Unloaded -> Loading: `ctl load`, start-up, a worker restart reloading its models.
# - Unloaded -> Cold: deployed Cold on a device (config `cold_devices`): placed, nothing held.
# - Unloaded -> Forking: `ctl fork` onto a device the model was not placed on.
# - Loading -> Active: the worker answered ModelLoaded.
# - Loading -> Warm: deployed Warm (config `warm_devices`): the host copy is loaded, the
#   device is not touched.
# - Loading -> Unloaded: the load failed (the error is kept beside the state), or the
#   model was unloaded while it loaded.
# - Loading -> Loading is not a move: a worker that dies mid-load is retried by the
#   restart, which finds the instance Loading already.
# - Active -> Loading: its worker died; the restart reloads it.
# - Active -> Draining: `ctl unload`, `ctl state warm|cold`, a reload, shutdown.
# - Draining -> Unloaded / Warm / Cold: drained (or the drain bound passed and the rest
#   was aborted) and the device memory freed; Unloaded too when the worker died.
# - Warm -> Restoring / Forking: `ctl state active`, `ctl fork`, a request waking it.
# - Warm -> Cold: `ctl state cold` (frees the host copy), or the worker died (the host
#   copy died with it). Warm -> Unloaded: `ctl unload`.
# - Cold -> Restoring / Forking: as from Warm. Cold -> Warm: `ctl state warm` (reads the
#   host copy). Cold -> Unloaded: `ctl unload`.
# - Restoring / Forking -> Active: the weights arrived and were verified.
# - Restoring / Forking -> Warm / Cold / Unloaded: the restore failed (out of device
#   memory, a transfer that died); the instance rolls back to where it was.
# - Restoring / Forking -> Loading: the worker died mid-restore; the restart loads it.
TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    S.UNLOADED: frozenset({S.LOADING, S.COLD, S.FORKING}),
    S.LOADING: frozenset({S.ACTIVE, S.UNLOADED, S.WARM}),
    S.ACTIVE: frozenset({S.LOADING, S.DRAINING}),
    S.DRAINING: frozenset({S.UNLOADED, S.WARM, S.COLD}),
    S.WARM: frozenset({S.RESTORING, S.FORKING, S.COLD, S.UNLOADED}),
    S.COLD: frozenset({S.RESTORING, S.FORKING, S.WARM, S.UNLOADED}),
    S.RESTORING: frozenset({S.ACTIVE, S.WARM, S.COLD, S.UNLOADED, S.LOADING}),
    S.FORKING: frozenset({S.ACTIVE, S.WARM, S.COLD, S.UNLOADED, S.LOADING}),
}

# States an instance comes up through; the worker's answer ends them (Active or a rollback).
COMING_UP = frozenset({S.LOADING, S.RESTORING, S.FORKING})
# States that can be brought to Active by `ctl state active` / a waking request.
RESTORABLE = frozenset({S.WARM, S.COLD})


class IllegalTransition(ValueError):
    """A move the table does not allow; the message names the current state."""


def check_transition(current: InstanceState, target: InstanceState, what: str = "instance") -> None:
    if target not in TRANSITIONS[current]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[current])) or "none"
        raise IllegalTransition(f"{what} is {current.value}: cannot go {target.value} (allowed from "
                                f"{current.value}: {allowed})")


def takes_new_work(state: InstanceState) -> bool:
    """Whether the dispatcher (or the decode router) may give the instance new requests."""
    return state is S.ACTIVE


def holds_device_memory(state: InstanceState) -> bool:
    """Whether the worker holds weights of the instance on the device (leaving must free them)."""
    return state in (S.ACTIVE, S.DRAINING, S.LOADING, S.RESTORING, S.FORKING)


def holds_host_copy(state: InstanceState) -> bool:
    """Whether the worker keeps a host copy of the instance's weights."""
    return state is S.WARM


# ---- the words: every other module spells a state through these (one vocabulary) ----
# Every state's word, in the enum's order (metric labels, ctl listings).
STATE_WORDS: tuple[str, ...] = tuple(s.value for s in InstanceState)
# The states a plan, `ctl state`, a waking request or a worker's SetState moves an instance
# to, and a model's residency (keep-alive: its most-alive instance): Active, Warm, Cold.
TargetWord = Literal["active", "warm", "cold"]
TARGETS: dict[str, InstanceState] = {w: InstanceState(w) for w in get_args(TargetWord)}
# A role plan's view of an instance (policy/roles.py): a resting or serving state's own
# word, plus two of its own: on the way up (any of COMING_UP), and Unloaded after a failure.
COMING_UP_WORD = "coming_up"
FAILED_WORD = "failed"
RoleStateWord = Literal["active", "coming_up", "draining", "warm", "cold", "unloaded", "failed"]

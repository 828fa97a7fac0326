"""The one state of a model instance, and the one table of moves between states.

An instance is a model on a device (a device group later, with tensor parallelism). Its
state is the only record of whether it serves: Dispatcher membership, /v1/models,
`janus ctl instances` and /metrics are all derived from it (core/registry.py owns the
instances; core/serving.py is the one place that changes a state). Pure: the daemon and
the simulator share it.

States today: Loading (weights going onto the device), Active (routable), Draining (no new
work; in-flight requests finish), Unloaded (holds nothing on the device; the model and
its config live on, so a request for it waits and `ctl load` brings it back). [L] adds
Warm, Cold, Restoring and Forking to this table.
"""

from __future__ import annotations

import enum


class InstanceState(enum.Enum):
    LOADING = "loading"
    ACTIVE = "active"
    DRAINING = "draining"
    UNLOADED = "unloaded"

    def __str__(self) -> str:
        return self.value


S = InstanceState

# Allowed moves. Why each exists:
# - Unloaded -> Loading: `ctl load`, start-up, a worker restart reloading its models.
# - Loading -> Active: the worker answered ModelLoaded.
# - Loading -> Unloaded: the load failed (the error is kept beside the state), or the
#   model was unloaded while it loaded.
# - Loading -> Loading is not a move: a worker that dies mid-load is retried by the
#   restart, which finds the instance Loading already.
# - Active -> Loading: its worker died; the restart reloads it.
# - Active -> Draining: `ctl unload`, a reload, shutdown; no new work, in-flight finishes.
# - Draining -> Unloaded: drained (or the drain bound passed and the rest was aborted),
#   or the worker died while draining (nothing is left to free).
TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    S.UNLOADED: frozenset({S.LOADING}),
    S.LOADING: frozenset({S.ACTIVE, S.UNLOADED}),
    S.ACTIVE: frozenset({S.LOADING, S.DRAINING}),
    S.DRAINING: frozenset({S.UNLOADED}),
}


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
    """Whether the worker holds weights of the instance (an unload must free them)."""
    return state in (S.ACTIVE, S.DRAINING, S.LOADING)

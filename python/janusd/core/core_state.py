"""The state ServingCore's parts share, named once. ServingCore (core/serving.py) is
built from parts that each own one concern: instance moves (core/instance_moves.py),
the way in (core/intake.py), queue to assignment (core/queueing.py), drains (core/draining.py) and worker events (core/worker_events.py).
They are mixins over this class: serving.py's __init__ makes every attribute below, and
a part reaches another's method only through the one ServingCore (the stubs under
TYPE_CHECKING say which)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from janusd.core.decode_guard import DecodeGuard
from janusd.core.dispatch import DispatchCore
from janusd.core.held import HeldQueues
from janusd.core.kv_handoff import KVHandoff
from janusd.core.registry import Instance, Model, Registry
from janusd.core.requests import Request, RequestTable
from janusd.core.shell_hooks import Limits, Observers
from janusd.core.tokenizing import Tokenizing
from janusd.core.worker_edge import Worker
from janusd.lifecycle.states import InstanceState
from janusd.telemetry import Telemetry
from janusd.wire import worker_msgs as wm


class CoreState:
    limits: Limits
    workers: Mapping[int, Worker]
    obs: Observers
    registry: Registry
    requests: RequestTable
    dispatch: DispatchCore
    handoff: KVHandoff
    telemetry: Telemetry
    held: HeldQueues
    guard: DecodeGuard
    tokenizing: Tokenizing
    _drains: dict[int, Any]  # instance id -> core/draining.py Drain
    _tok_rr: int  # round robin over the workers that can tokenize
    _now: float  # the time of the event being handled (for paths that end requests)

    def _at(self, now: float) -> float:
        self._now = max(self._now, now)
        return self._now

    if TYPE_CHECKING:  # one part's methods another calls (through ServingCore)
        def set_state(self, inst: Instance, target: InstanceState, now: float, error: str = "") -> None: ...

        def _leave_dispatch(self, inst: Instance, message: str, code: str | None) -> None: ...

        def _hold_queued(self, model: str, now: float) -> None: ...

        def _release_held(self, model: str, now: float) -> None: ...

        def _hold(self, req: Request, now: float) -> None: ...

        def _submit(self, req: Request, now: float) -> float: ...

        def _hopeless(self, req: Request, now: float, deadline: float) -> float | None: ...

        def _reject(self, rid: int, now: float, stage: str, deadline: float | None = None,
                    retry_after_s: float = 1.0) -> None: ...

        def _tokenize(self, req: Request, now: float) -> None: ...

        def _tokenize_failed(self, req: Request, device: int, f: wm.RequestFailed, now: float) -> None: ...

        def _retokenize(self, device: int, now: float) -> None: ...

        def queue_length(self, model: str) -> int: ...

        def default_max_tokens(self, m: Model) -> int: ...

        def tokenizer_device(self, name: str) -> int | None: ...

        def fail_requests(self, reqs: Any, failure: Any, now: float) -> int: ...

        def _look_at_drains(self, now: float) -> float | None: ...

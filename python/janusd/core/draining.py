"""Draining in the core: an instance that leaves Active lets the requests it serves finish,
up to a bound, then whatever is still running ends with the Failure the shell named.
One implementation for every drain: `ctl unload` / `remove` / a reload, a state move to
Warm or Cold (the daemon, server/model_ops.py and server/lifecycle_ops.py) and the
simulator's scale-in (sim/control_shell.py). The shell says what to do when it is over
(`on_done(now, ended)`: `ended` requests were cut at the bound); the daemon resolves a
future there, the simulator rests the instance.

A drain is looked at when it starts and at the start of every tick (the shells tick after
every event, a request's end included), so a drain ends at the tick after its last
request does, and its bound is one of the times a tick asks for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from janusd.core.core_state import CoreState
from janusd.core.registry import Instance
from janusd.core.requests import Failure, Request
from janusd.lifecycle.states import InstanceState

S = InstanceState


@dataclass
class Drain:
    inst: Instance
    deadline: float  # absolute; inf: no bound (the simulator waits for its worker)
    failure: Failure  # what a request still running at the deadline gets
    on_done: Callable[[float, int], None]


class Draining(CoreState):
    """ServingCore's drain part (see core/core_state.py)."""

    def drain(self, inst: Instance, now: float, bound_s: float, failure: Failure,
              on_done: Callable[[float, int], None]) -> None:
        """Stop routing to `inst` (Active -> Draining) and call on_done once the requests
        it serves have ended, or at `now + bound_s` after ending the rest with `failure`.
        A second drain of an instance already draining joins the first (its bound and
        failure stay); both hear when it is over."""
        self._at(now)
        if inst.state is S.ACTIVE:
            self.set_state(inst, S.DRAINING, now)
        first = self._drains.get(inst.instance_id)
        if first is None:
            self._drains[inst.instance_id] = Drain(inst, now + bound_s, failure, on_done)
        else:
            earlier = first.on_done

            def both(t: float, ended: int) -> None:
                earlier(t, ended)
                on_done(t, ended)

            first.on_done = both
        self._look_at_drains(now)

    def draining_requests(self, inst: Instance) -> list[Request]:
        """What a drain of `inst` waits for: the requests whose tokens come from its device,
        and, on P/D, when it is the model's last decode instance not leaving, the requests
        still prefilling elsewhere whose KV comes here (else they would find no decode
        instance at their handoff)."""
        reqs = [r for r in self.requests.of_model(inst.model) if r.device == inst.device]
        if inst.role != "decode":
            return reqs
        m = self.registry.model(inst.model)
        if m is None or any(i.role == "decode" and i.state is S.ACTIVE and i is not inst
                            for i in m.instances.values()):
            return reqs
        return reqs + [r for r in self.requests.of_model(inst.model) if r.instance is not None
                       and r.instance.role == "prefill" and r.decode_inst is None and r.device == r.instance.device
                       and r.device != inst.device]

    def _look_at_drains(self, now: float) -> float | None:
        """End the drains that are over (empty, or at their bound); returns the earliest
        bound still ahead (None: none)."""
        wake: float | None = None
        for iid, d in list(self._drains.items()):
            if self._drains.get(iid) is not d:
                continue  # ended meanwhile (an on_done below started and ended another drain)
            running = self.draining_requests(d.inst)
            if running and now < d.deadline:
                wake = d.deadline if wake is None else min(wake, d.deadline)
                continue
            del self._drains[iid]
            ended = self.fail_requests(running, d.failure, now) if running else 0
            d.on_done(now, ended)
        return wake

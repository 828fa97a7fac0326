"""Instance moves in the core: the one place an instance changes state (`set_state`,
lifecycle/states.py's table), its engine role while it rests, a P/D model's pairing of
prefill with decode instances, and what a worker's load, death or a failed device do to
the instances on it. Kept apart from admission and worker events because each move must
keep the Dispatcher's membership and ready flags, the decode guard and the held queues
in step, and only this module does that."""

from __future__ import annotations

from janusd.core.core_state import CoreState
from janusd.core.registry import Instance, Model
from janusd.core.requests import Failure
from janusd.lifecycle.states import COMING_UP, InstanceState, check_transition

S = InstanceState
ROLES = ("mixed", "prefill", "decode")  # an instance's engine roles (engine/runner.py)


class InstanceMoves(CoreState):
    """ServingCore's instance part (see core/core_state.py)."""

    def instance(self, model: str, device: int) -> Instance:
        """The instance of `model` on `device`, made (Unloaded) when there is none."""
        m = self.registry.models[model]
        inst = m.instances.get(device)
        if inst is None:
            inst = self.registry.new_instance(m, device)
        return inst

    def set_state(self, inst: Instance, target: InstanceState, now: float, error: str = "") -> None:
        """The one place an instance changes state; raises IllegalTransition per the table."""
        self._at(now)
        check_transition(inst.state, target, f"{inst.model} on device {inst.device}")
        inst.state = target
        inst.error = error
        self.guard.mark(inst.device)
        if target in COMING_UP:  # Loading, Restoring, Forking
            # a fresh membership: work it held was handed back by whoever took it out of
            # Active (on_worker_death ends those requests with the death's reason first)
            self._leave_dispatch(inst, f"{inst.model} on device {inst.device} is reloading", None)
            self.dispatch.join(inst)
        elif target is S.ACTIVE:
            self.dispatch.join(inst)
            inst.saturated = False
        elif target is S.DRAINING:
            self.dispatch.set_ready(inst, False)
        elif target in (S.UNLOADED, S.WARM, S.COLD):
            self._leave_dispatch(inst, f"model {inst.model!r} on device {inst.device} went {target.value}", None)
            inst.decoding.clear()
        m = self.registry.model(inst.model)
        if m is None:
            return
        self._pair(m)
        if target is S.ACTIVE:
            self.dispatch.set_ready(inst, inst.paired)
        if not m.serving:
            self._hold_queued(m.name, now)
        elif target is S.ACTIVE or (m.pd and inst.role == "decode"):  # a decode instance may pair a prefill one
            self._release_held(m.name, now)

    def set_role(self, inst: Instance, role: str, now: float) -> None:
        """The engine role `inst` comes up in next (the controller's choice for an elastic
        P/D app, policy/roles.py). Only while it rests (Warm, Cold, Unloaded): it is out of
        the Dispatcher then, so its next activation joins as the new role does (a decode
        instance never joins) and KVHandoff's decode targets follow its state."""
        self._at(now)
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        m = self.registry.models[inst.model]
        if role != "mixed" and not m.pd:
            raise ValueError(f"model {m.name!r} is not a P/D model (no prefill_devices): its instances run mixed")
        if inst.state not in (S.WARM, S.COLD, S.UNLOADED):
            raise ValueError(f"{inst.model} on device {inst.device} is {inst.state.value}: its role changes only "
                             "while it rests (warm, cold, unloaded)")
        inst.role = role
        self._pair(m)

    def _pair(self, m: Model) -> None:
        """A P/D model's prefill instances take work only while an Active decode instance
        can take their KV (else each request would fail at its handoff; it waits, held,
        instead): keeps `paired` and the Dispatcher's ready flag in step."""
        if not m.pd:
            return
        decoding = any(i.role == "decode" and i.state is S.ACTIVE for i in m.instances.values())
        for i in m.instances.values():
            paired = decoding or i.role != "prefill"
            if paired != i.paired:
                i.paired = paired
                if i.state is S.ACTIVE:
                    self.dispatch.set_ready(i, paired and not i.saturated)

    def _leave_dispatch(self, inst: Instance, message: str, code: str | None) -> None:
        for rid in self.dispatch.leave(inst):
            self.requests.fail(rid, Failure(503, message, code=code))

    def loaded(self, inst: Instance, now: float, max_model_len: int, load_s: float,
               prefill_probe: list[tuple[int, float]] | None = None) -> None:
        """The worker answered ModelLoaded (or StateSet active after a restore or fork):
        Active, unless the instance left Loading/Restoring/Forking meanwhile.
        `prefill_probe` (tokens, seconds) pairs the worker timed seed the prefill estimate."""
        if inst.state not in COMING_UP:
            return
        inst.max_model_len = max_model_len
        inst.load_s = load_s
        self.dispatch.seed(inst, prefill_probe or [])
        self.set_state(inst, S.ACTIVE, now)

    def load_failed(self, inst: Instance, now: float, error: str) -> None:
        if inst.state is S.LOADING:
            self.set_state(inst, S.UNLOADED, now, error=error)

    def on_worker_death(self, device: int, now: float, code: str = "worker_died", why: str = "died") -> None:
        """The worker of `device` is gone (`why`: died, or hung and was killed)."""
        self._at(now)
        for inst in self.registry.on_device(device):
            if inst.state is S.ACTIVE:
                self._leave_dispatch(inst, f"the worker for device {device} {why}", code)
                self.set_state(inst, S.LOADING, now, error=f"worker {why}; restarting")
            elif inst.state is S.DRAINING:
                self.set_state(inst, S.UNLOADED, now, error=f"worker {why} while draining")
            elif inst.state is S.LOADING:
                inst.error = f"worker {why}; restarting"
            elif inst.state in (S.RESTORING, S.FORKING):  # it was coming up: the restart loads it
                self.set_state(inst, S.LOADING, now, error=f"worker {why} while {inst.state.value}; restarting")
            elif inst.state is S.WARM:  # the host copy died with the process
                self.set_state(inst, S.COLD, now, error=f"worker {why}; the host copy is gone")
        for req in self.requests.on_device(device):
            self.requests.fail(req.rid, Failure(503, f"the worker for device {device} {why} while serving this "
                                                     "request", code=code))
        self._retokenize(device, now)  # prompts it was tokenizing: another worker's (or they wait)

    def on_device_failed(self, device: int, now: float) -> None:
        """The device is given up (its restart budget is spent): its instances hold nothing
        and serve nothing; requests for models left without an instance wait, bounded."""
        self._at(now)
        for inst in self.registry.on_device(device):
            if inst.state is S.ACTIVE:
                self.set_state(inst, S.DRAINING, now)
            if inst.state is not S.UNLOADED:
                self.set_state(inst, S.UNLOADED, now, error=f"device {device} failed")

    def _decode_target(self, model: str) -> Instance | None:
        m = self.registry.model(model)
        if m is None:
            return None
        dec = [i for i in m.instances.values() if i.role == "decode" and i.state is S.ACTIVE]
        if not dec:  # the whole model drains: a request still prefilling may finish on a draining one
            dec = [i for i in m.instances.values() if i.role == "decode" and i.state is S.DRAINING]
        return self.dispatch.decode_target(dec)

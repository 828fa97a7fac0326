"""The decode guard: keeps new prefill work off a device that would then decode too slowly.

Per-token attainment under overload is decided by TPOT, not TTFT (bench/RESULTS.md,
dispatch-replay): a prefill admitted onto a device already decoding near the model's
TPOT SLO makes every sequence there late. So an Active instance takes new prefill work
only while its device, with one more sequence decoding, is estimated to stay within the
model's TPOT SLO; an instance with nothing decoding always may (every request is served
eventually). The estimate is an online fit of the device's observed inter-token gaps by
the number of sequences decoding (oracle/decode_estimate.py).

Owned state: per device, the sequences past their first token and the decode fit, plus
the set of devices whose inputs changed since the guard last looked (None: all), so a
tick costs O(devices changed), not O(instances). The guard acts only through the
Dispatcher's ready flag (Instance.saturated records that it did).
"""

from __future__ import annotations

from janusd.core.dispatch import DispatchCore
from janusd.core.registry import Registry
from janusd.oracle.decode_estimate import DecodeStepEstimator


class DecodeGuard:
    def __init__(self, registry: Registry, dispatch: DispatchCore) -> None:
        self.registry = registry
        self.dispatch = dispatch
        self.decoding: dict[int, int] = {}  # device -> requests past their first token there
        self.fit: dict[int, DecodeStepEstimator] = {}  # device -> seconds per token by sequences
        self._dirty: set[int] | None = None

    def mark(self, device: int) -> None:
        """An input of `device` changed (its states, its decoding count or fit)."""
        if self._dirty is not None:
            self._dirty.add(device)

    @property
    def changed(self) -> bool:
        """Some device's inputs changed since the guard last looked."""
        return self._dirty is None or bool(self._dirty)

    def mark_all(self) -> None:
        """Every device may have changed (e.g. a model's SLO was retuned)."""
        self._dirty = None

    def count(self, device: int, delta: int) -> None:
        """A sequence started (+1) or stopped (-1) decoding on `device`."""
        n = max(0, self.decoding.get(device, 0) + delta)
        self.decoding[device] = n
        self.mark(device)
        self.dispatch.set_decode_load(device, n)

    def observe_gap(self, device: int, gap_s: float) -> None:
        """One observed time per token on `device` at its current decoding count."""
        fit = self.fit.setdefault(device, DecodeStepEstimator())
        fit.observe(max(1, self.decoding.get(device, 1)), max(0.0, gap_s))
        self.mark(device)

    def apply(self) -> None:
        """Set the ready flag of every instance on a changed device by the rule above."""
        dirty, self._dirty = self._dirty, set()
        if dirty is None:
            insts = list(self.registry.instances.values())
        else:
            insts = [i for d in dirty for i in self.registry.on_device(d)]
        for inst in insts:
            if not (inst.active and inst.dispatched):
                continue
            n = self.decoding.get(inst.device, 0)
            fit = self.fit.get(inst.device)
            m = self.registry.models.get(inst.model)
            tpot = m.cfg.tpot_slo_ms / 1000.0 if m is not None else float("inf")
            full = n > 0 and fit is not None and fit.step_s(n + 1) > tpot
            if full != inst.saturated:
                inst.saturated = full
                self.dispatch.set_ready(inst, not full and inst.paired)

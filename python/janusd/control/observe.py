"""The room's snapshot read from a ServingCore: the one place the room's inputs come from,
whichever shell holds the core (the daemon's, or the simulator's on a virtual clock). So
two shells with the same core state hand the room the same snapshot, and a difference
between their decisions can only come from what they did with its Ops."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping

from janusd.control.snapshot import ControlSnapshot, InstanceView, ModelView, Predictor
from janusd.core import Model, ServingCore
from janusd.oracle.decode_estimate import DecodeStepEstimator
from janusd.oracle.prefill_estimate import PrefillEstimator
from janusd.oracle.types import LoadFeatures
from janusd.policy.demand import prefill_share


def pool_devices(n_devices: int, configured: Iterable[int] = ()) -> tuple[int, ...]:
    """The devices the controller may place on: `control.pool_devices`, else all."""
    chosen = sorted({d for d in configured if d < n_devices})
    return tuple(chosen) if chosen else tuple(range(n_devices))


class _DeviceLoad(Mapping[int, int]):
    """Requests in flight per device, counted over the core's requests on first use (a
    tick that reads no device's load pays nothing; one that reads any pays one pass)."""

    def __init__(self, core: ServingCore) -> None:
        self._core = core
        self._counts: Counter[int] | None = None

    def _all(self) -> Counter[int]:
        if self._counts is None:
            self._counts = self._core.device_load()
        return self._counts

    def __getitem__(self, device: int) -> int:
        return self._all()[device]

    def get(self, device: int, default: int = 0) -> int:  # type: ignore[override]
        return self._all().get(device, default)

    def __iter__(self) -> Iterator[int]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def measured_prefill_share(core: ServingCore, m: Model, load: LoadFeatures) -> float:
    """Prefill's part of the model's device time (demand.prefill_share) from the
    per-token costs the core measures: seconds per prompt token of the model's prefill
    fits at its mean prompt length (mean over its devices with samples; the estimator's
    prior without any), and seconds of device time per output token of its devices'
    decode fits at the sequences decoding there now (step time / n)."""
    n_in = max(1.0, load.input_len_mean)
    fits = [e for e in core.prefill_fits(m.name).values() if e.n]
    p = sum(e.estimate(int(n_in)) for e in fits) / len(fits) if fits else PrefillEstimator().estimate(int(n_in))
    costs = core.decode_token_s(m.name)
    dec = sum(costs) / len(costs) if costs else DecodeStepEstimator().step_s(1)
    return prefill_share(load, p / n_in, dec)


def model_view(core: ServingCore, m: Model, now: float) -> ModelView:
    w = core.window(m.name, now)
    insts = {d: InstanceView(device=d, state=i.state, role=i.role, error=i.error) for d, i in m.instances.items()}
    own: dict[int, int] = {}
    share = 0.5
    if m.pd:  # the role plan reads each instance's own requests and prefill's share of the work
        own = dict(core.device_load(m.name))
        share = measured_prefill_share(core, m, LoadFeatures.from_window(w))
    return ModelView(name=m.name, instances=insts, window=w, devices=tuple(m.cfg.devices), pd=m.pd,
                     pool=m.cfg.pool, requests=core.in_flight(m.name), own_load=own, prefill_share=share,
                     tp=m.cfg.tp)


def observe(core: ServingCore, now: float, n_devices: int, predictor: Predictor, managed: bool = True,
            pool: Iterable[int] = ()) -> ControlSnapshot:
    """The snapshot of `core` at `now` (`pool`: control.pool_devices, empty: every device)."""
    models = {name: model_view(core, m, now) for name, m in core.models().items()}
    return ControlSnapshot(models=models, n_devices=n_devices, pool=pool_devices(n_devices, pool),
                           predictor=predictor, managed=managed, device_load=_DeviceLoad(core))

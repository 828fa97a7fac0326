"""The rows a profile measured, kept column by column, and the header of the points file
they become (oracle/dataset.py's Points: features, instances, resources, attainment,
point_id, the engine's counters)."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from janusd.oracle.dataset import ENGINE_COLUMNS, Points
from janusd.profiling.args import ProfileArgs
from janusd.profiling.load import KNEE_STRETCH, LENGTH_SIGMA, MIN_REQUESTS, MIXES, SETTLE_FRACTION, SETTLE_MIN_S


@dataclass
class Rows:
    features: list[list[float]] = field(default_factory=list)
    instances: list[int] = field(default_factory=list)
    resources: list[list[float]] = field(default_factory=list)  # hbm, compute, bandwidth
    attainment: list[float] = field(default_factory=list)
    point_id: list[int] = field(default_factory=list)  # load point of each row: repeats share one
    engine: list[list[float]] = field(default_factory=list)  # the engine's counters over the row's replay

    def __len__(self) -> int:
        return len(self.features)

    def add(self, features: list[float], m: int, resources: list[float], att: float, point: int,
            engine: list[float]) -> None:
        self.features.append(features)
        self.instances.append(m)
        self.resources.append(resources)
        self.attainment.append(att)
        self.point_id.append(point)
        self.engine.append(engine)

    def points(self, header: dict[str, Any]) -> Points:
        n = len(self)
        return Points(header, np.array(self.features, dtype=np.float64).reshape(n, 7),
                      np.array(self.instances, dtype=np.int64),
                      np.array(self.resources, dtype=np.float64).reshape(n, 3),
                      np.clip(np.array(self.attainment, dtype=np.float64), 0, 1),
                      np.array(self.point_id, dtype=np.int64),
                      np.array(self.engine, dtype=np.float64).reshape(n, len(ENGINE_COLUMNS)))


def header(a: ProfileArgs, spec: Any, dev: Any, dropped: int, pinning: dict[str, Any], load_start: float
           ) -> dict[str, Any]:
    """The points file's header: what was measured, on what, and the settings that shaped
    the load (a later reader compares profiles by them). `load_start`: the 1-minute load
    average when the run began (a shared machine's other work shows in every figure)."""
    import msgspec

    from janusd.hw.cpu_peaks import machine_identity

    return {
        "model": a.spec, "model_spec": spec.identity(), "device": msgspec.to_builtins(dev),
        "machine": machine_identity(), "slo": {"ttft_ms": a.ttft_slo_ms, "tpot_ms": a.tpot_slo_ms},
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "source": "profile",
        "notes": {"engine_device": a.device, "mixes": {k: MIXES[k] for k in a.mixes}, "point_s": a.point_s,
                  "budget_s": a.budget_s, "max_instances": a.max_instances, "dropped_points": dropped,
                  "length_sigma": LENGTH_SIGMA, "dtype": a.dtype, "memory_mib": a.memory_mib,
                  "min_requests": MIN_REQUESTS, "repeats": a.repeats, "settle_fraction": SETTLE_FRACTION,
                  "settle_min_s": SETTLE_MIN_S, "knee_stretch": KNEE_STRETCH, "trace": "stratified", "pinning": pinning,
                  "load_avg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)]},
    }

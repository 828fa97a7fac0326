"""What a simulation serves and what it records: the served models a trace asks for (one
per app and trace model, with the app's SLOs), and the per-request outcome columns the
event loop (sim/cluster.py) fills in. Apart from the loop: they are read by the summary,
the run directory and the controller's oracle, none of which runs the loop."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from janusd.sim.specs import SimModel
from janusd.trace import slo
from janusd.trace.formats import Trace

_NAME_BAD = re.compile(r"[^A-Za-z0-9._:/-]")


@dataclass(frozen=True)
class Served:
    """A served model: its name in the core, its app, its architecture and the SLOs its
    ModelConfig carries (what the decode guard and the controller's oracle plan for)."""

    name: str
    app: str
    arch: SimModel
    ttft_slo_ms: float
    tpot_slo_ms: float


def _app_slo(column: np.ndarray, rows: np.ndarray, default: float) -> float:
    """A served model's SLO: the median of its requests' SLO column (a synthesized or
    converted trace gives every request of an app the app's SLO), the architecture's
    default where the trace has none."""
    v = column[rows]
    v = v[np.isfinite(v)]
    return float(np.median(v)) if len(v) else default


def served_models(trace: Trace, archs: dict[str, SimModel]) -> tuple[list[Served], np.ndarray]:
    """The served models of a trace and, per request, the index of its served model.

    Their SLOs are the trace's (module doc): until 2026-12-03 every served model carried
    its architecture's default SLOs while the requests carried the app's, so the decode
    guard and the oracle planned an app with a 50 ms TPOT for the 75 ms of an 8B preset."""
    pairs = trace.app_id.astype(np.int64) * len(trace.models) + trace.model_id.astype(np.int64)
    uniq, inverse = np.unique(pairs, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
    per_app: dict[int, int] = {}
    for p in uniq:
        per_app[int(p) // len(trace.models)] = per_app.get(int(p) // len(trace.models), 0) + 1
    out = []
    for k, p in enumerate(uniq):
        a, m = divmod(int(p), len(trace.models))
        app, model = trace.apps[a], trace.models[m]
        name = app if per_app[a] == 1 else f"{app}/{model}"
        name = _NAME_BAD.sub("_", name)
        if not name[0].isalnum():
            name = "m" + name
        arch = archs[model]
        rows = order[bounds[k]:bounds[k + 1]]
        out.append(Served(name[:128], app, arch, _app_slo(trace.ttft_slo_ms, rows, arch.ttft_slo_ms),
                          _app_slo(trace.tpot_slo_ms, rows, arch.tpot_slo_ms)))
    return out, inverse.astype(np.int64)


@dataclass
class RunOutcome:
    """Per request of the trace (index order): the columns trace/slo.py summarizes."""

    on_time: np.ndarray
    total: np.ndarray
    ttft_met: np.ndarray
    tpot_met: np.ndarray
    e2e_met: np.ndarray
    ok: np.ndarray
    status: list[str]
    token_times: dict[int, list[float]] = field(default_factory=dict)  # index -> times, when kept

    def outcomes(self) -> slo.Outcomes:
        return slo.Outcomes(self.on_time, self.total, self.ttft_met, self.tpot_met, self.e2e_met, self.ok)


class OutcomeLists:
    """RunOutcome's columns as Python lists, filled in during the run."""

    def __init__(self, n: int, total: list[int]) -> None:
        self.on_time = [0] * n
        self.total = total
        self.ttft_met = [False] * n
        self.tpot_met = [False] * n
        self.e2e_met = [False] * n
        self.ok = [False] * n
        self.status = ["error"] * n
        self.token_times: dict[int, list[float]] = {}

    def arrays(self) -> RunOutcome:
        return RunOutcome(np.array(self.on_time, np.int64), np.array(self.total, np.int64),
                          np.array(self.ttft_met, bool), np.array(self.tpot_met, bool),
                          np.array(self.e2e_met, bool), np.array(self.ok, bool), list(self.status),
                          self.token_times)


class TraceColumns:
    """The trace's per-request columns as Python lists (the event loop reads one value at
    a time; a numpy scalar costs several times a list item)."""

    def __init__(self, trace: Trace, names: list[str]) -> None:
        self.arrival: list[float] = trace.arrival_s.tolist()
        self.name = names  # the served model of each request
        self.inp: list[int] = trace.input_tokens.astype(np.int64).tolist()
        self.out: list[int] = trace.output_tokens.astype(np.int64).tolist()
        self.ttft: list[float] = trace.ttft_slo_ms.astype(np.float64).tolist()
        self.tpot: list[float] = trace.tpot_slo_ms.astype(np.float64).tolist()

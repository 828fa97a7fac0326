"""Per-request results of a run (replay, daemon or simulator) and their SLO evaluation.

A run directory holds:
- `results.jsonl`: one `RequestResult` per request, in any order (written as requests
  finish); `index` is the request's row in the trace.
- `summary.json`: the run's headline figures (written by the tool that made the run).
- `devices.csv` (optional): `t_s,active_devices[,active_instances]`, a step series of how
  many devices (and model instances) the system held, on the same time axis as
  `arrival_s`; the report plots active_devices when present. `janus replay` writes it by
  sampling the server's /metrics (trace/devices_poll.py).
Any shell that writes these files (the simulator too) gets the same report.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec
import numpy as np

from janusd.trace import slo
from janusd.trace.formats import TraceError, fixed_csv_rows, open_text, reading

Status = Literal["ok", "error", "timeout"]
DEVICES_COLUMNS = ["t_s", "active_devices", "active_instances"]


class RequestResult(msgspec.Struct, omit_defaults=True):
    """What happened to one request. Times: arrival_s on the trace's (replay's) time axis;
    token_times_s relative to the moment the request was actually sent (submission)."""

    index: int
    arrival_s: float
    app: str
    model: str
    input_tokens: int
    output_tokens: int  # expected (requested) output tokens
    ttft_slo_ms: float
    tpot_slo_ms: float
    send_lag_ms: float  # actual send time minus scheduled time
    token_times_s: list[float]
    status: Status
    error: str | None = None
    http_status: int | None = None


@dataclass(frozen=True, eq=False)
class Results:
    """Columns of a run's results, sorted by `index`."""

    arrival_s: np.ndarray
    app_id: np.ndarray
    apps: tuple[str, ...]
    expected: np.ndarray
    ok: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    token_times: np.ndarray  # concatenated
    token_counts: np.ndarray
    send_lag_ms: np.ndarray
    status: np.ndarray  # str

    def __len__(self) -> int:
        return len(self.arrival_s)

    def outcomes(self) -> slo.Outcomes:
        return slo.evaluate(self.token_times, self.token_counts, self.expected, self.ok, self.ttft_s, self.tpot_s)


def results_from(rows: list[RequestResult]) -> Results:
    rows = sorted(rows, key=lambda r: r.index)
    apps: dict[str, int] = {}
    app_id = np.array([apps.setdefault(r.app, len(apps)) for r in rows], dtype=np.int64)
    times = [t for r in rows for t in r.token_times_s]
    return Results(
        arrival_s=np.array([r.arrival_s for r in rows], dtype=np.float64),
        app_id=app_id,
        apps=tuple(apps),
        expected=np.array([r.output_tokens for r in rows], dtype=np.int64),
        ok=np.array([r.status == "ok" for r in rows], dtype=bool),
        ttft_s=np.array([r.ttft_slo_ms / 1000.0 for r in rows], dtype=np.float64),
        tpot_s=np.array([r.tpot_slo_ms / 1000.0 for r in rows], dtype=np.float64),
        token_times=np.array(times, dtype=np.float64),
        token_counts=np.array([len(r.token_times_s) for r in rows], dtype=np.int64),
        send_lag_ms=np.array([r.send_lag_ms for r in rows], dtype=np.float64),
        status=np.array([r.status for r in rows], dtype=object),
    )


def read_results(path: str | os.PathLike[str]) -> Results:
    """Load results.jsonl; a bad line raises TraceError with file and line number."""
    decoder = msgspec.json.Decoder(RequestResult)
    rows = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(decoder.decode(line))
            except msgspec.DecodeError as e:  # ValidationError is a DecodeError
                raise TraceError(f"{path}:{lineno}: {e}") from None
    return results_from(rows)


def read_devices(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """devices.csv -> (t_s, active_devices), or None when the file is absent.
    active_instances, when present, is checked as a number but not returned."""
    if not Path(path).is_file():
        return None
    ts, ds = [], []
    with reading(str(path)), open_text(path) as f:
        first = f.readline()
        header = [h.strip() for h in first.strip().split(",")]
        cols = DEVICES_COLUMNS if header == DEVICES_COLUMNS else DEVICES_COLUMNS[:2]
        text = "t_s,active_devices[,active_instances]"
        for where, row in fixed_csv_rows(str(path), itertools.chain([first], f), cols, text):
            try:
                values = [float(v) for v in row]
            except ValueError:
                raise TraceError(f"{where}: expected {len(cols)} numbers") from None
            ts.append(values[0])
            ds.append(values[1])
    return np.array(ts), np.array(ds)


def jsonable(obj: object) -> object:
    """Replace NaN/inf floats (not valid JSON) by None, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    return obj

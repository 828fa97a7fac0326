"""Loader for the Azure LLM inference trace 2023 (Splitwise; CC BY 4.0).

Files `AzureLLMInferenceTrace_{code,conv}.csv[.gz]` with the header
`TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP is `YYYY-MM-DD HH:MM:SS.fffffff`
without a timezone. Each file is one application (the name after the last `_`: code,
conv). Several files are merged onto one time axis whose 0 is the earliest request of
all of them, since the two services' traces overlap in time.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from janusd.trace.formats import Trace, TraceError, fixed_csv_rows, open_text, reading

HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def app_name(path: str | os.PathLike[str]) -> str:
    """'AzureLLMInferenceTrace_conv.csv.gz' -> 'conv'."""
    stem = Path(path).name.split(".")[0]
    m = re.search(r"_([A-Za-z0-9-]+)$", stem)
    return m.group(1).lower() if m else stem


def _read_one(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    src = str(path)
    times: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    with reading(src), open_text(path) as f:
        prev = -np.inf
        for where, row in fixed_csv_rows(src, f, HEADER):
            try:
                t = datetime.fromisoformat(row[0].strip()).replace(tzinfo=timezone.utc).timestamp()
            except ValueError:
                raise TraceError(f"{where}: TIMESTAMP {row[0]!r} is not 'YYYY-MM-DD HH:MM:SS.fffffff'") from None
            try:
                i, o = int(row[1]), int(row[2])
            except ValueError:
                raise TraceError(f"{where}: ContextTokens/GeneratedTokens must be integers, got {row[1]!r}, {row[2]!r}") from None
            if i < 1 or o < 1:
                raise TraceError(f"{where}: token counts must be >= 1, got {i}, {o}")
            if t < prev:
                raise TraceError(f"{where}: TIMESTAMP goes backwards")
            prev = t
            times.append(t)
            inp.append(i)
            out.append(o)
    return np.array(times), np.array(inp, dtype=np.int64), np.array(out, dtype=np.int64)


def load_azure(paths: list[str] | list[Path], model: str | None = None) -> Trace:
    """Merge Azure trace files into one canonical trace; model defaults to 'azure-<app>'."""
    if not paths:
        raise ValueError("give at least one Azure trace file")
    parts = []
    for p in paths:
        if not Path(p).is_file():
            raise TraceError(f"{p}: no such file")
        t, i, o = _read_one(p)
        app = app_name(p)
        parts.append((t, i, o, app, model or f"azure-{app}"))
    apps = [np.full(len(t), app, dtype=object) for t, _, _, app, _ in parts]
    models = [np.full(len(t), m, dtype=object) for t, _, _, _, m in parts]
    t_all = np.concatenate([p[0] for p in parts])
    t0 = t_all.min() if len(t_all) else 0.0
    return Trace.build(
        np.round(t_all - t0, 6),
        np.concatenate(apps).astype(str),
        np.concatenate(models).astype(str),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
        sort=True,
    )

"""Oracle training points and their file format (profiles, the daemon's online points).

A point: a model's load features over a run, the instance count m serving it, the
measured per-instance demand (HBM, compute, bandwidth as fractions of one device) and the
measured per-token SLO attainment. `point_id` groups rows measured under one load
setting (one replay), so a held-out split can hold out whole load points, not rows.

File: one .npz (numpy's zip of .npy arrays, read with allow_pickle=False: no pickle
anywhere) holding
  header      uint8, UTF-8 JSON: {"format": "janusd-oracle-points", "version": 2,
              "model": name, "model_spec": hw ModelSpec identity, "device": DeviceSpec
              fields, "machine": host identity, "slo": {"ttft_ms", "tpot_ms"},
              "created": ISO time, "source": "profile" | "online", "notes": {...}}
  features    float64 (n, 7)   LoadFeatures fields in declaration order, the whole model's load
  instances   int64 (n,)       m
  resources   float64 (n, 3)   per-instance demand, RESOURCE_DIMS order
  attainment  float64 (n,)     per-token SLO attainment in [0, 1]
  point_id    int64 (n,)
  engine      float64 (n, 4)   the engine's own counters over the row's replay, ENGINE_COLUMNS
              order (steps, decode tokens, forward seconds summed over the instances; the
              replay's wall seconds), NaN where a row has none (the daemon's online points;
              version 1 files). step_rate.fit_step_time reads the step time off them.
Version 1 files (no engine array) are read with every engine row NaN; version 2 added it.
A file with another format name, a newer version, missing or misshaped arrays or values
out of range is refused with a DatasetError naming the file and what is wrong.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from janusd.oracle.inputs import N_FEATURES
from janusd.oracle.types import RESOURCE_DIMS

FORMAT = "janusd-oracle-points"
VERSION = 2
ENGINE_COLUMNS = ("steps", "decode_tokens", "forward_seconds", "wall_s")  # the first three: janusd_engine_* on /metrics
_ARRAYS = ("features", "instances", "resources", "attainment", "point_id", "engine")


class DatasetError(ValueError):
    """A points file cannot be used; the message names the file."""


@dataclass
class Points:
    header: dict[str, Any]
    features: np.ndarray
    instances: np.ndarray
    resources: np.ndarray
    attainment: np.ndarray
    point_id: np.ndarray
    engine: np.ndarray | None = None  # None: no row has counters (NaN rows)

    def __post_init__(self) -> None:
        if self.engine is None:
            self.engine = np.full((len(self.instances), len(ENGINE_COLUMNS)), np.nan)

    def __len__(self) -> int:
        return len(self.instances)

    def check(self, where: str = "<points>") -> None:
        n = len(self.instances)
        shapes = {"features": (n, N_FEATURES), "instances": (n,), "resources": (n, len(RESOURCE_DIMS)),
                  "attainment": (n,), "point_id": (n,), "engine": (n, len(ENGINE_COLUMNS))}
        for name, shape in shapes.items():
            arr = getattr(self, name)
            if arr.shape != shape:
                raise DatasetError(f"{where}: {name} has shape {arr.shape}, expected {shape}")
        if not (np.isfinite(self.features).all() and np.isfinite(self.resources).all()
                and np.isfinite(self.attainment).all()):
            raise DatasetError(f"{where}: a non-finite value in the points")
        if np.any(self.instances < 1) or np.any((self.attainment < 0) | (self.attainment > 1)):
            raise DatasetError(f"{where}: instances must be >= 1 and attainment in [0, 1]")
        if np.any(self.features < 0) or np.any(self.resources < 0):
            raise DatasetError(f"{where}: negative load features or resource demands")
        eng = self.engine[np.isfinite(self.engine).all(axis=1)]
        if np.any(eng < 0) or np.isinf(self.engine).any():
            raise DatasetError(f"{where}: engine counters must be NaN (none) or finite and >= 0")

    def take(self, mask: np.ndarray) -> Points:
        return Points(self.header, *(getattr(self, k)[mask] for k in _ARRAYS))

    @classmethod
    def empty(cls, header: dict[str, Any]) -> Points:
        return cls(header, np.zeros((0, N_FEATURES)), np.zeros(0, np.int64), np.zeros((0, len(RESOURCE_DIMS))),
                   np.zeros(0), np.zeros(0, np.int64), np.zeros((0, len(ENGINE_COLUMNS))))

    def append(self, other: Points) -> Points:
        return Points(self.header, *(np.concatenate([getattr(self, k), getattr(other, k)]) for k in _ARRAYS))


def encode(points: Points) -> bytes:
    points.check()
    header = {**points.header, "format": FORMAT, "version": VERSION}
    buf = io.BytesIO()
    np.savez(buf, header=np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8),
             features=points.features.astype(np.float64), instances=points.instances.astype(np.int64),
             resources=points.resources.astype(np.float64), attainment=points.attainment.astype(np.float64),
             point_id=points.point_id.astype(np.int64), engine=np.asarray(points.engine, dtype=np.float64))
    return buf.getvalue()


def write_points(path: str | os.PathLike[str], points: Points) -> None:
    """Atomic write (temp file + rename): a reader never sees half a file."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(encode(points))
    tmp.replace(p)


def decode(data: bytes, where: str) -> Points:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise DatasetError(f"{where}: not a readable npz file ({type(e).__name__}: {e})") from None
    if "header" not in arrays:
        raise DatasetError(f"{where}: no header: not a {FORMAT} file")
    try:
        header = json.loads(arrays["header"].tobytes().decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise DatasetError(f"{where}: unreadable header: {e}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise DatasetError(f"{where}: format {got!r} is not {FORMAT!r}")
    if not isinstance(header.get("version"), int) or header["version"] > VERSION:
        raise DatasetError(f"{where}: version {header.get('version')!r} is newer than this janusd reads ({VERSION})")
    missing = [k for k in _ARRAYS[:-1] + (("engine",) if header["version"] >= 2 else ()) if k not in arrays]
    if missing:
        raise DatasetError(f"{where}: missing arrays {missing}")
    engine = arrays["engine"].astype(np.float64) if "engine" in arrays else None
    pts = Points(header, arrays["features"].astype(np.float64), arrays["instances"].astype(np.int64),
                 arrays["resources"].astype(np.float64), arrays["attainment"].astype(np.float64),
                 arrays["point_id"].astype(np.int64), engine)
    pts.check(where)
    return pts


def read_points(path: str | os.PathLike[str]) -> Points:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read: {e.strerror or e}") from None
    return decode(data, str(path))

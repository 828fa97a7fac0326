"""The canonical request trace: one loader and one writer for every tool.

A trace is a list of requests sorted by arrival. On disk it is CSV with the header
`arrival_s,app,model,input_tokens,output_tokens` and optionally `ttft_slo_ms,tpot_slo_ms`
(empty cell = no per-request SLO), or JSONL with the same keys; either may be gzipped
(`.gz`). replay, sim, stats and profile all read traces through `read_trace`.

In memory a trace is a `Trace`: a struct of numpy columns, not a list of objects. The
daily production replay is ~600 k rows and the raw day is tens of millions; columns make
sampling, compression and statistics vectorised, and app/model names are interned as
small integer codes (`app_id` indexes `apps`). JSONL rows are decoded by msgspec into
`TraceRow`, which is also the type to use when a caller wants one request as an object.

Every problem in a file raises `TraceError` naming the file, the 1-based line number
and the reason, so a bad row among millions can be found and fixed.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import os
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

REQUIRED = ("arrival_s", "app", "model", "input_tokens", "output_tokens")
OPTIONAL = ("ttft_slo_ms", "tpot_slo_ms")


class TraceError(ValueError):
    """A trace file or trace value is malformed; the message names file, line and reason."""


class TraceRow(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One request of a trace (the JSONL row schema)."""

    arrival_s: float
    app: str
    model: str
    input_tokens: int
    output_tokens: int
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None


@dataclass(frozen=True, eq=False)
class Trace:
    """Columns of a trace, all of length n, sorted by `arrival_s`.

    `ttft_slo_ms`/`tpot_slo_ms` hold NaN where the request carries no SLO of its own
    (the consumer then applies its default). Build with `Trace.build` to get checks.
    """

    arrival_s: np.ndarray  # float64 seconds
    app_id: np.ndarray  # int32 index into apps
    model_id: np.ndarray  # int32 index into models
    input_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    ttft_slo_ms: np.ndarray  # float64, NaN = none
    tpot_slo_ms: np.ndarray  # float64, NaN = none
    apps: tuple[str, ...]
    models: tuple[str, ...]

    @staticmethod
    def build(
        arrival_s: np.ndarray,
        app: list[str] | np.ndarray,
        model: list[str] | np.ndarray,
        input_tokens: np.ndarray,
        output_tokens: np.ndarray,
        ttft_slo_ms: np.ndarray | None = None,
        tpot_slo_ms: np.ndarray | None = None,
        *,
        sort: bool = False,
    ) -> Trace:
        """Make a trace from per-row values (names as strings); validates every column."""
        app_names, app_id = np.unique(np.asarray(app, dtype=str), return_inverse=True)
        model_names, model_id = np.unique(np.asarray(model, dtype=str), return_inverse=True)
        n = len(app_id)
        nan = np.full(n, np.nan)
        t = Trace(
            arrival_s=np.asarray(arrival_s, dtype=np.float64),
            app_id=app_id.astype(np.int32),
            model_id=model_id.astype(np.int32),
            input_tokens=np.asarray(input_tokens, dtype=np.int64),
            output_tokens=np.asarray(output_tokens, dtype=np.int64),
            ttft_slo_ms=nan if ttft_slo_ms is None else np.asarray(ttft_slo_ms, dtype=np.float64),
            tpot_slo_ms=nan.copy() if tpot_slo_ms is None else np.asarray(tpot_slo_ms, dtype=np.float64),
            apps=tuple(str(a) for a in app_names),
            models=tuple(str(m) for m in model_names),
        )
        if sort:
            t = t.take(np.argsort(t.arrival_s, kind="stable"))
        t.validate()
        return t

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def has_slo(self) -> bool:
        return bool(np.any(~np.isnan(self.ttft_slo_ms)) or np.any(~np.isnan(self.tpot_slo_ms)))

    @property
    def duration_s(self) -> float:
        """Last arrival minus first arrival (0 for fewer than two requests)."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0

    def app_names(self) -> np.ndarray:
        """The app name of every row (object array)."""
        return np.asarray(self.apps, dtype=object)[self.app_id]

    def model_names(self) -> np.ndarray:
        return np.asarray(self.models, dtype=object)[self.model_id]

    def take(self, index: np.ndarray) -> Trace:
        """Rows selected by an index or boolean mask, name tables unchanged."""
        return Trace(
            self.arrival_s[index], self.app_id[index], self.model_id[index], self.input_tokens[index],
            self.output_tokens[index], self.ttft_slo_ms[index], self.tpot_slo_ms[index], self.apps, self.models,
        )  # fmt: skip

    def with_arrivals(self, arrival_s: np.ndarray) -> Trace:
        return Trace(
            np.asarray(arrival_s, dtype=np.float64), self.app_id, self.model_id, self.input_tokens,
            self.output_tokens, self.ttft_slo_ms, self.tpot_slo_ms, self.apps, self.models,
        )  # fmt: skip

    def validate(self, source: str = "<trace>") -> None:
        """Raise TraceError (with the 0-based row) on the first bad value."""
        n = len(self.arrival_s)
        for name in ("app_id", "model_id", "input_tokens", "output_tokens", "ttft_slo_ms", "tpot_slo_ms"):
            if len(getattr(self, name)) != n:
                raise TraceError(f"{source}: column {name} has {len(getattr(self, name))} rows, expected {n}")
        checks = [
            (~np.isfinite(self.arrival_s) | (self.arrival_s < 0), "arrival_s must be a finite number >= 0"),
            (self.input_tokens < 1, "input_tokens must be >= 1"),
            (self.output_tokens < 1, "output_tokens must be >= 1"),
            (self.ttft_slo_ms <= 0, "ttft_slo_ms must be > 0"),
            (self.tpot_slo_ms <= 0, "tpot_slo_ms must be > 0"),
        ]
        if n > 1:
            unsorted = np.zeros(n, dtype=bool)
            unsorted[1:] = np.diff(self.arrival_s) < 0
            checks.append((unsorted, "arrival_s is smaller than the previous row's (traces must be sorted)"))
        for bad, reason in checks:
            if np.any(bad):
                raise TraceError(f"{source}: row {int(np.argmax(bad))}: {reason}")

    def rows(self) -> Iterator[TraceRow]:
        apps, models = self.apps, self.models
        for i in range(len(self)):
            tt, tp = float(self.ttft_slo_ms[i]), float(self.tpot_slo_ms[i])
            yield TraceRow(
                float(self.arrival_s[i]), apps[self.app_id[i]], models[self.model_id[i]],
                int(self.input_tokens[i]), int(self.output_tokens[i]),
                None if math.isnan(tt) else tt, None if math.isnan(tp) else tp,
            )  # fmt: skip


def open_text(path: str | os.PathLike[str], mode: str = "r") -> io.TextIOBase:
    """Open a text file, gzip-compressed when the name ends in .gz.

    Reading uses utf-8-sig: spreadsheet exports start with a byte-order mark, which would
    otherwise become part of the first column's name.
    """
    encoding = "utf-8-sig" if mode == "r" else "utf-8"
    if str(path).endswith(".gz"):
        return gzip.open(path, mode + "t", encoding=encoding, newline="")  # type: ignore[return-value]
    return open(path, mode, encoding=encoding, newline="")  # type: ignore[return-value]


@contextmanager
def reading(source: str) -> Iterator[None]:
    """Turn the ways a text file can be unreadable into one TraceError naming it.

    A damaged deflate stream raises zlib.error and a cut-off one EOFError, neither an
    OSError, so without this a bad .gz crashed the CLI with a traceback.
    """
    try:
        yield
    except UnicodeDecodeError as e:
        raise TraceError(f"{source}: not UTF-8 text: {e}") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise TraceError(f"{source}: broken gzip file: {e}") from None
    except csv.Error as e:
        raise TraceError(f"{source}: CSV error: {e}") from None


def fixed_csv_rows(source: str, f: Iterable[str], header: list[str],
                   header_text: str | None = None) -> Iterator[tuple[str, list[str]]]:
    """Rows of a CSV with exactly `header` (checked) as (\"file:line\", fields); blank lines
    are skipped and a row with another field count is a TraceError naming its line. Used by
    the fixed-column inputs (public traces, devices.csv); the canonical trace has optional
    columns and its own reader."""
    reader = csv.reader(f)
    got = next(reader, None)
    if got is None or [h.strip() for h in got] != header:
        raise TraceError(f"{source}:1: expected the header {header_text or ','.join(header)}, got {got}")
    for row in reader:
        if not row:
            continue
        where = f"{source}:{reader.line_num}"
        if len(row) != len(header):
            raise TraceError(f"{where}: expected {len(header)} fields, got {len(row)}")
        yield where, row


def _is_jsonl(path: str | os.PathLike[str]) -> bool:
    name = str(path).removesuffix(".gz")
    return name.endswith(".jsonl") or name.endswith(".ndjson")


class _Columns:
    """Accumulates parsed rows; interns names."""

    def __init__(self) -> None:
        self.arrival: list[float] = []
        self.app: list[int] = []
        self.model: list[int] = []
        self.inp: list[int] = []
        self.out: list[int] = []
        self.ttft: list[float] = []
        self.tpot: list[float] = []
        self.apps: dict[str, int] = {}
        self.models: dict[str, int] = {}
        self.last = -math.inf

    def add(self, where: str, arrival: float, app: str, model: str, inp: int, out: int, ttft: float, tpot: float) -> None:
        if not math.isfinite(arrival) or arrival < 0:
            raise TraceError(f"{where}: arrival_s must be a finite number >= 0, got {arrival!r}")
        if arrival < self.last:
            raise TraceError(f"{where}: arrival_s {arrival!r} is before the previous row's {self.last!r} (traces must be sorted)")
        if not app:
            raise TraceError(f"{where}: app is empty")
        if not model:
            raise TraceError(f"{where}: model is empty")
        if inp < 1:
            raise TraceError(f"{where}: input_tokens must be >= 1, got {inp}")
        if out < 1:
            raise TraceError(f"{where}: output_tokens must be >= 1, got {out}")
        for name, v in (("ttft_slo_ms", ttft), ("tpot_slo_ms", tpot)):
            if not math.isnan(v) and not (math.isfinite(v) and v > 0):
                raise TraceError(f"{where}: {name} must be a number > 0 or empty, got {v!r}")
        self.last = arrival
        self.arrival.append(arrival)
        self.app.append(self.apps.setdefault(app, len(self.apps)))
        self.model.append(self.models.setdefault(model, len(self.models)))
        self.inp.append(inp)
        self.out.append(out)
        self.ttft.append(ttft)
        self.tpot.append(tpot)

    def trace(self) -> Trace:
        return Trace(
            np.asarray(self.arrival, dtype=np.float64), np.asarray(self.app, dtype=np.int32),
            np.asarray(self.model, dtype=np.int32), np.asarray(self.inp, dtype=np.int64),
            np.asarray(self.out, dtype=np.int64), np.asarray(self.ttft, dtype=np.float64),
            np.asarray(self.tpot, dtype=np.float64), tuple(self.apps), tuple(self.models),
        )  # fmt: skip


def _int(where: str, name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise TraceError(f"{where}: {name} must be an integer, got {text!r}") from None


def _float(where: str, name: str, text: str, empty_ok: bool = False) -> float:
    if empty_ok and text == "":
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise TraceError(f"{where}: {name} must be a number, got {text!r}") from None


def _read_csv(f: io.TextIOBase, source: str) -> Trace:
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{source}:1: empty file (expected the header {','.join(REQUIRED)})")
    header = [h.strip() for h in header]
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:
        raise TraceError(f"{source}:1: bad header: column {twice[0]!r} appears twice")
    missing = [c for c in REQUIRED if c not in header]
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if missing or unknown:
        hint = ""
        if "TIMESTAMP" in header or "rate_rps" in header:
            hint = " (a public trace: convert it first with `janus trace convert --format azure|servegen`)"
        raise TraceError(
            f"{source}:1: bad header: missing {missing}, unknown {unknown}; "
            f"expected {','.join(REQUIRED)}[,ttft_slo_ms,tpot_slo_ms]{hint}"
        )
    col = {name: header.index(name) for name in header}
    ia, iapp, imod, iin, iout = (col[c] for c in REQUIRED)
    itt, itp = col.get("ttft_slo_ms"), col.get("tpot_slo_ms")
    width = len(header)
    cols = _Columns()
    for row in reader:
        where = f"{source}:{reader.line_num}"
        if not row:
            continue
        if len(row) != width:
            raise TraceError(f"{where}: expected {width} fields, got {len(row)}")
        cols.add(
            where,
            _float(where, "arrival_s", row[ia]),
            row[iapp], row[imod],
            _int(where, "input_tokens", row[iin]),
            _int(where, "output_tokens", row[iout]),
            math.nan if itt is None else _float(where, "ttft_slo_ms", row[itt], True),
            math.nan if itp is None else _float(where, "tpot_slo_ms", row[itp], True),
        )  # fmt: skip
    return cols.trace()


def _read_jsonl(f: io.TextIOBase, source: str) -> Trace:
    decoder = msgspec.json.Decoder(TraceRow)
    cols = _Columns()
    for lineno, line in enumerate(f, start=1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            r = decoder.decode(line)
        except msgspec.ValidationError as e:
            raise TraceError(f"{where}: {e}") from None
        except msgspec.DecodeError as e:
            raise TraceError(f"{where}: not valid JSON: {e}") from None
        cols.add(
            where, r.arrival_s, r.app, r.model, r.input_tokens, r.output_tokens,
            math.nan if r.ttft_slo_ms is None else r.ttft_slo_ms,
            math.nan if r.tpot_slo_ms is None else r.tpot_slo_ms,
        )  # fmt: skip
    return cols.trace()


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Load a canonical trace (CSV or JSONL, optionally .gz). Raises TraceError."""
    source = str(path)
    if not Path(path).is_file():
        raise TraceError(f"{source}: no such file")
    with reading(source), open_text(path) as f:
        return _read_jsonl(f, source) if _is_jsonl(path) else _read_csv(f, source)


def _fmt_slo(v: float) -> str:
    return "" if math.isnan(v) else f"{v:g}"


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write a trace as CSV (or JSONL when the name ends .jsonl[.gz]); arrivals to 1 us.

    SLO columns are written only when some row has one. Writes to a temporary name and
    renames, so a reader never sees half a file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp" + (".gz" if path.name.endswith(".gz") else ""))
    apps = trace.app_names()
    models = trace.model_names()
    arrivals = [f"{a:.6f}" for a in trace.arrival_s.tolist()]
    with open_text(tmp, "w") as f:
        if _is_jsonl(path):
            enc = msgspec.json.Encoder()
            for row in trace.rows():
                row.arrival_s = float(f"{row.arrival_s:.6f}")
                f.write(enc.encode(row).decode() + "\n")
        else:
            slo = trace.has_slo
            f.write(",".join(REQUIRED + (OPTIONAL if slo else ())) + "\n")
            ins, outs = trace.input_tokens.tolist(), trace.output_tokens.tolist()
            if slo:
                tts, tps = trace.ttft_slo_ms.tolist(), trace.tpot_slo_ms.tolist()
                lines = (
                    f"{arrivals[i]},{_csv_cell(apps[i])},{_csv_cell(models[i])},{ins[i]},{outs[i]},{_fmt_slo(tts[i])},{_fmt_slo(tps[i])}\n"
                    for i in range(len(trace))
                )
            else:
                lines = (f"{arrivals[i]},{_csv_cell(apps[i])},{_csv_cell(models[i])},{ins[i]},{outs[i]}\n" for i in range(len(trace)))
            f.writelines(lines)
    os.replace(tmp, path)


def _csv_cell(text: str) -> str:
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text

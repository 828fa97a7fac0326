"""Loader for Alibaba ServeGen (NSDI'26; Apache-2.0), as stored in /work/shared/traces/servegen.

ServeGen publishes no per-request log but, per client (an API customer = our app) and
600 s window, a rate, an inter-arrival CV and a fitted Gamma/Weibull inter-arrival
distribution (`rates_<category>_<model>.csv[.gz]`), plus per client and 6 h window the
101 quantiles of each token field (`lengths_<category>_<model>.csv[.gz]`, found next to
the rates file). We turn that into requests the way ServeGen's own generator does:

- arrivals: in each (client, window) we draw n = stochastic_round(rate x 600 x
  rate_scale) arrivals; n + 1 IATs come from the fitted distribution (numpy's gamma /
  weibull with scipy's shape/scale parameterisation), and their cumulative sums are
  rescaled so the n + 1 gaps exactly span the window. The rate is kept exactly and the
  IAT shape (burstiness) is the fitted one.
- lengths: u ~ U(0, 1), linear interpolation between the 101 quantiles of that client's
  6 h window (nearest window of the client when that one is missing; the quantile-average
  over all clients of the window when the client has no length rows at all, as for the
  clients whose upstream JSON was too large to store). Values are rounded, clipped to >= 1.
  Multimodal traces have no input_tokens field: input = text_tokens + image_count x
  image_tokens + audio_count x audio_tokens + video_count x video_tokens.

App names are '<model>-c<client>'; the model column is the model name from the file name.
A 14-day language trace is hundreds of millions of requests: choose a slice with
start_s/duration_s and thin it with rate_scale; max_requests guards the size.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from janusd.trace.formats import Trace, TraceError, fixed_csv_rows, open_text, reading

RATE_HEADER = ["client_id", "window_start_s", "rate_rps", "cv", "iat_dist", "iat_p1", "iat_p2"]
RATE_WINDOW_S = 600.0
LENGTH_WINDOW_S = 21600.0


def model_name(path: str | os.PathLike[str]) -> str:
    """'rates_language_m-large.csv.gz' -> 'm-large'."""
    stem = Path(path).name.split(".")[0]
    m = re.match(r"^(?:rates|lengths)_[A-Za-z]+_(.+)$", stem)
    return m.group(1) if m else stem


def lengths_path_for(rates_path: str | os.PathLike[str]) -> Path:
    p = Path(rates_path)
    return p.with_name(p.name.replace("rates_", "lengths_", 1))


def _read_rates(path: str | os.PathLike[str], start_s: float, end_s: float) -> list[tuple[int, float, float, str, float, float]]:
    src = str(path)
    rows = []
    with reading(src), open_text(path) as f:
        for where, row in fixed_csv_rows(src, f, RATE_HEADER):
            try:
                client, w0 = int(row[0]), float(row[1])
                rate, p1, p2 = float(row[2]), float(row[5]), float(row[6])
            except ValueError:
                raise TraceError(f"{where}: client_id/window_start_s/rate_rps/iat_p1/iat_p2 must be numbers") from None
            dist = row[4].strip()
            if dist not in ("Gamma", "Weibull"):
                raise TraceError(f"{where}: iat_dist must be Gamma or Weibull, got {dist!r}")
            if not (rate >= 0 and p1 > 0 and p2 > 0) or not np.isfinite([rate, p1, p2]).all():
                raise TraceError(f"{where}: need rate_rps >= 0 and iat_p1, iat_p2 > 0")
            if w0 + RATE_WINDOW_S > start_s and w0 < end_s and rate > 0:
                rows.append((client, w0, rate, dist, p1, p2))
    return rows


def _read_lengths(path: str | os.PathLike[str]) -> dict[tuple[int, int, str], np.ndarray]:
    """(client, window_start_s, field) -> the 101 quantiles."""
    src = str(path)
    out: dict[tuple[int, int, str], np.ndarray] = {}
    with reading(src), open_text(path) as f:
        want = ["client_id", "window_start_s", "field"] + [f"q{k}" for k in range(101)]
        for where, row in fixed_csv_rows(src, f, want, "client_id,window_start_s,field,q0..q100"):
            try:
                q = np.array(row[3:], dtype=np.float64)
                key = (int(row[0]), int(float(row[1])), row[2].strip())
            except ValueError:
                raise TraceError(f"{where}: quantiles, client_id and window_start_s must be numbers") from None
            if np.any(np.diff(q) < 0) or not np.isfinite(q).all():
                raise TraceError(f"{where}: quantiles must be finite and non-decreasing")
            out[key] = q
    return out


class _LengthSampler:
    def __init__(self, table: dict[tuple[int, int, str], np.ndarray]) -> None:
        self.table = table
        self.by_client: dict[tuple[int, str], list[int]] = defaultdict(list)
        pooled: dict[tuple[int, str], list[np.ndarray]] = defaultdict(list)
        for (c, w, field), q in table.items():
            self.by_client[(c, field)].append(w)
            pooled[(w, field)].append(q)
        self.pooled = {k: np.mean(v, axis=0) for k, v in pooled.items()}
        self.fields = {field for (_, _, field) in table}

    def quantiles(self, client: int, window: int, field: str) -> np.ndarray | None:
        if (client, window, field) in self.table:
            return self.table[(client, window, field)]
        wins = self.by_client.get((client, field))
        if wins:
            return self.table[(client, min(wins, key=lambda w: abs(w - window)), field)]
        pooled_wins = [w for (w, f) in self.pooled if f == field]
        if not pooled_wins:
            return None
        return self.pooled[(min(pooled_wins, key=lambda w: abs(w - window)), field)]

    def draw(self, rng: np.random.Generator, client: int, window: int, field: str, n: int) -> np.ndarray:
        q = self.quantiles(client, window, field)
        if q is None:
            raise TraceError(f"the lengths file has no field {field!r}")
        return np.interp(rng.random(n) * 100.0, np.arange(101.0), q)

    def inputs(self, rng: np.random.Generator, client: int, window: int, n: int) -> np.ndarray:
        if "input_tokens" in self.fields:
            return self.draw(rng, client, window, "input_tokens", n)
        total = self.draw(rng, client, window, "text_tokens", n)
        for kind in ("image", "audio", "video"):
            if f"{kind}_tokens" in self.fields and f"{kind}_count" in self.fields:
                count = np.rint(self.draw(rng, client, window, f"{kind}_count", n))
                total = total + count * self.draw(rng, client, window, f"{kind}_tokens", n)
        return total


def load_servegen(
    rates_path: str | os.PathLike[str],
    lengths_path: str | os.PathLike[str] | None = None,
    *,
    start_s: float = 0.0,
    duration_s: float = 3600.0,
    rate_scale: float = 1.0,
    seed: int = 0,
    model: str | None = None,
    max_requests: int = 5_000_000,
) -> Trace:
    """Requests of [start_s, start_s + duration_s) of a ServeGen model; time 0 = start_s."""
    if not (duration_s > 0 and rate_scale > 0 and start_s >= 0):
        raise ValueError("need duration_s > 0, rate_scale > 0 and start_s >= 0")
    if not Path(rates_path).is_file():
        raise TraceError(f"{rates_path}: no such file")
    lengths_path = Path(lengths_path) if lengths_path is not None else lengths_path_for(rates_path)
    if not lengths_path.is_file():
        raise TraceError(f"{lengths_path}: no such file (the lengths file that goes with {rates_path})")
    end_s = start_s + duration_s
    rows = _read_rates(rates_path, start_s, end_s)
    expected = sum(r[2] * RATE_WINDOW_S for r in rows) * rate_scale
    if expected > max_requests:
        raise ValueError(f"that slice is ~{expected:.3g} requests (> {max_requests}); lower --rate-scale or --duration")
    lengths = _LengthSampler(_read_lengths(lengths_path))
    name = model or model_name(rates_path)
    rng = np.random.default_rng(seed)
    times, clients, inp, out = [], [], [], []
    for client, w0, rate, dist, p1, p2 in rows:
        x = rate * RATE_WINDOW_S * rate_scale
        n = int(x) + int(rng.random() < x - int(x))
        if n == 0:
            continue
        iat = rng.gamma(p1, p2, n + 1) if dist == "Gamma" else rng.weibull(p1, n + 1) * p2
        cum = np.cumsum(iat)
        t = w0 + cum[:n] / cum[-1] * RATE_WINDOW_S if cum[-1] > 0 else w0 + np.sort(rng.random(n)) * RATE_WINDOW_S
        t = t[(t >= start_s) & (t < end_s)]
        if len(t) == 0:
            continue
        lw = int(w0 // LENGTH_WINDOW_S * LENGTH_WINDOW_S)
        times.append(t - start_s)
        clients.append(np.full(len(t), client))
        inp.append(lengths.inputs(rng, client, lw, len(t)))
        out.append(lengths.draw(rng, client, lw, "output_tokens", len(t)))
    if not times:
        raise TraceError(f"{rates_path}: no requests in [{start_s}, {end_s}) s")
    client_all = np.concatenate(clients)
    width = len(str(int(client_all.max())))
    return Trace.build(
        np.round(np.concatenate(times), 6),
        np.array([f"{name}-c{c:0{width}d}" for c in client_all]),
        np.full(len(client_all), name),
        np.maximum(np.rint(np.concatenate(inp)), 1).astype(np.int64),
        np.maximum(np.rint(np.concatenate(out)), 1).astype(np.int64),
        sort=True,
    )

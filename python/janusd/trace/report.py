"""Figures and a headline table from one or more run directories (results.py layout).

The plots follow the paper's evaluation figures (PAPER.md §9): load, goodput and active
devices over time; per-token, TTFT and TPOT attainment over time; the distribution (CDF)
of per-app attainment. Several runs (systems) are overlaid, labelled by directory name.
All numbers come from slo.py, so the report agrees with the replayer's summary.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from janusd.trace import slo
from janusd.trace.formats import TraceError
from janusd.trace.results import Results, read_devices, read_results

FIGURES = ("timeline.png", "attainment.png", "app_cdf.png")
STYLES = ("-", "--", "-.", ":")  # runs differ by line style too, so identical curves stay visible


@dataclass
class Run:
    name: str
    results: Results
    outcomes: slo.Outcomes
    devices: tuple[np.ndarray, np.ndarray] | None
    valid: bool | None


def load_run(path: str | os.PathLike[str]) -> Run:
    d = Path(path)
    if not (d / "results.jsonl").is_file():
        raise TraceError(f"{d}: no results.jsonl (not a run directory)")
    res = read_results(d / "results.jsonl")
    if len(res) == 0:
        raise TraceError(f"{d}/results.jsonl: no results")
    valid = None
    if (d / "summary.json").is_file():
        import json

        try:
            valid = json.loads((d / "summary.json").read_text()).get("valid")
        except ValueError:
            raise TraceError(f"{d}/summary.json: not valid JSON") from None
    return Run(d.resolve().name, res, res.outcomes(), read_devices(d / "devices.csv"), valid)


def pick_window(span_s: float, requests: int | None = None) -> float:
    """About 60 points per series but at least ~10 requests per window on average (so a
    ratio is not one request's 0 or 1), rounded up to a 1-2-5 step, at least 1 s."""
    raw = max(span_s / 60.0, 1.0)
    if requests:
        raw = max(raw, span_s * 10.0 / requests)
    exp = 10 ** np.floor(np.log10(raw))
    for step in (1, 2, 5, 10):
        if raw <= step * exp:
            return float(step * exp)
    return float(10 * exp)


def headline(run: Run) -> dict[str, float | int | str | bool | None]:
    r = run.results
    span = float(r.arrival_s.max() - r.arrival_s.min())
    figures = slo.summarize(run.outcomes, r.app_id, len(r.apps), span if span > 0 else float("nan"))
    return {"run": run.name, "valid": run.valid, **figures}


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return "-" if np.isnan(v) else f"{v:.3f}"
    return str(v)


def markdown_table(rows: list[dict], notes: list[str]) -> str:
    cols = [
        ("run", "run"), ("valid", "valid"), ("requests", "requests"), ("token_attainment", "per-token"),
        ("ttft_attainment", "TTFT"), ("tpot_attainment", "TPOT"), ("e2e_attainment", "end-to-end"),
        ("goodput_rps", "goodput (req/s)"), ("app_mean_token_attainment", "app mean"),
        ("app_worst_token_attainment", "worst app"),
    ]  # fmt: skip
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(k)) for k, _ in cols) + " |")
    text = "# Run report\n\nAttainments are fractions; per-token, TTFT, TPOT and end-to-end as defined in janusd/trace/slo.py.\n\n"
    text += "\n".join(lines) + "\n"
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return text


@dataclass
class TimeAxis:
    """The shared x axis of the time plots: the runs' span, the window and the unit."""

    t0: float
    t1: float
    w: float
    unit: str
    div: float

    def x(self, start_s: np.ndarray) -> np.ndarray:
        return (start_s + self.w / 2 - self.t0) / self.div

    def label(self) -> str:
        return f"time ({self.unit}), {self.w:g} s windows"


def _load_runs(run_dirs: list[str | os.PathLike[str]]) -> list[Run]:
    if not run_dirs:
        raise ValueError("give at least one run directory")
    runs = [load_run(d) for d in run_dirs]
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"run directories must have distinct names, got {names}")
    return runs


def _time_axis(runs: list[Run], window_s: float | None) -> TimeAxis:
    t0 = min(float(r.results.arrival_s.min()) for r in runs)
    t1 = max(float(r.results.arrival_s.max()) for r in runs)
    w = window_s or pick_window(t1 - t0, max(len(r.results) for r in runs))
    unit, div = ("min", 60.0) if (t1 - t0) > 600 else ("s", 1.0)
    return TimeAxis(t0, t1, w, unit, div)


def _timeline(plt: Any, runs: list[Run], series: dict[str, dict], t: TimeAxis, path: Path) -> list[str]:
    """Load, goodput and (where a run has devices.csv) active devices over time; the notes
    the table needs."""
    import matplotlib.ticker

    have_devices = any(r.devices is not None for r in runs)
    notes = [] if have_devices else ["Active devices: no run has devices.csv, so that panel is omitted."]
    panels = 3 if have_devices else 2
    fig, axes = plt.subplots(panels, 1, figsize=(7.0, 2.0 * panels + 0.4), sharex=True)
    for k, r in enumerate(runs):
        s = series[r.name]
        ls = STYLES[k % len(STYLES)]
        axes[0].plot(t.x(s["start_s"]), s["load_rps"], lw=1.2, ls=ls, label=r.name)
        axes[1].plot(t.x(s["start_s"]), s["goodput_rps"], lw=1.2, ls=ls, label=r.name)
        if have_devices and r.devices is not None:
            dt, dv = r.devices
            if len(dt) and dt[-1] < t.t1:  # hold the last value to the end of the run
                dt, dv = np.append(dt, t.t1), np.append(dv, dv[-1])
            axes[2].step((dt - t.t0) / t.div, dv, where="post", lw=1.2, ls=ls, label=r.name)
    axes[0].set_ylabel("load (req/s)")
    axes[1].set_ylabel("goodput (req/s)")
    if have_devices:
        axes[2].set_ylabel("active devices")
        axes[2].yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    for ax in axes:
        ax.set_ylim(bottom=0)
    axes[-1].set_xlabel(t.label())
    axes[0].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return notes


def _attainment(plt: Any, runs: list[Run], series: dict[str, dict], t: TimeAxis, path: Path) -> None:
    """Per-token, TTFT and TPOT attainment over time."""
    fig, axes = plt.subplots(3, 1, figsize=(7.0, 6.4), sharex=True)
    for key, ax, label in zip(("token_attainment", "ttft_attainment", "tpot_attainment"), axes,
                              ("per-token attainment", "TTFT attainment", "TPOT attainment"), strict=True):  # fmt: skip
        for k, r in enumerate(runs):
            s = series[r.name]
            ax.plot(t.x(s["start_s"]), s[key], lw=1.2, ls=STYLES[k % len(STYLES)], marker=".", ms=3, label=r.name)
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
    axes[0].legend(loc="lower right", fontsize=8)
    axes[-1].set_xlabel(t.label())
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _app_cdf(plt: Any, runs: list[Run], path: Path) -> None:
    """The distribution of per-app per-token attainment, one curve per run."""
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    for k, r in enumerate(runs):
        att = slo.per_app(r.outcomes, r.results.app_id, len(r.results.apps))["token_attainment"]
        att = np.sort(att[~np.isnan(att)])
        if len(att):
            ax.step(np.concatenate([[0.0], att]), np.arange(len(att) + 1) / len(att), where="post", lw=1.4,
                    ls=STYLES[k % len(STYLES)], label=f"{r.name} ({len(att)} apps)")
    ax.set_xlabel("per-app per-token attainment")
    ax.set_ylabel("CDF of apps")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(0, 1.02)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def make_report(run_dirs: list[str | os.PathLike[str]], out_dir: str | os.PathLike[str], window_s: float | None = None) -> dict:
    """Write the PNGs and summary.md into out_dir; return {"figures": [...], "table": path, "rows": [...]}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _load_runs(run_dirs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t = _time_axis(runs, window_s)
    series = {r.name: slo.windows(r.outcomes, r.results.arrival_s, t.w, t.t0, t.t1) for r in runs}
    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False})
    notes = _timeline(plt, runs, series, t, out / "timeline.png")
    _attainment(plt, runs, series, t, out / "attainment.png")
    _app_cdf(plt, runs, out / "app_cdf.png")
    rows = [headline(r) for r in runs]
    for r in runs:
        if r.valid is False:
            notes.append(f"{r.name}: the replayer fell behind schedule beyond its bound; its figures describe the client too.")
    (out / "summary.md").write_text(markdown_table(rows, notes))
    return {"figures": [str(out / f) for f in FIGURES], "table": str(out / "summary.md"), "window_s": t.w, "rows": rows}

"""The figures and verdicts of `janus bench dispatch-replay`: per-run SLO figures from
the replayer's results and the daemon's /metrics, their spread over runs, and the verdict
of each lst_imh variant against every other.

Pure functions of recorded results (no daemon, no clock), split from the bench's driver
(bench/dispatch_replay.py) so that a recorded run's JSON can be re-judged and tested
without running anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

VERDICT_RANK = {"not_better": 0, "tie": 1, "mean_above": 2, "beyond_spread": 3}
PREFILL_ERROR = "janusd_prefill_estimate_error_seconds"


def is_slo_rejection(status: str, http_status: int | None, error: str | None) -> bool:
    """A 503 slo_unattainable refusal (the daemon's reply to a request it rejected)."""
    e = error or ""
    return status == "error" and http_status == 503 and ("slo_unattainable" in e or "cannot meet its TTFT SLO" in e)


def _pct(xs: Sequence[float], q: float) -> float | None:
    import numpy as np

    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else None


def run_figures(rows: Sequence[Any], span_s: float) -> dict[str, Any]:
    """SLO figures of one replay from its RequestResults (trace/slo.py definitions)."""
    from janusd.trace import slo
    from janusd.trace.results import results_from

    import numpy as np

    res = results_from(list(rows))
    outcomes = res.outcomes()
    fig = slo.summarize(outcomes, res.app_id, len(res.apps), span_s)
    rejected = sum(is_slo_rejection(r.status, r.http_status, r.error) for r in rows)
    failed = sum(r.status != "ok" for r in rows)
    ttft = [r.token_times_s[0] * 1e3 for r in rows if r.status == "ok" and r.token_times_s]
    # per served model (the mixed scenario's classes), rows in results_from's order (by index)
    ordered = sorted(rows, key=lambda r: r.index)
    names = sorted({r.model for r in ordered})
    by_model: dict[str, Any] = {}
    if len(names) > 1:
        mid = np.array([names.index(r.model) for r in ordered], dtype=np.int64)
        per = slo.per_app(outcomes, mid, len(names))
        for k, name in enumerate(names):
            by_model[name] = {
                "requests": int(per["requests"][k]),
                "token_attainment": float(per["token_attainment"][k]),
                "ttft_attainment": float(per["ttft_attainment"][k]),
                "rejected": int(sum(is_slo_rejection(r.status, r.http_status, r.error)
                                    for r in ordered if r.model == name)),
            }
    return {
        "by_model": by_model,
        "requests": fig["requests"],
        "token_attainment": fig["token_attainment"],
        "ttft_attainment": fig["ttft_attainment"],
        "tpot_attainment": fig["tpot_attainment"],
        "rejected": int(rejected),
        "other_failures": int(failed - rejected),
        "ttft_p50_ms": _pct(ttft, 50),
        "ttft_p99_ms": _pct(ttft, 99),
    }


def metrics_figures(text: str) -> dict[str, float | None]:
    """From one /metrics scrape: janusd_rejected_total{reason="slo"} summed over models
    (None when the family is absent) and the prefill estimate error's sum and count
    (None when the daemon does not export it)."""
    from prometheus_client.parser import text_string_to_metric_families

    rejected: float | None = None
    err_sum: float | None = None
    err_count: float | None = None
    for fam in text_string_to_metric_families(text):
        if fam.name == "janusd_rejected":
            rejected = rejected or 0.0
            rejected += sum(s.value for s in fam.samples
                            if s.name == "janusd_rejected_total" and s.labels.get("reason") == "slo")
        elif fam.name == PREFILL_ERROR:
            for s in fam.samples:
                if s.name == PREFILL_ERROR + "_sum":
                    err_sum = (err_sum or 0.0) + s.value
                elif s.name == PREFILL_ERROR + "_count":
                    err_count = (err_count or 0.0) + s.value
    return {"rejected_slo": rejected, "prefill_error_sum_s": err_sum, "prefill_error_count": err_count}


def metrics_delta(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, float | None]:
    """What one replay added: rejections (metric) and the mean absolute prefill estimate
    error in ms over the estimates made during it (None when absent or none made)."""

    def diff(key: str) -> float | None:
        a, b = after.get(key), before.get(key)
        return None if a is None else a - (b or 0.0)

    rej = diff("rejected_slo")
    s, c = diff("prefill_error_sum_s"), diff("prefill_error_count")
    return {
        "rejected_metric": rej,
        "prefill_estimate_mae_ms": s / c * 1e3 if s is not None and c else None,
        "prefill_estimates": c,
    }


def spread(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """mean, min, max (and how many) over the runs' non-null, finite values."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


AGG_KEYS = ("token_attainment", "ttft_attainment", "tpot_attainment", "rejected", "rejected_metric",
            "ttft_p50_ms", "ttft_p99_ms", "prefill_estimate_mae_ms")


def aggregate(records: Sequence[dict[str, Any]], loads: Sequence[float], labels: Sequence[str]) -> dict[str, Any]:
    """Per load (key str(load)) and variant label: spread of each figure over the runs.

    A record: {"load", "variant", "run", "error"?, "valid"?, and the run's figures}. Runs
    that failed (an "error") are counted, not averaged; invalid runs (replayer lag) are
    averaged and counted.
    """
    out: dict[str, Any] = {}
    for load in loads:
        per: dict[str, Any] = {}
        for label in labels:
            mine = [r for r in records if r["load"] == load and r["variant"] == label]
            good = [r for r in mine if not r.get("error")]
            entry: dict[str, Any] = {"runs": len(good), "failed_runs": len(mine) - len(good),
                                     "invalid_runs": sum(1 for r in good if r.get("valid") is False)}
            for key in AGG_KEYS:
                entry[key] = spread([r.get(key) for r in good])
            models = sorted({m for r in good for m in (r.get("by_model") or {})})
            if models:  # per served model: token attainment and refusals over the runs
                entry["by_model"] = {m: {k: spread([(r.get("by_model") or {}).get(m, {}).get(k) for r in good])
                                         for k in ("token_attainment", "rejected")} for m in models}
            per[label] = entry
        out[str(load)] = per
    return out


def compare(mine: dict[str, Any], other: dict[str, Any]) -> str | None:
    """One verdict of `mine` against `other` from their spreads (higher is better)."""
    if not (mine["n"] and other["n"]):
        return None
    if mine["mean"] == other["mean"] and mine["min"] == other["max"]:
        return "tie"  # e.g. every run of both at 1.0
    if mine["min"] >= other["max"]:
        return "beyond_spread"
    if mine["mean"] > other["mean"]:
        return "mean_above"
    if mine["mean"] == other["mean"]:
        return "tie"
    return "not_better"


def verdicts(per_variant: dict[str, dict[str, Any]], variant_policy: dict[str, str],
             key: str = "token_attainment") -> dict[str, Any]:
    """For each lst_imh variant: its verdict on `key` against every other variant (None
    where either side has no successful run), "overall", the weakest of the known ones
    (None when none is known), and "missing", the variants it could not be compared to."""
    out: dict[str, Any] = {}
    for label, pol in variant_policy.items():
        if pol != "lst_imh":
            continue
        vs = {o: compare(per_variant[label][key], per_variant[o][key]) for o in variant_policy if o != label}
        known = [v for v in vs.values() if v is not None]
        overall = min(known, key=VERDICT_RANK.__getitem__) if known else None
        out[label] = {"metric": key, "vs": vs, "overall": overall, "missing": [o for o, v in vs.items() if v is None]}
    return out


def rounded(obj: Any, nd: int = 4) -> Any:
    """Floats rounded to nd decimals, recursively (the JSON stays readable)."""
    if isinstance(obj, float):
        return round(obj, nd) if math.isfinite(obj) else obj
    if isinstance(obj, dict):
        return {k: rounded(v, nd) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [rounded(v, nd) for v in obj]
    return obj


def _fmt(x: Any, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _table(agg: dict[str, Any], verdict: dict[str, Any]) -> list[str]:
    lines = []
    for load, per in agg.items():
        lines.append(f"load {load}x: variant  runs  token_att mean [min, max]  ttft_att mean  rejected mean  "
                     f"p99_ttft_ms mean  prefill_err_ms")
        for label, e in per.items():
            t = e["token_attainment"]
            lines.append(f"  {label:<16} {e['runs']:>2}  {_fmt(t['mean'])} [{_fmt(t['min'])}, {_fmt(t['max'])}]  "
                         f"{_fmt(e['ttft_attainment']['mean'])}  {_fmt(e['rejected']['mean'], 1)}  "
                         f"{_fmt(e['ttft_p99_ms']['mean'], 1)}  {_fmt(e['prefill_estimate_mae_ms']['mean'], 2)}")
            for m, f in (e.get("by_model") or {}).items():
                lines.append(f"      {m:<10} token_att {_fmt(f['token_attainment']['mean'])}  "
                             f"rejected {_fmt(f['rejected']['mean'], 1)}")
        for label, v in verdict.get(load, {}).items():
            lines.append(f"  verdict {label}: {v['overall']} ({', '.join(f'{k}: {x}' for k, x in v['vs'].items())})")
    return lines

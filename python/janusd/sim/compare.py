"""The figures a simulated run and a real replay are compared by (bench/RESULTS.md "sim",
the cpu side by side; tests/test_sim_calibration.py).

Both runs are per-request RequestResults (trace/results.py): `janus replay` writes them,
`Cluster.result_rows` makes them. Attainment follows trace/slo.py; TTFT is the first
token's time after arrival, TPOT a request's mean gap between tokens (the per-request
figure TPOT attainment checks), both over requests that ended ok. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from janusd.trace import slo
from janusd.trace.results import RequestResult, results_from

PERCENTILES = (50, 90, 99)


def figures(rows: Sequence[RequestResult], span_s: float) -> dict[str, float | int | None]:
    res = results_from(list(rows))
    s = slo.summarize(res.outcomes(), res.app_id, len(res.apps), max(span_s, 1e-9))
    ok = [r for r in rows if r.status == "ok" and r.token_times_s]
    ttft = np.array([r.token_times_s[0] * 1e3 for r in ok])
    tpot = np.array([(r.token_times_s[-1] - r.token_times_s[0]) / (len(r.token_times_s) - 1) * 1e3
                     for r in ok if len(r.token_times_s) > 1])
    out: dict[str, float | int | None] = {
        "requests": len(rows), "ok": len(ok), "token_attainment": s["token_attainment"],
        "ttft_attainment": s["ttft_attainment"], "tpot_attainment": s["tpot_attainment"],
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot)):
        for q in PERCENTILES:
            out[f"{name}_p{q}_ms"] = float(np.percentile(xs, q)) if len(xs) else None
    return out

"""Trace statistics on hand-made traces."""

import numpy as np
import pytest

from janusd.trace.formats import Trace
from janusd.trace.stats import max_burst_ratio, trace_stats


def _build(rows):
    rows = sorted(rows)
    return Trace.build(
        np.array([r[0] for r in rows]), [r[1] for r in rows], ["m"] * len(rows),
        np.array([r[2] for r in rows]), np.array([r[3] for r in rows]),
    )  # fmt: skip


def test_burst_ratio_hand_computed():
    # app "hot": 2 req/s for 100 s (t = 0, 0.5, ..., 99.5) plus 20 extra in [40, 50)
    rows = [(i * 0.5, "hot", 1, 1) for i in range(200)] + [(40 + i * 0.5 + 0.25, "hot", 1, 1) for i in range(20)]
    # app "rare": 5 requests all in one window: not eligible (far below 1 req/s)
    rows += [(70.1 + i * 0.01, "rare", 1, 1) for i in range(5)]
    t = _build(rows)
    span = 99.5
    mean = 220 / span
    assert max_burst_ratio(t) == pytest.approx((40 / 10) / mean)
    assert max_burst_ratio(_build([(0.0, "a", 1, 1), (50.0, "a", 1, 1)])) is None


def test_stats_shares_hand_computed():
    # 10 apps; app0 has 8 of 17 requests... top12% of 10 apps = 1 app, top30% = 3 apps
    rows = [(float(i), "a0", 1, 1) for i in range(8)]
    rows += [(100.0 + i, f"a{i + 1}", 1000 if i < 3 else 10, 10) for i in range(9)]
    s = trace_stats(_build(rows))
    assert s["requests"] == 17 and s["apps"] == 10 and s["duration_s"] == 108.0
    assert s["top12pct_request_share"] == round(8 / 17, 4)
    tokens = 8 * 2 + 3 * 1010 + 6 * 20
    assert s["top30pct_token_share"] == round(3 * 1010 / tokens, 4)
    assert s["max_burst_ratio"] is None


def test_stats_cli_json_last_line_has_exactly_the_issued_keys(tmp_path, capsys):
    import argparse
    import json

    from janusd import trace_cli
    from janusd.trace.formats import read_trace, write_trace
    from janusd.trace.synth import SynthParams, synthesize

    write_trace(synthesize(SynthParams(apps=62, hours=0.25, seed=1, rate=20)), tmp_path / "t.csv")
    for extra in ([], ["--json"]):
        p = argparse.ArgumentParser()
        trace_cli.add_arguments(p)
        assert trace_cli.run(p.parse_args(["stats", str(tmp_path / "t.csv"), *extra])) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert len(lines) == (1 if extra else 21)  # --json: the JSON line only; else 20 app rows first
        last = json.loads(lines[-1])
        assert list(last) == ["requests", "apps", "duration_s", "top12pct_request_share", "top30pct_token_share",
                              "max_burst_ratio"]
        assert last == trace_stats(read_trace(tmp_path / "t.csv"))
        assert last["apps"] == 62 and last["requests"] > 10_000 and 890 < last["duration_s"] <= 900

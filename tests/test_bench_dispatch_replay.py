"""`janus bench dispatch-replay`: its pure parts (no daemon): the run order, capacity to
rate, the bursty trace, per-run figures, /metrics parsing, aggregation and the verdict."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from janusd.bench import cli as bench_cli
from janusd.bench import replay_figures as rf
from janusd.bench import replay_setup as rs
from janusd.bench import replay_trace as rt
from janusd.config import DispatchConfig, parse_config
from janusd.trace.results import RequestResult

KW = dict(apps=8, seed=0, compress=4.0, bursts_per_app=1.0, base_length=600.0, max_input=1024, max_output=256)


def test_registered_with_the_bench_front_and_defaults():
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    args = parser.parse_args(["dispatch-replay", "--json"])
    assert args._bench_module == "janusd.bench.dispatch_replay"
    assert (args.model, args.policies, args.plans, args.loads, args.runs) == (
        "demo:llama-small", "lst_imh,round_robin,least_load", "global", "0.7,1.5", 3)
    assert (args.ttft_slo_ms, args.tpot_slo_ms) == (500.0, 50.0)
    # 18 runs of the default duration stay well inside 15 minutes with restarts
    assert 2 * 3 * 3 * (args.duration_s + 8) + args.capacity_s + 15 < 15 * 60


def test_parse_lists_and_loads():
    assert rs.parse_list(" lst_imh, least_load,lst_imh", rs.POLICIES) == ["lst_imh", "least_load"]
    with pytest.raises(ValueError, match="unknown policy"):
        rs.parse_list("lst_imh,fifo", rs.POLICIES, "policy")
    with pytest.raises(ValueError):
        rs.parse_list(" , ")
    assert rs.parse_loads("0.7,1.5") == [0.7, 1.5]
    with pytest.raises(ValueError):
        rs.parse_loads("0.7,-1")


def test_variants_multiply_only_lst_imh_by_plan_and_the_default_writes_no_key():
    assert rs.variants(["lst_imh", "round_robin"], ["global"]) == [
        {"label": "lst_imh", "policy": "lst_imh", "plan": None, "objective": None, "baseline": None},
        {"label": "round_robin", "policy": "round_robin", "plan": None, "objective": None, "baseline": None},
    ]
    v = rs.variants(["lst_imh", "round_robin"], ["global"], ["requests"], ["peer", "guarded"])
    assert [(x["label"], x["baseline"]) for x in v] == [("lst_imh", None), ("round_robin/peer", "peer"),
                                                          ("round_robin/guarded", None)]
    v = rs.variants(["lst_imh", "least_load"], ["global", "window"])
    assert [(x["label"], x["plan"]) for x in v] == [("lst_imh/global", None), ("lst_imh/window", "window"),
                                                      ("least_load", None)]
    v = rs.variants(["lst_imh", "round_robin"], ["global"], ["requests", "tokens"])
    assert [(x["label"], x["objective"]) for x in v] == [("lst_imh/requests", None), ("lst_imh/tokens", "tokens"),
                                                           ("round_robin", None)]


def test_schedule_is_interleaved_by_run():
    s = rs.schedule([0.7, 1.5], ["a", "b"], 2)
    assert s == [(1, 0.7, "a"), (1, 0.7, "b"), (1, 1.5, "a"), (1, 1.5, "b"),
                 (2, 0.7, "a"), (2, 0.7, "b"), (2, 1.5, "a"), (2, 1.5, "b")]
    assert len(rs.schedule([0.7, 1.5], ["x", "y", "z"], 3)) == 18


def test_capacity_counts_completions_after_the_warmup():
    done = [0.5, 1.0, 2.0, 2.5, 3.0, 3.5, 9.99, 10.0, 11.0]
    assert rs.capacity_rps(done, 2.0, 10.0) == pytest.approx(5 / 8)
    assert rs.capacity_rps([], 0.0, 1.0) == 0.0
    with pytest.raises(ValueError):
        rs.capacity_rps(done, 5.0, 5.0)


def test_synth_params_scale_rate_and_bursts_with_compression():
    p = rt.synth_params(10.0, 30.0, **KW)
    assert p.hours * 3600 == pytest.approx(120.0)
    assert p.rate == pytest.approx(2.5)  # 2.5 req/s over 120 s compressed 4x = 10 req/s over 30 s
    assert p.bursts_per_app_hour * p.hours == pytest.approx(1.0)
    assert (p.apps, p.max_input, p.max_output) == (8, 1024, 256)


@pytest.mark.parametrize("load", [0.7, 1.5])
def test_trace_at_a_load_has_the_rate_the_model_and_the_slo(load):
    cap = 20.0
    t = rt.make_trace(load * cap, 30.0, "llm", 500.0, 50.0, **KW)
    assert t.models == ("llm",) and len(t.apps) > 1
    assert np.all(t.ttft_slo_ms == 500.0) and np.all(t.tpot_slo_ms == 50.0)
    assert 27.0 < t.duration_s <= 30.0 and t.arrival_s[0] == 0.0
    assert len(t) == pytest.approx(load * cap * 30.0, rel=0.2)
    assert t.input_tokens.max() <= 1024 and t.output_tokens.max() <= 256
    again = rt.make_trace(load * cap, 30.0, "llm", 500.0, 50.0, **KW)
    assert np.array_equal(t.arrival_s, again.arrival_s)  # seeded: every policy and run replays the same trace


def test_the_trace_is_bursty():
    t = rt.make_trace(30.0, 30.0, "llm", 500.0, 50.0, **{**KW, "bursts_per_app": 2.0})
    calm = rt.make_trace(30.0, 30.0, "llm", 500.0, 50.0, **{**KW, "bursts_per_app": 0.0})
    assert rt.peak_to_mean(t.arrival_s) > rt.peak_to_mean(calm.arrival_s)
    assert rt.peak_to_mean([0.0, 1.0]) is None
    assert rt.peak_to_mean([0.0, 0.1, 0.2, 3.9]) == pytest.approx((3 / 2.0) / (4 / 3.9))


def _row(i, times, status="ok", http=200, error=None, expected=3):
    return RequestResult(index=i, arrival_s=float(i), app="a", model="llm", input_tokens=10, output_tokens=expected,
                         ttft_slo_ms=500.0, tpot_slo_ms=50.0, send_lag_ms=0.0, token_times_s=times, status=status,
                         error=error, http_status=http)


def test_run_figures_count_rejections_and_ttft_of_served_requests():
    rej = ('{"error": {"message": "request rejected: it cannot meet its TTFT SLO of 500 ms", '
           '"code": "slo_unattainable"}}')
    rows = [
        _row(0, [0.1, 0.15, 0.2]),  # all on time
        _row(1, [0.6, 0.65, 0.7]),  # every token late: the deadlines are 0.5, 0.55, 0.6
        _row(2, [], "error", 503, f"HTTP 503: {rej}"),
        _row(3, [], "error", 503, "HTTP 503: the worker for device 0 is not running"),
    ]
    f = rf.run_figures(rows, 10.0)
    assert f["requests"] == 4 and f["rejected"] == 1 and f["other_failures"] == 1
    assert f["token_attainment"] == pytest.approx(3 / 12)  # row 1 misses every deadline; failed rows count 3 each
    assert f["ttft_attainment"] == pytest.approx(1 / 4)
    assert f["ttft_p50_ms"] == pytest.approx(350.0) and f["ttft_p99_ms"] == pytest.approx(595.0)
    assert rf.run_figures([rows[2]], 1.0)["ttft_p99_ms"] is None
    assert not rf.is_slo_rejection("ok", 200, None)


METRICS_OLD = """# HELP janusd_rejected_total requests refused before running
# TYPE janusd_rejected_total counter
janusd_rejected_total{model="llm",reason="slo"} 7.0
janusd_rejected_total{model="other",reason="slo"} 1.0
janusd_rejected_total{model="llm",reason="queue"} 5.0
# HELP janusd_requests_total finished requests by outcome
# TYPE janusd_requests_total counter
janusd_requests_total{model="llm",outcome="ok"} 40.0
"""

METRICS_NEW = METRICS_OLD.replace("7.0", "10.0") + """# HELP janusd_prefill_estimate_error_seconds |error| of estimates
# TYPE janusd_prefill_estimate_error_seconds histogram
janusd_prefill_estimate_error_seconds_bucket{device="0",model="llm",le="0.01"} 3.0
janusd_prefill_estimate_error_seconds_bucket{device="0",model="llm",le="+Inf"} 4.0
janusd_prefill_estimate_error_seconds_count{device="0",model="llm"} 4.0
janusd_prefill_estimate_error_seconds_sum{device="0",model="llm"} 0.04
janusd_prefill_estimate_error_seconds_count{device="1",model="llm"} 6.0
janusd_prefill_estimate_error_seconds_sum{device="1",model="llm"} 0.06
"""


def test_metrics_figures_and_deltas():
    old = rf.metrics_figures(METRICS_OLD)
    assert old == {"rejected_slo": 8.0, "prefill_error_sum_s": None, "prefill_error_count": None}
    assert rf.metrics_figures("")["rejected_slo"] is None
    d = rf.metrics_delta(old, old)
    assert d == {"rejected_metric": 0.0, "prefill_estimate_mae_ms": None, "prefill_estimates": None}
    new = rf.metrics_figures(METRICS_NEW)
    assert new["prefill_error_count"] == 10.0 and new["prefill_error_sum_s"] == pytest.approx(0.1)
    before = {**new, "rejected_slo": 8.0, "prefill_error_sum_s": 0.02, "prefill_error_count": 2.0}
    d = rf.metrics_delta(before, new)
    assert d["rejected_metric"] == 3.0 and d["prefill_estimates"] == 8.0
    assert d["prefill_estimate_mae_ms"] == pytest.approx(10.0)
    assert rf.metrics_delta(new, new)["prefill_estimate_mae_ms"] is None  # none made during the replay


def test_summary_metric_is_read_too():
    text = """# TYPE janusd_prefill_estimate_error_seconds summary
janusd_prefill_estimate_error_seconds_count{model="llm"} 2.0
janusd_prefill_estimate_error_seconds_sum{model="llm"} 0.005
"""
    f = rf.metrics_figures(text)
    assert (f["prefill_error_count"], f["prefill_error_sum_s"]) == (2.0, 0.005)


def test_spread_ignores_missing_values():
    assert rf.spread([0.9, None, 0.7, float("nan")]) == {"mean": pytest.approx(0.8), "min": 0.7, "max": 0.9, "n": 2}
    assert rf.spread([None]) == {"mean": None, "min": None, "max": None, "n": 0}


def _rec(load, variant, run, tok, **kw):
    return {"load": load, "variant": variant, "run": run, "token_attainment": tok, "ttft_attainment": tok,
            "rejected": 0, "ttft_p99_ms": 100.0 * run, "prefill_estimate_mae_ms": None, "valid": True, **kw}


def test_aggregate_over_runs_counts_failed_and_invalid_runs():
    recs = [_rec(0.7, "lst_imh", 1, 0.9), _rec(0.7, "lst_imh", 2, 0.8, valid=False),
            {"load": 0.7, "variant": "lst_imh", "run": 3, "error": "RuntimeError: no daemon"},
            _rec(0.7, "round_robin", 1, 0.5), _rec(1.5, "lst_imh", 1, 0.4)]
    agg = rf.aggregate(recs, [0.7, 1.5], ["lst_imh", "round_robin"])
    e = agg["0.7"]["lst_imh"]
    assert (e["runs"], e["failed_runs"], e["invalid_runs"]) == (2, 1, 1)
    assert e["token_attainment"] == {"mean": pytest.approx(0.85), "min": 0.8, "max": 0.9, "n": 2}
    assert e["ttft_p99_ms"]["max"] == 200.0 and e["prefill_estimate_mae_ms"]["mean"] is None
    assert agg["1.5"]["round_robin"]["runs"] == 0 and agg["1.5"]["round_robin"]["token_attainment"]["n"] == 0


def _s(*xs):
    return rf.spread(list(xs))


def test_compare_levels():
    assert rf.compare(_s(0.9, 0.95), _s(0.8, 0.9)) == "beyond_spread"  # worst >= best
    assert rf.compare(_s(0.8, 0.99), _s(0.85, 0.9)) == "mean_above"
    assert rf.compare(_s(1.0, 1.0), _s(1.0, 1.0)) == "tie"
    assert rf.compare(_s(0.8, 0.9), _s(0.9, 0.8)) == "tie"
    assert rf.compare(_s(0.7, 0.8), _s(0.8, 0.9)) == "not_better"
    assert rf.compare(_s(), _s(0.5)) is None


def test_verdict_is_the_weakest_against_every_other_variant():
    per = {"lst_imh": {"token_attainment": _s(0.9, 0.92)}, "round_robin": {"token_attainment": _s(0.7, 0.8)},
           "least_load": {"token_attainment": _s(0.85, 0.95)}}
    v = rf.verdicts(per, {"lst_imh": "lst_imh", "round_robin": "round_robin", "least_load": "least_load"})
    assert v == {"lst_imh": {"metric": "token_attainment", "overall": "mean_above", "missing": [],
                             "vs": {"round_robin": "beyond_spread", "least_load": "mean_above"}}}
    per["least_load"]["token_attainment"] = _s()  # e.g. every run of it failed
    v = rf.verdicts(per, {"lst_imh": "lst_imh", "round_robin": "round_robin", "least_load": "least_load"})
    assert v["lst_imh"]["overall"] == "beyond_spread" and v["lst_imh"]["missing"] == ["least_load"]
    per["round_robin"]["token_attainment"] = _s()
    v = rf.verdicts(per, {"lst_imh": "lst_imh", "round_robin": "round_robin", "least_load": "least_load"})
    assert v["lst_imh"]["overall"] is None
    assert rf.verdicts(per, {"round_robin": "round_robin"}) == {}


def test_daemon_config_parses_and_writes_plan_only_when_asked(tmp_path: Path):
    common: dict[str, Any] = dict(run_dir=tmp_path, cache=str(tmp_path / "cache"), checkpoint="demo:llama-small",
                                  ttft_slo_ms=500.0, tpot_slo_ms=50.0, memory_mib=1024, kv_cache_mib=256)
    text = rs.daemon_config(policy="round_robin", plan=None, **common)
    assert "plan" not in text
    cfg = parse_config(text)
    assert cfg.dispatch.policy == "round_robin" and cfg.devices.count == 2
    m = cfg.model(rs.MODEL_NAME)
    assert (m.devices, m.ttft_slo_ms, m.tpot_slo_ms, m.checkpoint) == ([0, 1], 500.0, 50.0, "demo:llama-small")
    text = rs.daemon_config(policy="lst_imh", plan="window", **common)
    assert 'plan = "window"' in text.split("[dispatch]")[1].split("[[models]]")[0]
    if "plan" in DispatchConfig.__struct_fields__:  # the daemon knows the key
        assert parse_config(text).dispatch.plan == "window"
    text = rs.daemon_config(policy="lst_imh", plan=None, objective="tokens", **common)
    assert "plan" not in text and parse_config(text).dispatch.objective == "tokens"
    assert "objective" not in rs.daemon_config(policy="lst_imh", plan=None, **common)
    # a peer baseline: no deadline anywhere, and the daemon takes it
    d = parse_config(rs.daemon_config(policy="least_load", plan=None, baseline="peer", **common)).dispatch
    assert (d.requeue, d.admission, d.decode_guard) == ("keep", "queue", False)
    d = parse_config(rs.daemon_config(policy="least_load", plan=None, **common)).dispatch
    assert (d.requeue, d.admission, d.decode_guard) == ("reject", "reject_early", True)


def test_warmup_lengths_span_the_mix():
    pairs = [(n, 5) for n in range(1, 101)]
    w = rs.warmup_lengths(pairs, 4)
    assert [x[0] for x in w] == [13, 38, 63, 88] and all(x[1] == 2 for x in w)
    assert rs.warmup_lengths(pairs, 0) == [] and rs.warmup_lengths([], 3) == []


def test_rounded_keeps_structure():
    out = rf.rounded({"a": [0.123456789, 2, None], "b": {"c": 1.0 / 3}})
    assert out == {"a": [0.1235, 2, None], "b": {"c": 0.3333}}


def test_the_mixed_trace_has_every_class_with_its_slo_overlapping_bursts_and_the_asked_rate():
    """The mixed scenario (issue 36): three models, each row carrying its own class's SLO and
    length mix, the mean rate as asked, bursts of every class in the same seconds, and one
    trace per seed (every policy and run replays the same one)."""
    t = rt.make_mixed_trace(6.0, 60.0, rs.MIXED, seed=3)
    assert t.models == ("chat", "batch", "rag")
    n = len(t)
    assert 6.0 * 60.0 * 0.85 < n < 6.0 * 60.0 * 1.15
    mid = np.asarray(t.model_id)
    for k, c in enumerate(rs.MIXED):
        rows = mid == k
        assert abs(rows.sum() / n - c.share) < 0.08, c.name
        assert set(np.asarray(t.ttft_slo_ms)[rows]) == {c.ttft_slo_ms}
        assert np.asarray(t.input_tokens)[rows].max() <= c.input_cap
    rag, chat = np.asarray(t.input_tokens)[mid == 2], np.asarray(t.input_tokens)[mid == 0]
    assert rag.mean() > 4 * chat.mean()  # the long-prompt class is long
    # bursts overlap: the busiest 3 s of chat and of rag are within 4 s of each other
    a = np.asarray(t.arrival_s)
    peak = [np.argmax(np.bincount((a[mid == k] // 3.0).astype(np.int64), minlength=20)) for k in (0, 2)]
    assert abs(int(peak[0]) - int(peak[1])) <= 1
    assert (rt.peak_to_mean(a) or 0) > 1.5
    again = rt.make_mixed_trace(6.0, 60.0, rs.MIXED, seed=3)
    assert np.array_equal(np.asarray(again.arrival_s), a)
    assert not np.array_equal(np.asarray(rt.make_mixed_trace(6.0, 60.0, rs.MIXED, seed=4).arrival_s), a)


def test_the_mixed_daemon_config_serves_each_class_on_both_devices_with_its_slo():
    served = rs.scenario_models("mixed", 500.0, 50.0)
    assert served == [("chat", 300.0, 50.0), ("batch", 2000.0, 100.0), ("rag", 1000.0, 50.0)]
    assert rs.scenario_models("one", 500.0, 50.0) == [(rs.MODEL_NAME, 500.0, 50.0)]
    cfg = parse_config(rs.daemon_config(run_dir=Path("/tmp/x"), cache="/tmp/c", checkpoint="demo:llama-small",
                                        policy="lst_imh", plan=None, ttft_slo_ms=500.0, tpot_slo_ms=50.0,
                                        memory_mib=1024, kv_cache_mib=256, models=served))
    assert [(m.name, m.devices, m.ttft_slo_ms) for m in cfg.models] == [
        ("chat", [0, 1], 300.0), ("batch", [0, 1], 2000.0), ("rag", [0, 1], 1000.0)]

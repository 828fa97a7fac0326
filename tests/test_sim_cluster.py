"""The simulator's event loop: conservation, determinism, exact accounting, results files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sim_fixtures import poisson_trace

from janusd.config import DispatchConfig
from janusd.core.serving import ServingCore
from janusd.hw import device_spec
from janusd.sim.cluster import Cluster
from janusd.sim.served import served_models
from janusd.sim.perfmodel import PerfModel
from janusd.sim.run import simulate, write_run
from janusd.sim.specs import resolve
from janusd.trace import slo
from janusd.trace.formats import Trace
from janusd.trace.results import read_results

PM = PerfModel(device_spec("ascend-910c-die"))
APPS = {"chat": "qwen3-8b", "code": "llama3-8b", "mini": "qwen3-1.7b"}


def run(trace: Trace, devices: int, policy: str = "static", keep_times: bool = False, perf: PerfModel = PM):
    return simulate(trace, resolve(trace.models), devices, policy, keep_times=keep_times, perf=perf)


def test_every_request_ends_exactly_once_under_overload():
    tr = poisson_trace(4000, 20.0, APPS, seed=1)  # ~200 req/s on 3 devices: far over capacity
    cluster, s = run(tr, 3)
    counts = s["outcomes"]
    assert sum(counts.values()) == len(tr.arrival_s)
    assert counts.get("ok", 0) > 0 and counts.get("rejected", 0) > 0
    assert not cluster.core.requests.by_id and not cluster.core.held
    cluster.core.check_integrity()
    res = cluster.outcome()
    assert int(res.ok.sum()) == counts["ok"]
    assert sum(st == "ok" for st in res.status) == counts["ok"]
    assert all(w.in_flight == 0 for w in cluster.workers.values())
    assert (res.on_time <= res.total).all()


def test_same_trace_same_results():
    tr = poisson_trace(1500, 10.0, APPS, seed=2)
    a, sa = run(tr, 4)
    b, sb = run(tr, 4)
    for k in ("on_time", "total", "ttft_met", "tpot_met", "ok"):
        assert np.array_equal(getattr(a.outcome(), k), getattr(b.outcome(), k))
    sa.pop("wall_s"), sb.pop("wall_s"), sa.pop("sim_requests_per_wall_s"), sb.pop("sim_requests_per_wall_s")
    assert sa == sb


def test_closed_form_accounting_equals_the_slo_rules_on_token_times():
    # overloaded, so requests live through many segments (the numpy path too)
    tr = poisson_trace(2500, 10.0, APPS, seed=3)
    kept, _ = run(tr, 3, keep_times=True)
    fast, _ = run(tr, 3)
    ko, fo = kept.outcome(), fast.outcome()
    assert np.array_equal(ko.on_time, fo.on_time) and np.array_equal(ko.tpot_met, fo.tpot_met)
    assert len(ko.token_times) == int(ko.ok.sum()) > 100
    for i, times in ko.token_times.items():
        assert len(times) == tr.output_tokens[i]
        assert all(x <= y for x, y in zip(times, times[1:]))
        a = slo.request_attainment(times, int(tr.output_tokens[i]), kept._slo_ms(i, True) / 1000,
                                   kept._slo_ms(i, False) / 1000)
        assert (a.on_time_tokens, a.ttft_met, a.tpot_met, a.e2e_met) == (
            ko.on_time[i], ko.ttft_met[i], ko.tpot_met[i], ko.e2e_met[i])


def test_one_request_takes_the_roofline_times():
    m = resolve(["llama3-8b"])["llama3-8b"]
    tr = Trace.build(np.array([1.0]), ["a"], ["llama3-8b"], np.array([1000]), np.array([5]))
    cluster, s = run(tr, 1, keep_times=True)
    times = cluster.outcome().token_times[0]
    pf = PM.prefill_s(m, 1000)
    assert times[0] == pytest.approx(pf)
    # decode steps of one sequence at contexts 1001.. 1004 (context as the step starts)
    expect = [pf]
    for k in range(1, 5):
        expect.append(expect[-1] + PM.decode_step_s(m, 1, 1000 + k))
    assert times == pytest.approx(expect, rel=1e-3)
    assert s["token_attainment"] == 1.0 and s["device_hours"] == pytest.approx(times[-1] / 3600 + 1 / 3600)


def test_kv_limit_queues_then_fails_what_can_never_fit():
    m = resolve(["qwen3-8b"])["qwen3-8b"]
    small = PerfModel(device_spec("ascend-910c-die", hbm_bytes=m.weight_bytes / 0.9 + 3e9))  # ~20 k KV tokens
    cap = small.kv_capacity_tokens(m, [m])
    assert 10_000 < cap < 30_000
    n = 4
    # each request holds a third of the KV: at most 3 at a time; the last can never fit
    tr = Trace.build(np.array([0.0, 0.0, 0.0, 0.0, 0.0]), ["a"] * 5, ["qwen3-8b"] * 5,
                     np.array([cap // 3 - 50] * n + [cap + 10]), np.array([40] * n + [1]),
                     np.full(5, 1e6), np.full(5, 1e3))  # SLOs nobody misses: no rejection
    cluster, s = run(tr, 1, keep_times=True, perf=small)
    assert s["outcomes"].get("ok") == 4 and s["outcomes"].get("failed") == 1
    t = cluster.outcome().token_times
    firsts = sorted(t[i][0] for i in range(4))
    lasts = sorted(t[i][-1] for i in range(4))
    assert firsts[3] > lasts[0]  # the fourth waited for KV freed by an earlier one


def test_run_directory_reads_back_with_the_report_code(tmp_path):
    tr = poisson_trace(600, 10.0, APPS, seed=4)
    cluster, s = run(tr, 3, keep_times=True)
    write_run(cluster, tmp_path, s)
    res = read_results(tmp_path / "results.jsonl")
    again = slo.summarize(res.outcomes(), res.app_id, len(res.apps), float(tr.arrival_s[-1] - tr.arrival_s[0]))
    assert again["token_attainment"] == pytest.approx(s["token_attainment"])
    assert again["tpot_attainment"] == pytest.approx(s["tpot_attainment"])
    assert again["app_worst_token_attainment"] == pytest.approx(s["worst_app_attainment"])
    assert json.loads((tmp_path / "summary.json").read_text())["requests"] == 600
    assert (tmp_path / "devices.csv").read_text().splitlines()[0] == "t_s,active_devices,active_instances"


def test_it_is_the_daemons_core_and_dispatcher():
    from janusd._native import Dispatcher

    tr = poisson_trace(10, 1.0, APPS)
    served, idx = served_models(tr, resolve(tr.models))
    c = Cluster(tr, served, idx, PM, 3, DispatchConfig())
    assert type(c.core) is ServingCore
    assert type(c.core.dispatch.dispatcher) is Dispatcher


def test_a_request_waiting_for_kv_past_the_engines_bound_fails():
    m = resolve(["qwen3-8b"])["qwen3-8b"]
    small = PerfModel(device_spec("ascend-910c-die", hbm_bytes=m.weight_bytes / 0.9 + 3e9))
    cap = small.kv_capacity_tokens(m, [m])
    # the first holds all but 100 KV tokens for ~2000 decode steps (> 30 s); the second needs 1010
    tr = Trace.build(np.array([0.0, 0.1]), ["a", "a"], ["qwen3-8b"] * 2, np.array([cap - 2100, 1000]),
                     np.array([2000, 10]), np.full(2, 1e6), np.full(2, 1e3))
    cluster, s = run(tr, 1, keep_times=True, perf=small)
    assert s["outcomes"] == {"ok": 1, "failed": 1}
    assert cluster.outcome().token_times[0][-1] > 30.0
    assert cluster.outcome().status[1] == "error"


def test_co_located_models_draw_on_one_kv_pool():
    # xTensor (PAPER.md §7): the models on a device share one page pool. Two 8B models on
    # one device; only "a" is busy: three requests of a quarter of the pool each run at
    # once (an even split would have left "a" half the pool: two at a time)
    from janusd.sim.worker import SimWorker
    from janusd.wire import worker_msgs as wm

    m = resolve(["qwen3-8b"])["qwen3-8b"]
    small = PerfModel(device_spec("ascend-910c-die", hbm_bytes=2 * m.weight_bytes / 0.9 + 3e9))
    pool = small.kv_capacity_tokens(m, [m, m])
    assert 10_000 < pool < small.kv_capacity_tokens(m, [m])
    clock = [0.0]
    w = SimWorker(0, small, lambda dev, t: None, lambda: clock[0], lambda rid: (0.0, 1e3, 1e3))
    w.set_residents({"a": m, "b": m})
    for rid in (1, 2, 3, 4):
        w.send(wm.Generate(rid, "a", [1] * 100, wm.SamplingSpec(max_tokens=pool // 4 - 140, ignore_eos=True)))
    w.on_event(0.0)
    assert sorted(w._seqs) == [1, 2, 3, 4] and not w.failed
    assert 0 < w.kv_pool - w.kv_used < small.kv_token_bytes(m) * 200
    clock[0] = 0.01
    w.send(wm.Generate(5, "b", [1] * 100, wm.SamplingSpec(max_tokens=200, ignore_eos=True)))
    clock[0] = w.event_at
    w.on_event(w.event_at)  # the pool is full: "b" waits for "a"'s pages
    assert 5 not in w._seqs and [s.rid for s in w.residents["b"].waiting] == [5]
    # a later request of "a" that would fit in what is left waits behind "b"'s (pages go
    # to the longest waiter first: a busy neighbour cannot starve a quiet model)
    w.send(wm.Generate(6, "a", [1] * 20, wm.SamplingSpec(max_tokens=20, ignore_eos=True)))
    clock[0] = w.event_at
    w.on_event(w.event_at)
    assert 6 not in w._seqs and 5 not in w._seqs


def test_peer_routers_serve_late_never_refuse():
    # rr and least-load as peers' routers (no deadlines): under overload nothing is
    # rejected, everything is served (late); LST-IMH with the daemon's machinery refuses
    tr = poisson_trace(1500, 10.0, APPS, seed=5, max_in=1000, max_out=100)
    outs = {p: run(tr, 3, p)[1]["outcomes"] for p in ("rr", "least-load", "lst-imh-reject")}
    for p in ("rr", "least-load"):
        assert outs[p] == {"ok": 1500}, (p, outs[p])
    assert outs["lst-imh-reject"].get("rejected", 0) > 0

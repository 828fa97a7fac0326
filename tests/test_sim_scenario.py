"""`janus sim --scenario` (bench/replay_sim.py): the dispatch-replay scenarios on the
simulator, built from the real bench's own definitions (issue 36)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from janusd.bench import replay_setup
from janusd.bench.dispatch_replay import _traces
from janusd.bench.dispatch_replay import add_arguments as bench_arguments
from janusd.bench.replay_sim import add_arguments as sim_arguments
from janusd.bench.replay_sim import real_runs, scenario_config, served_trace, sim_capacity, sim_run
from janusd.bench.replay_trace import scenario_trace, synth_kw

FLAGS = ["--scenario", "mixed", "--seed", "5", "--duration-s", "6", "--capacity-s", "6", "--capacity-warmup-s", "2",
         "--capacity-concurrency", "8", "--loads", "1.5"]


def _args(add, flags):
    p = argparse.ArgumentParser(prog="x")
    add(p)
    return p.parse_args(flags)


def test_the_sim_and_the_bench_share_the_scenario_flags_and_defaults():
    bench, sim = _args(bench_arguments, FLAGS), _args(sim_arguments, FLAGS)
    shared = set(vars(sim)) - {"bench_json"}
    assert shared <= set(vars(bench))
    assert {k: getattr(sim, k) for k in shared} == {k: getattr(bench, k) for k in shared}
    # the simulator's --scenario defaults to None (it replays --trace unless one is named)
    assert _args(sim_arguments, []).scenario is None and _args(bench_arguments, []).scenario == "one"


def _sim_served(cluster):
    return {n: (m.cfg.ttft_slo_ms, m.cfg.tpot_slo_ms, list(m.cfg.devices)) for n, m in cluster.core.models().items()}


def test_a_changed_class_moves_the_bench_trace_and_the_simulated_daemon_alike(tmp_path: Path, monkeypatch):
    """One owner: replay_setup.MIXED changed, the real bench's trace and config and the
    simulator's served models all follow (nothing holds a copy of the classes)."""
    from janusd.bench import replay_sim

    seen = {}
    real_cluster = replay_sim._cluster

    def spy(trace, cfg, perf):
        c = real_cluster(trace, cfg, perf)
        seen["served"], seen["dispatch"], seen["n"] = _sim_served(c), cfg.dispatch, len(trace)
        return c

    monkeypatch.setattr(replay_sim, "_cluster", spy)
    tight = tuple(replay_setup.MixedClass(c.name, c.ttft_slo_ms / 2, c.tpot_slo_ms, c.share, c.input_mean,
                                          c.input_sigma, c.input_cap, c.output_mean, c.output_sigma, c.output_cap)
                  for c in replay_setup.MIXED)
    for classes in (replay_setup.MIXED, tight):
        monkeypatch.setattr(replay_setup, "MIXED", classes)
        args = _args(bench_arguments, FLAGS)
        traces, _ = _traces(args, [1.5], 4.0, tmp_path, synth_kw(args))
        bench_trace = traces[1.5]
        sim_trace = scenario_trace("mixed", 1.5 * 4.0, 6.0, ttft_slo_ms=0, tpot_slo_ms=0, synth=synth_kw(args))
        for col in ("arrival_s", "input_tokens", "output_tokens", "ttft_slo_ms", "tpot_slo_ms"):
            assert np.array_equal(getattr(bench_trace, col), getattr(sim_trace, col))
        perf = replay_sim.calibrated_perf(replay_sim._archs(["chat"])["chat"])
        fig = sim_run(args, bench_trace, {"policy": "round_robin", "baseline": "peer"}, perf, tmp_path)
        assert seen["n"] == len(bench_trace) == fig["requests"]
        assert seen["served"] == {c.name: (c.ttft_slo_ms, c.tpot_slo_ms, [0, 1]) for c in classes}
        # the peer kind's keys are the daemon's (replay_setup.PEER_DISPATCH), read from its TOML
        d = seen["dispatch"]
        assert (d.policy, d.requeue, d.admission, d.decode_guard) == ("round_robin", "keep", "queue", False)
    assert seen["served"]["chat"][0] == 150.0  # 300 ms halved: the simulated daemon followed


def test_the_one_model_scenario_serves_one_model_as_the_daemon_does(tmp_path: Path):
    args = _args(sim_arguments, ["--scenario", "one", "--seed", "3", "--duration-s", "8"])
    t = scenario_trace("one", 6.0, 8.0, ttft_slo_ms=500, tpot_slo_ms=50, synth=synth_kw(args))
    assert len(t.apps) > 1  # the synthesized apps ...
    served = served_trace("one", t)
    assert served.apps == served.models == (replay_setup.MODEL_NAME,)  # ... fold into the one model
    cfg = scenario_config("one", tmp_path, {"policy": "lst_imh"}, 500.0, 50.0)
    assert [(m.name, m.ttft_slo_ms, m.devices) for m in cfg.models] == [("llm", 500.0, [0, 1])]


def test_the_simulated_capacity_is_a_closed_loop(tmp_path: Path):
    """Completions per second of C clients: more clients finish more per second until the
    devices are full, and one client's rate is one request's service time's inverse."""
    from janusd.bench import replay_sim

    caps = {}
    for c in (1, 16):
        args = _args(sim_arguments, ["--scenario", "mixed", "--seed", "5", "--capacity-s", "8",
                                     "--capacity-warmup-s", "2", "--capacity-concurrency", str(c)])
        perf = replay_sim.calibrated_perf(replay_sim._archs(["chat"])["chat"])
        caps[c] = sim_capacity(args, perf, tmp_path)["capacity_rps"]
    assert 0 < caps[1] < caps[16] < 16 * caps[1]


def test_the_real_runs_are_read_beside_by_load_and_variant():
    real = {"per_run": [{"load": 1.5, "variant": "lst_imh", "run": 1, "token_attainment": 0.5},
                        {"load": 1.5, "variant": "lst_imh", "run": 2, "token_attainment": 0.7},
                        {"load": 0.7, "variant": "lst_imh", "run": 1, "token_attainment": 1.0},
                        {"load": 1.5, "variant": "lst_imh", "run": 3, "error": "x"}]}
    assert real_runs(real, "1.5", "lst_imh") == [0.5, 0.7]
    assert real_runs(None, "1.5", "lst_imh") == []


def test_janus_sim_scenario_needs_a_known_scenario_and_says_what_is_missing(capsys):
    from janusd.cli import main

    assert main(["sim"]) == 2
    assert "--trace, --devices, --policy required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sim", "--scenario", "nope"])
    bad = Path(__file__)
    assert main(["sim", "--scenario", "mixed", "--bench-json", str(bad)]) == 2

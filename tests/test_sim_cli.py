"""`janus sim`: the summary JSON last, one-line errors for bad input, a run directory."""

from __future__ import annotations

import json
import subprocess
import sys

from sim_fixtures import poisson_trace

from janusd.trace.formats import write_trace

KEYS = {"policy", "requests", "token_attainment", "ttft_attainment", "tpot_attainment", "goodput_rps",
        "device_hours", "mean_app_attainment", "worst_app_attainment", "wall_s"}


def janus(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "janusd.cli", "sim", *argv], capture_output=True, text=True,
                          timeout=120)


def test_summary_last_and_run_directory(tmp_path):
    t = tmp_path / "t.csv"
    write_trace(poisson_trace(200, 5.0, {"a": "qwen3-8b", "b": "qwen3-1.7b"}), t)
    p = janus("--trace", str(t), "--devices", "4", "--policy", "lst-imh-relax", "--out", str(tmp_path / "run"))
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout.strip().splitlines()[-1])
    assert KEYS <= set(s) and s["policy"] == "lst-imh-relax" and s["requests"] == 200
    assert 0.0 <= s["token_attainment"] <= 1.0
    assert sum(1 for _ in open(tmp_path / "run" / "results.jsonl")) == 200
    r = subprocess.run([sys.executable, "-m", "janusd.cli", "report", str(tmp_path / "run"), "--out",
                        str(tmp_path / "rep")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_bad_input_is_one_clear_line(tmp_path):
    t = tmp_path / "t.csv"
    write_trace(poisson_trace(20, 1.0, {"a": "gpt-9", "b": "qwen3-1.7b"}), t)
    p = janus("--trace", str(t), "--devices", "4", "--policy", "static")
    assert p.returncode == 2 and "unknown model 'gpt-9'" in p.stderr and "qwen3-32b" in p.stderr
    assert "Traceback" not in p.stderr
    write_trace(poisson_trace(20, 1.0, {"a": "qwen3-8b", "b": "qwen3-1.7b"}), t)
    p = janus("--trace", str(t), "--devices", "1", "--policy", "static")
    assert p.returncode == 2 and "cannot hold one instance" in p.stderr
    p = janus("--trace", str(tmp_path / "none.csv"), "--devices", "1", "--policy", "static")
    assert p.returncode == 2 and "none.csv" in p.stderr and "Traceback" not in p.stderr
    (tmp_path / "m.toml").write_text("[a]\npreset = 3\n")
    p = janus("--trace", str(t), "--devices", "4", "--policy", "static", "--models", str(tmp_path / "m.toml"))
    assert p.returncode == 2 and "unknown preset" in p.stderr


def test_bad_perf_or_calibration_input_is_one_clear_line(tmp_path):
    t = tmp_path / "t.csv"
    write_trace(poisson_trace(20, 1.0, {"a": "qwen3-8b"}), t)
    base = ("--trace", str(t), "--devices", "2", "--policy", "static")
    (tmp_path / "p.json").write_text('{"overhead": 1}')
    (tmp_path / "api.json").write_text('{"bench": "api"}\n')
    (tmp_path / "list.json").write_text('wall_s: 7.9\n[1]\n')
    for extra, needle in ((("--perf", str(tmp_path / "none.json")), "none.json"),
                          (("--perf", str(tmp_path / "p.json")), "unknown key(s) overhead"),
                          (("--calibrate", str(tmp_path / "api.json")), "not a `janus bench engine` result"),
                          (("--calibrate", str(tmp_path / "list.json")), "not a `janus bench engine` result"),
                          (("--calibrate-tpot-ms", "0"), "TPOT p50 must be > 0"),
                          (("--device-memory-mib", "0"), "--device-memory-mib must be >= 1")):
        p = janus(*base, *extra)
        assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr, (extra, p.stderr)
    write_trace(poisson_trace(20, 1.0, {"a": "qwen3-8b", "b": "qwen3-1.7b"}), t)
    p = janus(*base, "--calibrate", str(tmp_path / "api.json"))
    assert p.returncode == 2 and "fits one model" in p.stderr

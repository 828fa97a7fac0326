"""`janus report`: figures and the headline table from run directories."""

import argparse
import json

import msgspec
import pytest

from janusd import report_cli
from janusd.trace.report import FIGURES, pick_window
from janusd.trace.results import RequestResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(d, late_from=None, fail_app=None, devices=None, valid=True, n=120):
    """n requests 1 s apart, 4 tokens each, apps a0..a3; tokens late after `late_from` s."""
    d.mkdir(parents=True)
    enc = msgspec.json.Encoder()
    with open(d / "results.jsonl", "wb") as f:
        for i in range(n):
            app = f"a{i % 4}"
            late = late_from is not None and i >= late_from
            times = [0.1, 0.2, 0.3, 0.4] if not late else [2.0, 2.1, 2.2, 2.3]
            failed = app == fail_app
            r = RequestResult(index=i, arrival_s=float(i), app=app, model="m", input_tokens=10, output_tokens=4,
                              ttft_slo_ms=1000.0, tpot_slo_ms=200.0, send_lag_ms=1.0,
                              token_times_s=[] if failed else times, status="error" if failed else "ok")  # fmt: skip
            f.write(enc.encode(r) + b"\n")
    (d / "summary.json").write_text(json.dumps({"valid": valid}))
    if devices:
        (d / "devices.csv").write_text("t_s,active_devices\n" + "".join(f"{t},{k}\n" for t, k in devices))


def _cli(*argv):
    p = argparse.ArgumentParser()
    report_cli.add_arguments(p)
    return report_cli.run(p.parse_args(list(argv)))


def test_report_overlays_runs_and_tabulates(tmp_path, capsys):
    _write_run(tmp_path / "janus", devices=[(0, 4), (60, 6), (100, 5)])
    _write_run(tmp_path / "static", late_from=60, fail_app="a3", valid=False)
    assert _cli(str(tmp_path / "janus"), str(tmp_path / "static"), "--out", str(tmp_path / "rep")) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for name in FIGURES:
        data = (tmp_path / "rep" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    rows = {r["run"]: r for r in out["rows"]}
    assert rows["janus"]["token_attainment"] == 1.0 and rows["janus"]["goodput_rps"] == pytest.approx(120 / 119)
    # static: a3 (30 requests) failed; of the other 90, those at i >= 60 (45) are entirely late
    s = rows["static"]
    assert s["token_attainment"] == pytest.approx(45 * 4 / (120 * 4))
    assert s["e2e_attainment"] == pytest.approx(45 / 120)
    assert s["app_worst_token_attainment"] == 0.0
    assert s["ttft_attainment"] == pytest.approx(45 / 120)
    table = (tmp_path / "rep" / "summary.md").read_text()
    assert "| janus | yes | 120 | 1.000 | 1.000 | 1.000 | 1.000 | 1.008 | 1.000 | 1.000 |" in table
    assert "| static | NO | 120 | 0.375 |" in table
    assert "static: the replayer fell behind schedule" in table
    assert "Active devices" not in table  # janus has devices.csv, so the panel is drawn


def test_report_without_devices_notes_the_omission(tmp_path, capsys):
    _write_run(tmp_path / "only")
    assert _cli(str(tmp_path / "only"), "--out", str(tmp_path / "rep"), "--window-s", "30") == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["window_s"] == 30
    assert "no run has devices.csv, so that panel is omitted" in (tmp_path / "rep" / "summary.md").read_text()


def test_report_errors(tmp_path, capsys):
    assert _cli(str(tmp_path / "nothing"), "--out", str(tmp_path / "rep")) == 2
    assert "no results.jsonl" in capsys.readouterr().err
    d = tmp_path / "bad"
    d.mkdir()
    (d / "results.jsonl").write_text('{"index": 0}\n')
    assert _cli(str(d), "--out", str(tmp_path / "rep")) == 2
    assert "results.jsonl:1: Object missing required field" in capsys.readouterr().err


def test_pick_window():
    assert pick_window(1800) == 50.0 and pick_window(30) == 1.0 and pick_window(600) == 10.0 and pick_window(86400) == 2000.0
    assert pick_window(90, requests=78) == 20.0 and pick_window(1800, requests=600_000) == 50.0


def test_read_devices_takes_the_replayers_columns_and_names_a_bad_line(tmp_path):
    from janusd.trace.formats import TraceError
    from janusd.trace.results import read_devices

    p = tmp_path / "devices.csv"
    p.write_text("t_s,active_devices,active_instances\n0.0,1,2\n1.5,3,4\n")
    t, d = read_devices(p)
    assert t.tolist() == [0.0, 1.5] and d.tolist() == [1.0, 3.0]
    p.write_text("t_s,active_devices,active_instances\n0.0,1,2\n1.0,2\n")
    with pytest.raises(TraceError, match=r"devices.csv:3: expected 3 fields, got 2"):
        read_devices(p)
    p.write_text("t_s,active_devices,active_instances\n0.0,1,x\n")
    with pytest.raises(TraceError, match=r"devices.csv:2: expected 3 numbers"):
        read_devices(p)
    p.write_text("time,devices\n0,1\n")
    with pytest.raises(TraceError, match=r"devices.csv:1: expected the header t_s,active_devices\[,active_instances\]"):
        read_devices(p)
    assert read_devices(tmp_path / "absent.csv") is None

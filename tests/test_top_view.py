"""The operator's view without a terminal or a daemon ([V]): `janus top`'s screen rendered
from admin replies to fixed-size consoles (80x24, 160x48, cut lists, disconnected), the
`ctl` tables at 80 columns, the decisions ring, the last minute's latency figures, and
the reasons the control room's rules give with their figures."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from janusd import ctl_tables
from janusd.control.keepalive import keepalive_ops
from janusd.control.ops import Activate, Reassign, Rest
from janusd.control.snapshot import InstanceView, ModelView
from janusd.control.steady import SteadyPlanner
from janusd.control.wake import wake_op
from janusd.lifecycle.states import InstanceState
from janusd.policy.policy_config import DemandConfig, PlacementConfig
from janusd.policy.snapshot import DeviceLoad, Move, PlacementPlan, ResidencyDecision
from janusd.server.decisions import DecisionLog
from janusd.telemetry import Telemetry
from janusd.telemetry.latency import LatencyWindow, percentile
from janusd.top_view import Frame, _bar, _lat, lines, text

S = InstanceState
T0 = 1_700_000_000.0


def _event(seq: int, model: str, kind: str, target: str, reason: str, outcome: str = "ok", device: int = 0,
           source: int | None = None, seconds: float | None = 0.02) -> dict:
    return {"seq": seq, "at": T0 + seq, "model": model, "kind": kind, "rule": "other", "device": device,
            "target": target, "source": source, "role": None, "then": None, "reason": reason, "outcome": outcome,
            "seconds": seconds, "version": seq}


def _frame(models: int = 3, devices: int = 2, events: int = 6) -> Frame:
    names = ["chat-assistant", "code-helper", "summarizer"] + [f"tail-model-{k:02d}" for k in range(max(0, models - 3))]
    names = names[:models]
    ms, insts = [], []
    for k, n in enumerate(names):
        ms.append({"name": n, "pool": "elastic" if k == 0 else "steady", "rate_rps": 3.25 * (k + 1), "queued": k,
                   "in_flight": 2 * k, "held": 1 if k == 1 else 0, "ttft_slo_ms": 1000.0, "tpot_slo_ms": 100.0,
                   "ttft_p50_ms": 120.0, "ttft_p99_ms": 1500.0 if k == 0 else 340.0, "tpot_p50_ms": 20.0,
                   "tpot_p99_ms": 45.0, "attainment_1m": 0.912 if k == 0 else 0.998, "active": 1})
        insts.append({"model": n, "device": k % devices, "state": "active" if k != 1 else "warm", "role": "mixed",
                      "error": None})
    insts.append({"model": names[0], "device": 1 % devices, "state": "restoring", "role": "mixed", "error": None})
    pools = [{"device": d, "state": "ready", "num_pages": 128, "weight_pages": 40 + d, "kv_pages": 20,
              "cached_pages": 8, "free_pages": 60 - d} for d in range(devices)]
    evs = [_event(1, "code-helper", "rest", "warm", "keep-alive: warm after idle 312 s >= 300 s", device=0),
           _event(2, "chat-assistant", "activate", "active", "scale out: m*=4 (debounced 4, given 2): demand 3.2 "
                  "instances for 95% attainment", device=1, source=0, seconds=0.74),
           _event(3, "summarizer", "activate", "active", "steady placement: move device 0 -> 1: consolidation "
                  "(Phi gain +0.13; device 1 Phi 0.28 after; plan: 1 device(s), Phi 0.28)", device=1),
           _event(4, "code-helper", "activate", "active", "woken by a request (warm, restore est. 0.31 s)",
                  outcome="running", seconds=None),
           _event(5, "chat-assistant", "rest", "warm", "scale in: m*=1", outcome="WorkerError: device 1 died"),
           _event(6, "summarizer", "rest", "cold", "keep-alive: cold after idle 3601 s >= 3600 s")][:events]
    status = {"state": "running", "pid": 42, "uptime_s": 3723.4, "http": "127.0.0.1:8000", "models": models,
              "in_flight": 7, "workers": [{"device": d, "state": "ready", "pid": 100 + d, "restarts": 0}
                                          for d in range(devices)]}
    return Frame(socket="/tmp/janusd/admin.sock", status=status, models=ms, instances=insts, pools=pools, events=evs,
                 at=T0 + 10)


def _check_size(out: str, width: int, height: int) -> list[str]:
    rows = out.rstrip("\n").split("\n")
    assert len(rows) <= height, (len(rows), out)
    assert all(len(r) <= width for r in rows), max(rows, key=len)
    return rows


def test_the_screen_at_80x24_shows_devices_models_and_decisions():
    f = _frame()
    out = text(f, 80, 24)
    rows = _check_size(out, 80, 24)
    assert rows[0].startswith("janusd running") and "up 1h02m" in rows[0] and "in flight 7" in rows[0]
    assert "q quits" in rows[0]
    # devices: the pool as a bar (weights, KV, cached, free) and the instances with their states
    dev0 = next(r for r in rows if r.startswith("  0 "))
    assert "█" in dev0 and "▓" in dev0 and "▒" in dev0 and "·" in dev0 and "53%" in dev0
    assert "chat-assistant active" in dev0
    dev1 = next(r for r in rows if r.startswith("  1 "))
    assert "code-helper warm" in dev1 and "chat-assistant restoring" in dev1
    # models: pool, rate, p50/p99 against the SLOs, attainment, instances by state, held
    chat = next(r for r in rows if r.startswith("chat-assistant"))
    assert "elastic" in chat and "3.25" in chat and "120/1500" in chat and "91.2%" in chat and "1A 1R" in chat
    code = next(r for r in rows if r.startswith("code-helper"))
    assert code.rstrip().endswith("1") and "1W" in code  # one request held
    # decisions: newest first, with their reasons, a failure says so
    dec = rows[rows.index(next(r for r in rows if "DECISIONS" in r)) + 1:]
    assert "summarizer" in dec[0] and "keep-alive: cold after idle 3601 s" in dec[0]
    assert "failed" in dec[1] and "scale in" in dec[1]
    assert "running" in dec[2] and "woken by a request" in dec[2]
    assert any("from 0 -> active" in r and "scale out: m*=4" in r for r in dec)


def test_the_screen_uses_the_room_of_160x48():
    f = _frame()
    rows = _check_size(text(f, 160, 48), 160, 48)
    assert "http 127.0.0.1:8000" in rows[0]
    head = next(r for r in rows if r.startswith("model"))
    for col in ("ttft slo", "tpot slo", "queued", "in flight", "instances"):
        assert col in head
    chat = next(r for r in rows if r.startswith("chat-assistant"))
    assert "1 active 1 restoring" in chat and "1000" in chat
    dev0 = next(r for r in rows if r.startswith("  0 "))
    assert "68/128" in dev0  # pages used of all, with the room for it
    bar80 = next(r for r in text(f, 80, 24).split("\n") if r.startswith("  0 "))
    assert dev0.count("█") > bar80.count("█")  # a wider bar
    # whole reasons fit
    assert any(r.endswith("scale out: m*=4 (debounced 4, given 2): demand 3.2 instances for 95% attainment")
               for r in rows)


def test_a_long_list_is_cut_and_decisions_keep_their_lines():
    f = _frame(models=30, devices=16)
    rows = _check_size(text(f, 80, 24), 80, 24)
    assert len(rows) == 24
    assert any("more models" in r for r in rows) and any("more devices" in r for r in rows)
    i = next(k for k, r in enumerate(rows) if "DECISIONS" in r)
    assert len(rows) - i - 1 >= 3
    # without a height (`--once` piped) every line is there
    full = text(f, 80).rstrip("\n").split("\n")
    assert sum(r.startswith("tail-model-") for r in full) == 27 and not any("more models" in r for r in full)


def test_disconnected_keeps_the_last_round_on_screen():
    f = _frame()
    gone = Frame(socket=f.socket, status=f.status, models=f.models, instances=f.instances, pools=f.pools,
                 events=f.events, at=f.at, error="No such file or directory")
    rows = _check_size(text(gone, 80, 24), 80, 24)
    assert "DISCONNECTED" in rows[0] and "No such file" in rows[0]
    assert any(r.startswith("chat-assistant") for r in rows)
    empty = text(Frame(socket="/x.sock", error="Connection refused"), 80, 24)
    assert "DISCONNECTED" in empty and "no models" in empty


def test_the_bar_shares_its_cells_by_pages():
    p = {"num_pages": 100, "weight_pages": 50, "kv_pages": 20, "cached_pages": 10, "free_pages": 20}
    assert _bar(p, 10).plain == "█████▓▓▒··"
    # pages of other owners (host copies) count with the weights; a small part keeps one cell
    p = {"num_pages": 1000, "weight_pages": 1, "kv_pages": 0, "cached_pages": 0, "free_pages": 900}
    assert _bar(p, 10).plain == "█·········"
    assert len(_bar({"num_pages": 7, "weight_pages": 3, "kv_pages": 2, "cached_pages": 1, "free_pages": 1}, 13)) == 13
    assert "no pool" in _bar({}, 20).plain


def test_latencies_past_their_slo_are_red():
    t = _lat(120.0, 1500.0, 1000.0)
    assert t.plain == "120/1500"
    styles = {t.plain[s.start:s.end]: str(s.style) for s in t.spans}
    assert styles == {"120": "green", "1500": "red"}
    assert _lat(None, None, 1000.0).plain == "-/-"


# ------------------------------------------------------------------ ctl tables
def _render(action: str, data: dict, wide: bool = False, width: int = 80) -> str:
    buf = io.StringIO()
    c = Console(width=width, file=buf, color_system=None)
    for t in ctl_tables.tables_of(action, data, wide):
        c.print(t)
    return buf.getvalue()


INSTANCE = {"instance": 3, "model": "demo-llama", "device": 1, "state": "warm", "role": "mixed", "error": None,
            "load_s": 0.027, "served": 3, "decoding": 0, "prefill_a_ms": 4.296, "prefill_b_us_per_token": 38.89,
            "prefill_samples": 5, "epdt_in_s": None}
MODEL = {"name": "demo-llama", "checkpoint": "demo:llama-tiny", "app": "demo-llama", "devices": [0, 1], "active": 1,
         "ttft_slo_ms": 1000.0, "tpot_slo_ms": 200.0, "queued": 0, "in_flight": 0, "max_model_len": 2048,
         "rate_rps": 0.394, "out_tok_s": 1.2, "in_len_mean": 3.0, "out_len_mean": 4.0, "pool": "steady", "held": 0,
         "ended_1m": 4, "ttft_p50_ms": 10.2, "ttft_p99_ms": 34.9, "tpot_p50_ms": 3.1, "tpot_p99_ms": 10.1,
         "attainment_1m": 1.0}
POOL = {"device": 0, "state": "ready", "models": ["demo-llama", "demo-qwen2"], "running": 0, "engine_requests": 0,
        "num_pages": 128, "free_pages": 100, "weight_pages": 3, "kv_pages": 4, "cached_pages": 5,
        "fragmentation_pct": 0.0}


@pytest.mark.parametrize("action,data,headers", [
    ("instances", {"instances": [INSTANCE] * 3}, ["model", "dev", "state", "role", "served", "error"]),
    ("models", {"models": [MODEL] * 2}, ["name", "pool", "active", "req/s", "held", "ttft99", "tpot99", "attain"]),
    ("pools", {"pools": [POOL] * 2}, ["dev", "state", "models", "pages", "weights", "kv", "cached", "free"]),
])
def test_ctl_tables_fit_80_columns_and_wide_shows_every_column(action, data, headers):
    out = _render(action, data)
    assert max(len(r) for r in out.split("\n")) <= 80
    head = next(r for r in out.split("\n") if r.strip().startswith(headers[0]))
    assert head.split() == headers  # whole headers, none cut
    assert "…" not in out
    wide = _render(action, data, wide=True, width=400)
    for col in data[action][0]:
        assert col in wide
    assert max(len(r) for r in wide.split("\n")) > 80


def test_ctl_events_print_a_line_each_and_the_wide_table():
    evs = _frame().events
    out = _render("events", {"events": evs, "version": 9, "kept": 500, "total": 6})
    assert "the last 6 of 6 decisions; 500 kept" in out
    assert "#2 chat-assistant dev 1 from 0 -> active: ok in 0.74 s - scale out: m*=4" in " ".join(out.split())
    assert max(len(r) for r in out.split("\n")) <= 80
    wide = _render("events", {"events": evs}, wide=True, width=200)
    assert "reason" in wide and "version" in wide


def test_ctl_events_arguments():
    import argparse

    from janusd import ctl_cli
    from janusd.wire import admin_msgs as am

    p = argparse.ArgumentParser()
    ctl_cli.add_arguments(p)
    req = ctl_cli._request(p.parse_args(["events", "--last", "5"]))
    assert isinstance(req, am.EventsReq) and (req.after, req.limit) == (0, 5)
    with pytest.raises(ValueError, match="--follow"):
        ctl_cli._request(p.parse_args(["models", "--follow"]))
    # the README's order, the target after --device: argparse leaves it over, ctl takes it
    args, rest = p.parse_known_args(["state", "m", "--device", "2", "warm"])
    assert rest == ["warm"] and ctl_cli.take_rest(args, rest)
    assert ctl_cli._request(args) == am.StateReq("m", 2, "warm")
    args, rest = p.parse_known_args(["state", "m", "--device", "2", "hot"])
    assert not ctl_cli.take_rest(args, rest)
    args, rest = p.parse_known_args(["status", "--bogus"])
    assert not ctl_cli.take_rest(args, rest)
    # bad counts are refused with the option named, on the command line and on the wire
    with pytest.raises(SystemExit):
        p.parse_args(["events", "--last", "-3"])
    assert ctl_cli._count("0") == 0 and ctl_cli._count("12") == 12
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 0, got -3"):
        ctl_cli._count("-3")
    with pytest.raises(argparse.ArgumentTypeError, match="not a whole number"):
        ctl_cli._count("lots")
    import msgspec

    with pytest.raises(msgspec.ValidationError, match=r">= 0"):
        am.request_decoder().decode(msgspec.msgpack.encode(["EventsReq", -1, 0]))
    assert am.request_decoder().decode(msgspec.msgpack.encode(["EventsReq", 4, 2])) == am.EventsReq(4, 2)


def test_top_arguments_refuse_sizes_below_one(capsys):
    import argparse

    from janusd import top_cli

    p = argparse.ArgumentParser()
    top_cli.add_arguments(p)
    args = p.parse_args(["--once", "--width", "100", "--height", "30"])
    assert (args.width, args.height, args.decisions, args.interval) == (100, 30, 50, 1.0)
    for bad in (["--width", "0"], ["--height", "-2"], ["--decisions", "x"], ["--interval", "0"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)
    assert "--interval: must be > 0" in capsys.readouterr().err


# ------------------------------------------------------------------ the ring
def test_the_decisions_ring_is_bounded_and_followable(caplog):
    counted: list[tuple[str, str]] = []
    clock = iter(range(100, 200))
    ring = DecisionLog(3, lambda kind, rule: counted.append((kind, rule)), wall=lambda: float(next(clock)))
    ops = [Rest(model="a", device=0, reason="keep-alive: warm after idle 5 s >= 5 s", target="warm"),
           Activate(model="b", device=1, reason="scale out: m*=2", source=0),
           Activate(model="c", device=2, reason="steady placement: place on device 2: new", steady=True),
           Reassign(model="d", device=3, reason="reassign: prefill short", role="prefill"),
           Activate(model="e", device=0, reason="woken by a request (cold, restore est. 1.20 s)")]
    recs = [ring.carried(op, 10.0 + k) for k, op in enumerate(ops)]
    assert counted == [("rest", "keepalive"), ("activate", "scale_out"), ("activate", "steady"),
                       ("reassign", "reassign"), ("activate", "wake")]
    view = ring.view()
    assert [e["model"] for e in view["events"]] == ["c", "d", "e"]  # the last 3 kept
    assert view["kept"] == 3 and view["total"] == 5 and all(e["outcome"] == "running" for e in view["events"])
    v = view["version"]
    log = logging.getLogger("janusd")
    propagate, log.propagate = log.propagate, True  # `janus serve`'s setup turns it off
    try:
        with caplog.at_level(logging.INFO, logger="janusd"):
            ring.ended(recs[3], "ok", 14.5)
            ring.ended(recs[2], "WorkerError: gone", 15.0)
    finally:
        log.propagate = propagate
    changed = ring.rows(after=v)
    assert [(e["model"], e["outcome"], e["seconds"]) for e in changed] == [("d", "ok", 1.5),
                                                                           ("c", "WorkerError: gone", 3.0)]
    assert ring.rows(after=ring.version) == []
    assert ring.rows(limit=1)[0]["model"] == "e"
    lines_ = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("decision 4: reassign d on device 3 -> active: ok in 1.50 s (reassign: prefill")
               for m in lines_)
    assert any("decision 3:" in m and "WorkerError: gone" in m for m in lines_)
    assert [r.levelno for r in caplog.records if "decision 3:" in r.getMessage()] == [logging.WARNING]
    with pytest.raises(ValueError):
        DecisionLog(0)


# ------------------------------------------------------------------ latency window
def test_the_last_minute_of_latencies():
    w = LatencyWindow(60.0, max_samples=1000)
    for k in range(100):
        w.add("m", 100.0 + k * 0.1, ttft_s=(k + 1) / 1000, tpot_s=0.01, on_time=9, counted=10)
    w.add("m", 110.0, ttft_s=None, tpot_s=None, on_time=0, counted=5)  # failed before its first token
    f = w.figures("m", 110.0)
    assert f.requests == 101 and f.ttft_p50_s == 0.05 and f.ttft_p99_s == 0.099 and f.tpot_p99_s == 0.01
    assert f.attainment == pytest.approx(900 / 1005)
    assert w.figures("m", 169.95).requests == 1  # the first ones left the window
    empty = w.figures("other", 110.0)
    assert empty.requests == 0 and empty.ttft_p50_s is None and empty.attainment is None
    assert percentile([], 0.5) is None and percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0


# ------------------------------------------------------------------ reasons with figures
def test_keepalive_and_wake_reasons_carry_their_figures():
    inst = InstanceView(device=0, state=S.ACTIVE, role="mixed")
    m = ModelView(name="a", instances={0: inst}, window=Telemetry().model("a", 0.0))
    ops = keepalive_ops([ResidencyDecision(model="a", residency="warm", changed=True, reason="idle 312 s >= 300 s")],
                        {"a": m}, {})
    assert [o.reason for o in ops] == ["keep-alive: warm after idle 312 s >= 300 s"] and ops[0].rule == "keepalive"
    warm = {1: InstanceView(device=1, state=S.WARM, role="mixed"), 2: InstanceView(device=2, state=S.COLD,
                                                                                     role="mixed")}
    op = wake_op("a", warm, False, lambda st: 0.31 if st is S.WARM else 2.5)
    assert op is not None and op.device == 1 and op.reason == "woken by a request (warm, restore est. 0.31 s)"
    assert op.rule == "wake" and op.kind == "activate"


def test_a_steady_move_names_what_it_does_and_the_figures():
    sp = SteadyPlanner(DemandConfig(), PlacementConfig(), 1, lambda op, now: True, lambda m, d: None)
    mv = Move(kind="migrate", key="y", model="y", src=0, dst=3, reason="consolidation: device 0 freed in 1 moves",
              forced=False, bins_freed=1, phi_gain=0.13)
    assert sp._why(mv) == ("steady placement: move device 0 -> 3: consolidation: device 0 freed in 1 moves "
                           "(Phi gain +0.13; 1 device(s) freed)")
    sp.plan = PlacementPlan(assignment=(), moves=(mv,), unplaced=(), devices=(
        DeviceLoad(device=3, load=(0.2, 0.3, 0.1), phi=0.28, keys=("x", "y")),), bins_used=1, phi=0.28, migrations=1)
    assert sp._why(mv).endswith("(Phi gain +0.13; 1 device(s) freed; device 3 Phi 0.28 after; plan: 1 device(s), "
                                "Phi 0.28)")
    rm = Move(kind="remove", key="z", model="z", src=2, dst=None, reason="left the steady pool", forced=True)
    assert sp._why(rm).startswith("steady placement: remove from device 2: left the steady pool")


def test_the_screen_is_the_same_function_of_the_same_replies():
    f = _frame()
    assert text(f, 80, 24) == text(f, 80, 24)
    assert [t.plain for t in lines(f, 100, 30)] == [t.plain for t in lines(f, 100, 30)]


def test_janus_top_starts_without_the_heavy_imports():
    """Startup under a second: `janus top` imports its own module, rich and the admin
    wire, not the engine, the simulator or numpy (cli.py builds only the named command)."""
    import subprocess
    import sys

    code = ("import sys; from janusd.cli import build_parser; build_parser('top'); "
            "import janusd.top_cli, janusd.top_view, janusd.wire.admin_msgs, janusd.wire.framing; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'torch', 'aiohttp', 'sklearn') "
            "or m.startswith(('janusd.sim', 'janusd.server', 'janusd.engine'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr

"""The operator's view against a real managed daemon ([V]): `janus top --once` shows the
running models, `janus ctl events --json` lists a burst's Ops with their reasons and
figures, every metric etc/grafana/janusd.json queries exists on /metrics, and `janus
top` in a pseudo-terminal (tmux, at 80x24 and 160x48) shows device pages, a model's
state change after `ctl state ... warm`, decision lines after the daemon's Ops, quits on
q, and survives its daemon restarting.

One daemon for the module: two cpu devices; "hot" (elastic, devices 0 and 1, Warm on 1)
with SLOs so tight that the roofline prior asks for both devices once it has traffic
(its requests carry generous SLOs of their own, as in test_controller_burst_daemon.py),
and "calm" (steady, pinned to device 1: keep-alive never demotes it)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from daemon_harness import DEMO_MODELS, ROOT, managed_header, server_section, start_daemon, wait_until
from janusd.wire import admin_msgs as am

CONFIG = managed_header(2, warm_after_s=4.0) + """
[[models]]
name = "hot"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 8
devices = [0, 1]
warm_devices = [1]
pool = "elastic"
ttft_slo_ms = 0.01
tpot_slo_ms = 0.001

[[models]]
name = "calm"
checkpoint = "demo:qwen2-tiny"
kv_cache_mib = 8
devices = [1]
pool = "steady"
ttft_slo_ms = 3000.0
tpot_slo_ms = 300.0
"""
SLO = {"ttft_ms": 20000, "tpot_ms": 5000}
JANUS = [sys.executable, "-m", "janusd.cli"]
TMUX = shutil.which("tmux")


@pytest.fixture(scope="module")
def daemon():
    d = start_daemon(server_section(Path("@RUN@"), model_wait_timeout_s=30.0) + CONFIG)
    try:
        assert wait_until(lambda: {o["model"]: o["source"] for o in d.ctl(am.OracleReq()).data["oracle"]}.get("hot")
                          == "prior", 60.0, 0.2)
        yield d
    finally:
        d.stop()
    assert "Traceback" not in d.log_text(), d.log_text()[-3000:]


def _complete(d, model: str, tokens: int = 8) -> int:
    return d.http("POST", "/v1/completions", {"model": model, "prompt": "the quick brown fox", "max_tokens": tokens,
                                              "ignore_eos": True, "slo": SLO})[0]


def _events(d) -> list[dict]:
    return d.ctl(am.EventsReq()).data["events"]


def _states(d) -> dict[tuple[str, int], str]:
    return {(i["model"], i["device"]): i["state"] for i in d.ctl(am.InstancesReq()).data["instances"]}


def _run(*argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*JANUS, *argv], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**os.environ, "COLUMNS": "80"})


def test_top_once_shows_the_running_models(daemon):
    assert _complete(daemon, "calm") == 200
    t0 = time.monotonic()
    out = _run("top", "--once", "--socket", daemon.admin_socket, "--width", "80", "--height", "24")
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    rows = out.stdout.rstrip("\n").split("\n")
    assert len(rows) <= 24 and all(len(r) <= 80 for r in rows), out.stdout
    assert rows[0].startswith("janusd running") and "devices 2/2" in rows[0]
    models = {r.split()[0]: r for r in rows if r.split() and r.split()[0] in ("hot", "calm")}
    assert set(models) == {"hot", "calm"}, out.stdout
    assert "elastic" in models["hot"] and "steady" in models["calm"]
    assert "1A" in models["calm"] and "%" in models["calm"]  # Active, attainment over the last minute
    for dev in (0, 1):
        line = next(r for r in rows if r.startswith(f"  {dev} "))
        assert "%" in line and ("█" in line or "·" in line)
    assert "calm active" in next(r for r in rows if r.startswith("  1 "))
    print(f"janus top --once in {took:.2f} s (this includes the interpreter's start)")
    frame = json.loads(_run("top", "--once", "--json", "--socket", daemon.admin_socket).stdout)
    assert {m["name"] for m in frame["models"]} == {"hot", "calm"} and frame["error"] is None
    assert [p["device"] for p in frame["pools"]] == [0, 1] and frame["pools"][1]["num_pages"] > 0


def test_ctl_events_lists_a_bursts_ops_with_reasons_and_figures(daemon):
    before = daemon.ctl(am.EventsReq()).data["version"]
    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        codes = list(ex.map(lambda _: _complete(daemon, "hot", 16), range(12)))
    assert codes == [200] * 12
    assert wait_until(lambda: any(e["rule"] == "scale_out" and e["outcome"] == "ok" for e in _events(daemon)),
                      20.0, 0.1), _events(daemon)
    # after the burst, keep-alive rests it (no request for warm_after_s = 4 s)
    assert wait_until(lambda: any(e["model"] == "hot" and e["rule"] == "keepalive" and e["outcome"] == "ok"
                                  for e in _events(daemon)), 30.0, 0.2), _events(daemon)
    out = _run("ctl", "--socket", daemon.admin_socket, "events", "--json")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert data["kept"] == 500 and data["version"] > before
    up = next(e for e in data["events"] if e["rule"] == "scale_out")
    assert (up["model"], up["kind"], up["device"], up["target"], up["outcome"]) == ("hot", "activate", 1, "active",
                                                                                     "ok")
    assert up["reason"].startswith("scale out") and re.search(r"\d", up["reason"]), up  # with its figures
    assert up["seconds"] >= 0 and up["at"] > time.time() - 120
    rest = next(e for e in data["events"] if e["model"] == "hot" and e["rule"] == "keepalive")
    assert rest["kind"] == "rest" and rest["target"] in ("warm", "cold")
    assert re.search(r"idle \d+ s >= 4 s", rest["reason"]), rest
    # one log line per Op, and the counter by kind
    assert re.search(rf"decision {up['seq']}: activate hot on device 1 -> active: ok in [\d.]+ s \(scale out",
                     daemon.log_text())
    metrics = daemon.http("GET", "/metrics")[2]
    assert re.search(r'janusd_controller_decisions_total\{kind="activate",rule="scale_out"\} [1-9]', metrics)
    # the narrow table fits 80 columns and --follow ends on Ctrl-C with what it printed
    out = _run("ctl", "--socket", daemon.admin_socket, "events", "--last", "3")
    assert out.returncode == 0 and max(len(r) for r in out.stdout.splitlines()) <= 80, out.stdout
    p = subprocess.Popen([*JANUS, "ctl", "--socket", daemon.admin_socket, "events", "--follow", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    # Ctrl-C once it follows (its first line printed: on a loaded machine the CLI's start
    # alone can take seconds, and a signal before its loop would test the interpreter)
    # (raw reads of the pipe: communicate then reads the rest the same way)
    head = b""
    t_end = time.monotonic() + 60.0
    while head.count(b"\n") < len(data["events"]) and time.monotonic() < t_end:  # the kept ones, all
        ready, _, _ = select.select([p.stdout], [], [], 1.0)
        if ready:
            head += os.read(p.stdout.fileno(), 65536)  # type: ignore[union-attr]
    assert head.count(b"\n") >= len(data["events"]), f"ctl events --follow printed within 60 s: {head!r}"
    p.send_signal(2)
    stdout, stderr = p.communicate(timeout=30)
    assert p.returncode == 0, (head, stdout, stderr)
    followed = [json.loads(x) for x in (head.decode() + stdout).splitlines()]
    assert len(followed) >= len(data["events"]) and all("reason" in e and "seq" in e for e in followed), stdout


def _queried_metrics() -> set[str]:
    dash = json.loads((ROOT / "etc" / "grafana" / "janusd.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", ())]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]
    return {m for e in exprs for m in re.findall(r"\bjanusd_[a-z0-9_]+", e)}


def test_every_metric_of_the_grafana_dashboard_exists(daemon):
    names = _queried_metrics()
    assert len(names) >= 15 and "janusd_controller_decisions_total" in names
    assert _complete(daemon, "calm") == 200
    text = daemon.http("GET", "/metrics")[2]
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    samples = set(re.findall(r"^([a-z_:][a-z0-9_:]*)[{ ]", text, re.M))

    def family(n: str) -> str | None:
        for cand in (n, re.sub(r"_(total|bucket|sum|count)$", "", n)):
            if cand in families:
                return cand
        return None

    missing = sorted(n for n in names if family(n) is None)
    assert missing == [], f"the dashboard queries metrics /metrics does not have: {missing}"
    # the panels an operator reads first have data on a daemon that served and decided
    for n in ("janusd_slo_tokens_on_time_total", "janusd_ttft_seconds_bucket", "janusd_tpot_seconds_bucket",
              "janusd_pool_pages", "janusd_instances", "janusd_requests_total", "janusd_worker_up",
              "janusd_lifecycle_phase_seconds_bucket"):
        assert n in samples, n
    assert "janusd_controller_decisions_total" in samples or not _events(daemon)


# ------------------------------------------------------------------ in a terminal
class Screen:
    """`janus top` in a detached tmux session of a fixed size (its own tmux server)."""

    def __init__(self, name: str, cols: int, rows: int, socket: str, err: Path) -> None:
        self.server = f"janus-top-test-{os.getpid()}"
        self.name = name
        cmd = f"cd {ROOT} && exec {sys.executable} -m janusd.cli top --socket {socket} 2>{err}"
        self._tmux("-f", "/dev/null", "new-session", "-d", "-s", name, "-x", str(cols), "-y", str(rows), cmd)
        self._tmux("set-option", "-t", name, "status", "off")
        size = self._tmux("display-message", "-p", "-t", name, "#{pane_width}x#{pane_height}").stdout.strip()
        assert size == f"{cols}x{rows}", size

    def _tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert TMUX is not None
        return subprocess.run([TMUX, "-L", self.server, *args], capture_output=True, text=True, timeout=10)

    def text(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.name).stdout

    def rows(self) -> list[str]:
        return self.text().split("\n")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.name, *keys)

    def alive(self) -> bool:
        return self._tmux("has-session", "-t", self.name).returncode == 0

    def wait(self, pred, timeout: float = 20.0) -> str:
        ok = wait_until(lambda: pred(self.text()), timeout, 0.2)
        assert ok, f"screen {self.name}:\n{self.text()}"
        return self.text()

    def close(self) -> None:
        if self.alive():
            self._tmux("kill-session", "-t", self.name)


def _kill_server() -> None:
    if TMUX is not None:
        subprocess.run([TMUX, "-L", f"janus-top-test-{os.getpid()}", "kill-server"], capture_output=True, timeout=10)


def _row(text: str, start: str) -> str:
    return next((r for r in text.split("\n") if r.startswith(start)), "")


def _decisions(text: str) -> list[str]:
    rows = text.split("\n")
    i = next((k for k, r in enumerate(rows) if "DECISIONS" in r), len(rows))
    return rows[i + 1:]


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (make sysdeps installs it)")
def test_top_in_a_terminal_at_80x24_and_160x48(daemon, tmp_path):
    small = Screen("small", 80, 24, daemon.admin_socket, tmp_path / "small.err")
    big = Screen("big", 160, 48, daemon.admin_socket, tmp_path / "big.err")
    try:
        for s, cols in ((small, 80), (big, 160)):
            text = s.wait(lambda t: _row(t, "calm") and _row(t, "hot") and "DECISIONS" in t)
            rows = text.rstrip("\n").split("\n")
            assert len(rows) <= (24 if cols == 80 else 48) and all(len(r) <= cols for r in rows)
            for dev in (0, 1):  # device pages as a bar, with the share used
                line = _row(text, f"  {dev} ")
                assert "%" in line and re.search("[█▓▒·]{10,}", line), text
        assert "ttft slo" in big.text() and "ttft slo" not in small.text()  # the room is used
        assert re.search(r"\d+/\d+", _row(big.text(), "  1 "))  # pages used of all
        # a model's state change: the operator rests "calm" Warm
        t0 = time.time() - 1.0
        out = _run("ctl", "--socket", daemon.admin_socket, "state", "calm", "--device", "1", "warm", "--json")
        assert out.returncode == 0, out.stderr
        small.wait(lambda t: "1W" in _row(t, "calm") and "calm warm" in _row(t, "  1 "))
        big.wait(lambda t: "1 warm" in _row(t, "calm") and "calm warm" in _row(t, "  1 "))
        # decision lines: the wake a request starts, then keep-alive resting "hot" after its traffic
        assert _complete(daemon, "calm") == 200
        assert _complete(daemon, "hot") == 200

        def fresh(t: str, model: str, words: str) -> bool:
            return any(r.split()[1:2] == [model] and words in r and _clock(r[:8]) >= t0 for r in _decisions(t)
                       if len(r) > 8 and r[2] == ":")

        small.wait(lambda t: fresh(t, "calm", "woken by a req") and "1A" in _row(t, "calm"))
        big.wait(lambda t: fresh(t, "calm", "woken by a request (warm"), 10.0)
        big.wait(lambda t: fresh(t, "hot", "keep-alive: warm after idle"), 30.0)
        small.wait(lambda t: fresh(t, "hot", "keep-alive"), 10.0)
        # q quits, the terminal is given back, nothing on stderr
        for s in (small, big):
            s.keys("q")
        assert wait_until(lambda: not small.alive() and not big.alive(), 5.0, 0.1)
        assert (tmp_path / "small.err").read_text() == "" and (tmp_path / "big.err").read_text() == ""
    finally:
        small.close()
        big.close()
        _kill_server()


def _clock(hms: str) -> float:
    """Today's wall-clock time of HH:MM:SS (the decisions panel's first column)."""
    now = time.localtime()
    try:
        h, m, s = (int(x) for x in hms.split(":"))
    except ValueError:
        return 0.0
    return time.mktime((now.tm_year, now.tm_mon, now.tm_mday, h, m, s, 0, 0, -1))


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (make sysdeps installs it)")
def test_top_survives_its_daemon_restarting(tmp_path):
    run = Path(tempfile.mkdtemp(prefix="jtop-"))
    text = server_section(run) + "[devices]\ncount = 2\nmemory_mib = 64\n" + DEMO_MODELS
    sock = str(run / "admin.sock")
    d = start_daemon(text)
    screen = None
    try:
        screen = Screen("restart", 80, 24, sock, tmp_path / "top.err")
        screen.wait(lambda t: _row(t, "demo-llama") and t.startswith("janusd running"))
        d.stop()
        screen.wait(lambda t: t.startswith("janusd DISCONNECTED") and _row(t, "demo-llama"), 10.0)  # last round
        d = start_daemon(text)
        screen.wait(lambda t: t.startswith("janusd running") and _row(t, "demo-llama"), 20.0)
        screen.keys("C-c")  # Ctrl-C quits as q does
        assert wait_until(lambda: not screen.alive(), 5.0, 0.1)
        assert (tmp_path / "top.err").read_text() == ""
    finally:
        if screen is not None:
            screen.close()
        _kill_server()
        d.stop()
        shutil.rmtree(run, ignore_errors=True)

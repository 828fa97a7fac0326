"""Slow and half-sent HTTP requests are closed within their bounds; the listen backlog is
configurable; unknown or unimplemented request fields are refused (or ignored on request).

One real daemon (one demo model on one CPU worker) with small limits: a request head
within 1 s, a body within 1.5 s, idle keep-alive 2.5 s, and allow_unknown_fields = true
(the default, false, is checked in test_api_errors.py and by the parse tests here).
"""

from __future__ import annotations

import asyncio
import json
import select
import selectors
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from daemon_harness import server_section, start_daemon

HEADER_S = 1.0
BODY_S = 1.5
KEEPALIVE_S = 2.5
LINGER_S = 10.0  # aiohttp's lingering read of an unread body before it closes (web_protocol.py)
SLACK_S = 1.5    # a loaded two-core test machine

MODEL = """
[[models]]
name = "demo-qwen2"
checkpoint = "demo:qwen2-tiny"
kv_cache_mib = 32
devices = [0]
"""


@pytest.fixture(scope="module")
def daemon():
    text = server_section(Path("@RUN@"), header_timeout_s=HEADER_S, body_timeout_s=BODY_S,
                          keepalive_timeout_s=KEEPALIVE_S, allow_unknown_fields=True)
    d = start_daemon(text + "[devices]\ncount = 1\nmemory_mib = 128\n" + MODEL, args=["--log-level", "debug"])
    yield d
    assert d.stop() == 0, d.log_text()


def _connect(d, timeout: float = 30.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", d.port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _read_until_closed(s: socket.socket, limit_s: float) -> tuple[bytes, float | None, float | None]:
    """(bytes received, seconds to the first byte, seconds to EOF or a reset; None if still open
    after limit_s), measured from now."""
    t0 = time.monotonic()
    data, first = b"", None
    while True:
        left = limit_s - (time.monotonic() - t0)
        if left <= 0:
            return data, first, None
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            return data, first, None
        except ConnectionResetError:
            return data, first, time.monotonic() - t0
        if not chunk:
            return data, first, time.monotonic() - t0
        if first is None:
            first = time.monotonic() - t0
        data += chunk


def _completion(d, **kw):
    body = {"model": "demo-qwen2", "prompt": "once upon a time", "max_tokens": 2, **kw}
    return d.http("POST", "/v1/completions", body)


def test_every_request_is_traced_by_an_id_in_the_response_header_and_the_log(daemon):
    """The client's X-Request-Id is kept when it is a plain token (its logs join ours),
    replaced otherwise; the body's id carries it, errors and streams alike."""
    import re

    body = {"model": "demo-qwen2", "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
    st, h, out = daemon.http("POST", "/v1/completions", body, headers={"X-Request-Id": "trace-42.a"})
    assert st == 200 and h["X-Request-Id"] == "trace-42.a" and out["id"] == "cmpl-trace-42.a"
    st, h, out = daemon.http("POST", "/v1/completions", body)
    assert st == 200 and re.fullmatch(r"[0-9a-f]{24}", h["X-Request-Id"]) and out["id"] == "cmpl-" + h["X-Request-Id"]
    generated = h["X-Request-Id"]
    st, h, _ = daemon.http("POST", "/v1/completions", body, headers={"X-Request-Id": "bad id\twith spaces"})
    assert st == 200 and re.fullmatch(r"[0-9a-f]{24}", h["X-Request-Id"]) and h["X-Request-Id"] != generated
    st, h, _ = daemon.http("POST", "/v1/completions", {**body, "model": "nope"}, headers={"X-Request-Id": "t-404"})
    assert st == 404 and h["X-Request-Id"] == "t-404"
    st, h, text = daemon.http("POST", "/v1/completions", {**body, "stream": True}, headers={"X-Request-Id": "t-sse"})
    assert st == 200 and h["X-Request-Id"] == "t-sse" and '"id":"cmpl-t-sse"' in text
    log = daemon.log_text()
    for rid in ("trace-42.a", generated, "t-sse"):
        assert re.search(rf"DEBUG janusd: request {re.escape(rid)} demo-qwen2 ok: prompt \d+, output 2 tokens", log), rid
    assert "request t-404 refused: 404" in log


def test_half_sent_heads_and_bodies_are_closed_in_time_while_others_are_served(daemon):
    results: dict[str, tuple[bytes, float | None, float | None]] = {}

    def partial_head():
        s = _connect(daemon)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        results["partial_head"] = _read_until_closed(s, HEADER_S + SLACK_S + 5)

    def silent():
        s = _connect(daemon)
        results["silent"] = _read_until_closed(s, HEADER_S + SLACK_S + 5)

    def slowloris():
        # a byte every 0.2 s: the deadline is on the whole head, not on each byte
        s = _connect(daemon)
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
        t0 = time.monotonic()
        try:
            for i in range(len(head)):
                s.sendall(head[i:i + 1])
                # stop sending once the server answers (bytes sent after its close draw a reset)
                if select.select([s], [], [], 0.2)[0] or time.monotonic() - t0 > HEADER_S + SLACK_S + 5:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        data, first, _ = _read_until_closed(s, 1.0)
        results["slowloris"] = (data, None, time.monotonic() - t0)

    def partial_body():
        s = _connect(daemon)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 200\r\n\r\n{\"model\": \"demo-qwen2\", ")
        results["partial_body"] = _read_until_closed(s, BODY_S + LINGER_S + SLACK_S + 5)

    threads = [threading.Thread(target=f) for f in (partial_head, silent, slowloris, partial_body)]
    for t in threads:
        t.start()
    # meanwhile, ordinary requests are served
    time.sleep(0.3)
    st, _, out = _completion(daemon)
    assert st == 200 and out["usage"]["completion_tokens"] == 2, out
    assert daemon.http("GET", "/health")[0] == 200
    for t in threads:
        t.join(60)

    data, first, closed = results["partial_head"]
    assert closed is not None and closed < HEADER_S + SLACK_S, results["partial_head"]
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"

    data, first, closed = results["silent"]  # nothing sent: closed without an answer
    assert data == b"" and closed is not None and closed < HEADER_S + SLACK_S, results["silent"]

    data, _, closed = results["slowloris"]
    assert data.startswith(b"HTTP/1.1 408 ") and closed < HEADER_S + SLACK_S + 1.0, results["slowloris"]

    data, first, closed = results["partial_body"]
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert first is not None and BODY_S - 0.1 < first < BODY_S + SLACK_S, results["partial_body"]
    assert b"Connection: close" in data, data
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert closed is not None and closed < BODY_S + LINGER_S + SLACK_S, results["partial_body"]
    assert "Traceback" not in daemon.log_text()


def test_keep_alive_survives_idle_below_the_limit_and_closes_after_it(daemon):
    s = _connect(daemon)
    req = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"

    def one() -> bytes:
        s.sendall(req)
        s.settimeout(10)
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += s.recv(65536)
        head, rest = buf.split(b"\r\n\r\n", 1)
        n = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(rest) < n:
            rest += s.recv(65536)
        return head

    assert one().startswith(b"HTTP/1.1 200")
    time.sleep(HEADER_S + 0.5)  # idle longer than the head deadline, shorter than keep-alive
    assert one().startswith(b"HTTP/1.1 200")
    data, _, closed = _read_until_closed(s, KEEPALIVE_S + SLACK_S + 5)
    assert data == b"" and closed is not None, (data, closed)
    assert KEEPALIVE_S - 0.3 < closed < KEEPALIVE_S + SLACK_S, closed


def test_a_request_longer_than_the_deadlines_is_not_cut(daemon):
    # the head and keep-alive timers only run between requests: a stream held open longer than
    # both (the client reads nothing for a while: its small receive buffer fills and the
    # handler waits in write), on a connection silent meanwhile, is served to its end
    body = json.dumps({"model": "demo-qwen2", "prompt": "once upon a time", "max_tokens": 1500,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}).encode()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.connect(("127.0.0.1", daemon.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    s.settimeout(60)
    assert s.recv(12).startswith(b"HTTP/1.1 200")
    time.sleep(KEEPALIVE_S + 0.5)
    data, _, closed = _read_until_closed(s, 60)  # the stream, then EOF once keep-alive idles out
    s.close()
    assert closed is not None
    assert b"data: [DONE]" in data, data[-300:]
    assert b'"completion_tokens":1500' in data, data[-300:]


def test_burst_of_400_connects_and_200_half_sent_heads(daemon):
    """The listen backlog (2048) takes a burst without SYN drops (a dropped SYN is retried
    after 1 s); the half-sent heads and the silent connections all close within the bound."""
    n = 400
    sel = selectors.DefaultSelector()
    socks = []
    t0 = time.monotonic()
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", daemon.port))
        socks.append(s)
        sel.register(s, selectors.EVENT_WRITE)
    connected = []
    while len(connected) < n and time.monotonic() - t0 < 10:
        for key, _ in sel.select(timeout=0.5):
            sel.unregister(key.fileobj)
            connected.append(time.monotonic() - t0)
            assert key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    connected.sort()
    assert len(connected) == n
    assert connected[-1] < 0.9, f"p90 {connected[int(0.9 * n)]:.3f} s, max {connected[-1]:.3f} s"
    for s in socks[: n // 2]:
        s.setblocking(True)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
    t1 = time.monotonic()
    st, _, out = _completion(daemon)  # served meanwhile
    assert st == 200, out
    open_ = set(range(n))
    answered = 0
    for i, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
    while open_ and time.monotonic() - t1 < HEADER_S + SLACK_S + 3:
        for key, _ in sel.select(timeout=0.2):
            try:
                data = key.fileobj.recv(65536)
            except ConnectionResetError:
                data = b""
            if data.startswith(b"HTTP/1.1 408"):
                answered += 1
            if not data:
                sel.unregister(key.fileobj)
                open_.discard(key.data)
    elapsed = time.monotonic() - t1
    for s in socks:
        s.close()
    assert not open_, f"{len(open_)} of {n} connections still open after {elapsed:.1f} s"
    assert elapsed < HEADER_S + SLACK_S + 1.0, elapsed
    assert answered == n // 2, answered
    assert daemon.http("GET", "/health")[0] == 200


def test_unknown_fields_ignored_when_allowed_but_unimplemented_ones_refused(daemon):
    st, _, out = _completion(daemon, some_vendor_extra={"x": 1}, guided_json=None)
    assert st == 200, out
    st, _, out = daemon.http("POST", "/v1/chat/completions", {
        "model": "demo-qwen2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "reasoning_effort": "low", "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert st == 400 and out["error"]["param"] == "tools", out
    st, _, out = _completion(daemon, response_format={"type": "json_object"})
    assert st == 400 and out["error"]["param"] == "response_format", out


# ---- the listen backlog, on start_http in this process (no daemon needed) ----

class _Front:
    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.started_wall = 0.0


def _listen_backlog(port: int) -> int:
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    line = out.split("\n")[0].split()
    assert line and line[0] == "LISTEN", out
    return int(line[2])  # State Recv-Q Send-Q ...: a listen socket's Send-Q is its backlog


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
@pytest.mark.parametrize("configured", [7, None])
def test_listen_backlog_reaches_the_socket(configured):
    from janusd.config import parse_config
    from janusd.server.api import start_http

    text = f"[server]\nlisten_backlog = {configured}\n" if configured else ""
    cfg = parse_config(text)

    async def main() -> int:
        runner, port = await start_http(_Front(cfg), "127.0.0.1", 0)
        try:
            return _listen_backlog(port)
        finally:
            await runner.cleanup()

    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert asyncio.run(main()) == min(configured or 2048, somaxconn)


# ---- request fields: unit tests of the parsers ----

def _parse_err(fn, body: dict, **kw):
    from janusd.server.openai_types import ApiError

    with pytest.raises(ApiError) as e:
        fn(json.dumps(body).encode(), **kw)
    assert e.value.status == 400
    return e.value


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMP = {"model": "m", "prompt": "hi"}


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"function_call": {"name": "f"}}, "function_call"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"modalities": ["text", "audio"]}, "modalities"),
])
@pytest.mark.parametrize("allow", [False, True])
def test_unimplemented_chat_fields_are_refused_naming_the_field(extra, param, allow):
    from janusd.server.openai_types import parse_chat

    e = _parse_err(parse_chat, {**CHAT, **extra}, allow_unknown_fields=allow)
    assert e.param == param and e.code == "unsupported", e.message
    assert e.message.startswith(param + ":")
    if param == "response_format":
        assert "JSON mode" in e.message


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_unimplemented_completion_fields_are_refused_naming_the_field(extra, param):
    from janusd.server.openai_types import parse_completion

    for allow in (False, True):
        assert _parse_err(parse_completion, {**COMP, **extra}, allow_unknown_fields=allow).param == param


def test_unknown_top_level_fields_refused_by_default_ignored_when_allowed():
    from janusd.server.openai_types import parse_chat, parse_completion

    for fn, base in ((parse_chat, CHAT), (parse_completion, COMP)):
        e = _parse_err(fn, {**base, "frobnicate": True})
        assert (e.param, e.code) == ("frobnicate", "unknown_field") and "frobnicate" in e.message, e.message
        assert "allow_unknown_fields" in e.message
        assert fn(json.dumps({**base, "frobnicate": True}).encode(), allow_unknown_fields=True).model == "m"
    # a nested unknown field in the SLO extension is refused either way, with its path
    for allow in (False, True):
        e = _parse_err(parse_completion, {**COMP, "slo": {"ttft_ms": 5, "x": 1}}, allow_unknown_fields=allow)
        assert e.param == "slo.x", e.message


def test_fields_clients_commonly_send_are_accepted():
    from janusd.server.openai_types import parse_chat, parse_completion

    chat = {**CHAT, "user": "u", "n": 1, "stream": True, "stream_options": {"include_usage": True},
            "logprobs": False, "top_logprobs": 0, "store": False, "metadata": {"k": "v"}, "service_tier": "auto",
            "parallel_tool_calls": True, "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
            "modalities": ["text"], "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
            "seed": 1, "stop": None, "temperature": 0.7, "top_p": 1, "max_completion_tokens": 9}
    p = parse_chat(json.dumps(chat).encode())
    assert p.sampling.max_tokens == 9 and p.max_tokens_given and p.include_usage
    assert parse_chat(json.dumps({**CHAT, "tool_choice": "auto", "function_call": "none"}).encode()).chat
    comp = {**COMP, "user": "u", "n": 1, "echo": False, "best_of": 1, "suffix": None, "logprobs": None,
            "stream_options": None, "response_format": {"type": "text"}, "tools": None, "max_tokens": 3}
    assert parse_completion(json.dumps(comp).encode()).sampling.max_tokens == 3

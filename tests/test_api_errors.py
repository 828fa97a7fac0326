"""Every bad input gets its status and an OpenAI error body; the daemon stays healthy.

One real daemon (two demo models on two CPU workers) for the module, with API keys,
an 8 KiB body limit, a queue bound of 2 and a 64-token context on demo-llama.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket

import pytest

from daemon_harness import DEMO_MODELS, server_section, start_daemon, wait_until

KEY = "sk-test-1"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def daemon():
    from pathlib import Path

    models = DEMO_MODELS.replace('kv_cache_mib = 32\ndevices = [0]', 'kv_cache_mib = 32\nmax_model_len = 64\ndevices = [0]')
    text = server_section(Path("@RUN@"), api_keys=[KEY], max_body_bytes=8192, queue_limit=2)
    text += "[devices]\ncount = 2\nmemory_mib = 256\n" + models
    d = start_daemon(text)
    yield d
    assert d.stop() == 0, d.log_text()


def _err(d, body, status, param=None, path="/v1/completions", headers=AUTH, raw=None, timeout=60.0):
    st, hdrs, out = d.http("POST", path, body, headers=headers, raw=raw, timeout=timeout)
    assert st == status, (st, out)
    assert set(out) == {"error"}, out
    assert set(out["error"]) == {"message", "type", "param", "code"}, out
    assert out["error"]["message"]
    if param is not None:
        assert out["error"]["param"] == param, out
    return out["error"], hdrs


def test_queue_bound_gives_429_with_retry_after(daemon):
    # a burst larger than the queue bound: requests beyond it are refused, the rest served
    body = {"model": "demo-qwen2", "prompt": "word " * 300, "max_tokens": 2, "ignore_eos": True}

    def one(_):
        return daemon.http("POST", "/v1/completions", body, headers=AUTH)

    with concurrent.futures.ThreadPoolExecutor(24) as ex:
        results = list(ex.map(one, range(24)))
    statuses = [r[0] for r in results]
    assert 429 in statuses, statuses
    assert 200 in statuses, statuses
    assert set(statuses) <= {200, 429, 503}, statuses
    for st, hdrs, out in results:
        if st == 429:
            assert hdrs.get("Retry-After") == "1"
            assert out["error"]["type"] == "rate_limit_error"
        if st == 200:
            assert out["usage"]["completion_tokens"] == 2
    st, _, m = daemon.http("GET", "/metrics")
    refused = f'janusd_rejected_total{{model="demo-qwen2",reason="queue_full"}} {float(statuses.count(429))}'
    assert refused in m, [line for line in m.splitlines() if "rejected" in line]


def test_auth_is_required(daemon):
    body = {"model": "demo-qwen2", "prompt": "hi", "max_tokens": 1}
    e, _ = _err(daemon, body, 401, headers={})
    assert e["type"] == "authentication_error"
    _err(daemon, body, 401, headers={"Authorization": "Bearer wrong"})
    st, _, out = daemon.http("POST", "/v1/completions", body, headers=AUTH)
    assert st == 200 and out["usage"]["completion_tokens"] == 1
    st, _, _ = daemon.http("GET", "/health")  # health and metrics need no key
    assert st == 200


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": "demo-qwen2", "prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
        ({"model": "demo-qwen2", "prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"model": "demo-qwen2", "prompt": "hi", "temperature": 2.5}, "temperature"),
        ({"model": "demo-qwen2", "prompt": "hi", "top_p": 0}, "top_p"),
        ({"model": "demo-qwen2", "prompt": "hi", "n": 2}, "n"),
        ({"model": "demo-qwen2", "prompt": "hi", "seed": 2**70}, "seed"),
        ({"model": "demo-qwen2", "prompt": "hi", "stop": [""]}, None),
        ({"model": "demo-qwen2", "prompt": [1, "a"]}, "prompt"),
        ({"model": "demo-qwen2", "prompt": ""}, "prompt"),
        ({"model": "demo-qwen2"}, None),
        ({"model": "demo-qwen2", "prompt": "hi", "slo": {"ttft_ms": -1}}, "slo.ttft_ms"),
        ({"model": "demo-qwen2", "prompt": "hi", "frequency_penalty": 0.5}, "frequency_penalty"),
        ({"model": "demo-llama", "prompt": "hello " * 80, "max_tokens": 1}, "prompt"),
        ({"model": "demo-llama", "prompt": "hi", "max_tokens": 100}, "max_tokens"),
        ({"model": "demo-qwen2", "prompt": [10**9]}, None),
        # past 2**64 msgpack cannot carry it: once this hung the request and its dispatch tick
        ({"model": "demo-qwen2", "prompt": [10**20], "max_tokens": 1}, "prompt"),
        ({"model": "demo-qwen2", "prompt": "hi", "stop_token_ids": [2**64 + 1]}, "stop_token_ids[0]"),
        ({"model": "demo-qwen2", "prompt": "hi", "logit_bias": {"5": 10}}, "logit_bias"),
        ({"model": "demo-qwen2", "prompt": "hi", "best_of": 3}, "best_of"),
        # every stop string is checked after every token: 60k of them slowed a device ~13x
        ({"model": "demo-qwen2", "prompt": "hi", "max_tokens": 1, "stop": [f"s{i}" for i in range(33)]}, "stop"),
        ([1, 2, 3], None),
        # not implemented: refused naming the field, never silently ignored
        ({"model": "demo-qwen2", "prompt": "hi", "response_format": {"type": "json_object"}}, "response_format"),
        ({"model": "demo-qwen2", "prompt": "hi", "tools": [{"type": "function"}]}, "tools"),
        # unknown top-level fields (server.allow_unknown_fields = false, the default)
        ({"model": "demo-qwen2", "prompt": "hi", "guided_json": {"type": "object"}}, "guided_json"),
    ],
)
def test_bad_completion_bodies_get_400(daemon, body, param):
    e, _ = _err(daemon, body, 400, param=param, timeout=10)
    assert e["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": "demo-qwen2", "messages": []}, "messages"),
        ({"model": "demo-qwen2", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "demo-qwen2", "messages": [{"role": "user"}]}, "messages[0].content"),
        ({"model": "demo-qwen2", "messages": "hello"}, "messages"),
        ({"model": "demo-qwen2", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ({"model": "demo-qwen2", "messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "auto"}, "tools"),
        ({"model": "demo-qwen2", "messages": [{"role": "user", "content": "x"}],
          "functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"model": "demo-qwen2", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
         "tool_choice"),
        ({"model": "demo-qwen2", "messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
        ({"model": "demo-qwen2", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low"},
         "reasoning_effort"),
    ],
)
def test_bad_chat_bodies_get_400(daemon, body, param):
    _err(daemon, body, 400, param=param, path="/v1/chat/completions")


def test_fields_clients_commonly_send_are_accepted(daemon):
    body = {"model": "demo-qwen2", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2,
            "user": "u", "n": 1, "logprobs": False, "store": False, "metadata": {"k": "v"}, "service_tier": "auto",
            "tools": [], "tool_choice": "none", "parallel_tool_calls": False, "response_format": {"type": "text"},
            "presence_penalty": 0, "frequency_penalty": 0, "stream": False, "stream_options": None}
    st, _, out = daemon.http("POST", "/v1/chat/completions", body, headers=AUTH)
    assert st == 200, out
    assert out["usage"]["completion_tokens"] <= 2


def test_malformed_json_unknown_model_and_route(daemon):
    _err(daemon, None, 400, raw=b'{"model": "demo-qwen2", "prompt": ')
    _err(daemon, None, 400, raw=b"\xff\xfe not json")
    e, _ = _err(daemon, {"model": "no-such-model", "prompt": "hi"}, 404, param="model")
    assert e["code"] == "model_not_found"
    st, _, out = daemon.http("POST", "/v1/nothing", {}, headers=AUTH)
    assert st == 404 and "error" in out


def test_body_over_limit_gets_413(daemon):
    body = {"model": "demo-qwen2", "prompt": "x" * 20000}
    e, _ = _err(daemon, body, 413)
    assert "8192" in e["message"]


def test_client_disconnect_aborts_and_frees_kv(daemon):
    from janusd.wire import admin_msgs as am

    body = json.dumps({"model": "demo-qwen2", "prompt": "once upon a time", "max_tokens": 1500,
                       "ignore_eos": True, "stream": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json", **AUTH})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.read(6) == b"data: "  # streaming has begun
    held = daemon.ctl(am.PoolsReq()).data["pools"][1]
    assert held["engine_requests"] == 1, held
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()

    def freed():
        p = daemon.ctl(am.PoolsReq()).data["pools"][1]
        return p if p["engine_requests"] == 0 and p["running"] == 0 else None

    assert wait_until(freed, 3.0), daemon.ctl(am.PoolsReq()).data
    st, _, m = daemon.http("GET", "/metrics")
    assert 'janusd_requests_total{model="demo-qwen2",outcome="cancelled"} 1.0' in m


def test_non_streaming_client_disconnect_aborts_too(daemon):
    from janusd.wire import admin_msgs as am

    body = json.dumps({"model": "demo-qwen2", "prompt": "once upon a time", "max_tokens": 1800,
                       "ignore_eos": True}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json", **AUTH})
    assert wait_until(lambda: daemon.ctl(am.PoolsReq()).data["pools"][1]["engine_requests"] == 1, 5.0)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    assert wait_until(lambda: daemon.ctl(am.PoolsReq()).data["pools"][1]["engine_requests"] == 0, 3.0)
    st, _, m = daemon.http("GET", "/metrics")
    assert 'janusd_requests_total{model="demo-qwen2",outcome="cancelled"} 2.0' in m


def test_daemon_stays_healthy_after_bad_inputs(daemon):
    st, _, h = daemon.http("GET", "/health")
    assert st == 200 and h["status"] == "ok", h
    st, _, out = daemon.http("POST", "/v1/chat/completions",
                             {"model": "demo-qwen2", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 3}, headers=AUTH)
    assert st == 200, out
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert out["usage"]["completion_tokens"] <= 3
    assert "Traceback" not in daemon.log_text()


def test_unattainable_slo_is_rejected_with_503(daemon):
    # a per-request TTFT SLO no prefill can meet: LST-IMH (requeue=reject) refuses it
    body = {"model": "demo-qwen2", "prompt": "hello", "max_tokens": 4, "slo": {"ttft_ms": 0.01}}
    e, _ = _err(daemon, body, 503, headers=AUTH)
    assert e["code"] == "slo_unattainable" and "0.01 ms" in e["message"]
    e, _ = _err(daemon, {**body, "stream": True}, 503, headers=AUTH)  # refused before the first token: a plain status
    st, _, m = daemon.http("GET", "/metrics")
    assert 'janusd_rejected_total{model="demo-qwen2",reason="slo"} 2.0' in m
    # a generous override is served
    st, _, out = daemon.http("POST", "/v1/completions", {**body, "slo": {"ttft_ms": 60000}}, headers=AUTH)
    assert st == 200, out

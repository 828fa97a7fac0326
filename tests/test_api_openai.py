"""The official `openai` client against a real daemon serving the default config's
models (SmolLM2-135M-Instruct on device 0, two demo models on device 1), and every
response checked token for token against the engine run in this process."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import msgspec
import pytest

from daemon_harness import SHARED_CACHE, server_section, start_daemon
from janusd.config import DEFAULT_CONFIG_TOML, EngineConfig, parse_config

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The quick brown fox"
MODELS = ("smollm2-135m-instruct", "demo-llama", "demo-qwen2")
# (kind, model, sampling): greedy chats and seeded-sampling completions, one pair per model
CASES = [(kind, m) for m in MODELS for kind in ("chat", "completion")]
GEN = {"chat": {"temperature": 0.0, "max_tokens": 12}, "completion": {"temperature": 0.9, "top_p": 0.95,
                                                                       "seed": 1234, "max_tokens": 12}}


def _models_config():
    """The embedded default's models; where torch has no fast bfloat16 on this cpu (no
    AVX-512 BF16 / AMX: its reference gemm is ~6x slower than float32), bfloat16 models run
    in float32, else four concurrent SmolLM2 prompts on one core miss its 2 s TTFT SLO and
    the dispatcher rightly rejects one (the test is about outputs, not this cpu's speed)."""
    import torch

    cfg = parse_config(DEFAULT_CONFIG_TOML)
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return cfg
    return msgspec.structs.replace(cfg, models=[
        msgspec.structs.replace(m, dtype="float32") if m.dtype == "bfloat16" else m for m in cfg.models])


def _default_models_config() -> str:
    cfg = _models_config()
    models = msgspec.toml.encode({"models": cfg.models}).decode()
    return server_section(Path("@RUN@")) + "[devices]\ncount = 2\nmemory_mib = 1024\n" + models


@pytest.fixture(scope="module")
def daemon():
    d = start_daemon(_default_models_config())
    yield d
    assert d.stop() == 0, d.log_text()


@pytest.fixture(scope="module")
def reference():
    """(text, prompt tokens, completion tokens, finish reason) per case from the in-process engine."""
    import torch

    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.types import SamplingParams
    from janusd.engine.worker_tokenize import tokenize_prompt
    from janusd.wire.worker_msgs import ChatMessage

    torch.set_num_threads(1)
    cfg = _models_config()
    de = DeviceEngine(kind="cpu", device_index=0, memory_bytes=2048 << 20, page_size=2 << 20)
    out = {}
    for m in MODELS:
        me = de.load_model(cfg.model(m), EngineConfig(), SHARED_CACHE)
        for kind in ("chat", "completion"):
            if kind == "chat":
                ids = tokenize_prompt(me.tokenizer, None, [ChatMessage(c["role"], c["content"]) for c in CHAT])
            else:
                ids = tokenize_prompt(me.tokenizer, PROMPT, None)
            res = me.generate({"r": ids}, SamplingParams(**GEN[kind]))["r"]
            out[(kind, m)] = ("".join(o.text for o in res), len(ids), res[-1].num_output_tokens,
                              res[-1].finish_reason)
        de.unload_model(m)
    return out


def _client(d):
    import openai

    return openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _run(client, kind: str, model: str, stream: bool):
    """(text, usage, finish_reason) of one request through the openai client."""
    extra = dict(GEN[kind])
    if kind == "chat":
        call = lambda **kw: client.chat.completions.create(model=model, messages=CHAT, **kw)  # noqa: E731
    else:
        call = lambda **kw: client.completions.create(model=model, prompt=PROMPT, **kw)  # noqa: E731
    if not stream:
        r = call(**extra)
        c = r.choices[0]
        return (c.message.content if kind == "chat" else c.text), r.usage, c.finish_reason
    text, usage, finish = [], None, None
    for chunk in call(stream=True, stream_options={"include_usage": True}, **extra):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            piece = c.delta.content if kind == "chat" else c.text
            text.append(piece or "")
            finish = c.finish_reason or finish
    return "".join(text), usage, finish


def _check(ref, got):
    text, usage, finish = got
    r_text, r_prompt, r_out, r_finish = ref
    assert text == r_text
    assert usage.prompt_tokens == r_prompt
    assert usage.completion_tokens == r_out
    assert usage.total_tokens == r_prompt + r_out
    assert finish == r_finish


def test_openai_client_streams_chat_and_completion(daemon, reference):
    client = _client(daemon)
    got = _run(client, "chat", "smollm2-135m-instruct", stream=True)
    assert "Paris" in got[0]
    _check(reference[("chat", "smollm2-135m-instruct")], got)
    _check(reference[("completion", "demo-llama")], _run(client, "completion", "demo-llama", stream=True))
    _check(reference[("completion", "smollm2-135m-instruct")],
           _run(client, "completion", "smollm2-135m-instruct", stream=False))
    models = {m.id for m in client.models.list().data}
    assert models == set(MODELS)


def test_concurrent_requests_to_three_models_match_the_engine(daemon, reference):
    client = _client(daemon)
    jobs = [(kind, m, stream) for kind, m in CASES for stream in (False, True)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as ex:
        results = list(ex.map(lambda j: _run(client, *j), jobs))
    for (kind, m, _stream), got in zip(jobs, results):
        _check(reference[(kind, m)], got)


def test_metrics_account_for_the_requests(daemon):
    st, _, text = daemon.http("GET", "/metrics")
    assert st == 200
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            values[k] = float(v)
    for m in MODELS:
        ok = values[f'janusd_requests_total{{model="{m}",outcome="ok"}}']
        assert ok >= 4
        assert values[f'janusd_ttft_seconds_count{{model="{m}"}}'] == ok
        att = values[f'janusd_slo_attainment{{model="{m}"}}']
        assert 0.0 <= att <= 1.0
        assert values[f'janusd_slo_tokens_on_time_total{{model="{m}"}}'] <= values[f'janusd_slo_tokens_total{{model="{m}"}}']
        assert values[f'janusd_queue_length{{model="{m}"}}'] == 0
        # the engine's own counts (polled from the workers): every step decodes or prefills a
        # token, so steps <= decoded + prompt tokens; decoded tokens are at most those delivered
        eng: dict[str, float] = {}  # summed over the model's devices
        for k, v in values.items():
            if k.startswith("janusd_engine_") and f'model="{m}"' in k:
                eng[k.split("{")[0]] = eng.get(k.split("{")[0], 0.0) + v
        assert 1 <= eng["janusd_engine_steps_total"] <= (eng["janusd_engine_decode_tokens_total"]
                                                         + values[f'janusd_prompt_tokens_total{{model="{m}"}}'])
        assert eng["janusd_engine_decode_tokens_total"] <= values[f'janusd_generation_tokens_total{{model="{m}"}}']
        assert eng["janusd_engine_forward_seconds_total"] > 0
        # every request here produced several tokens, so each has a mean time per output token
        assert values[f'janusd_tpot_seconds_count{{model="{m}"}}'] == ok
        assert 0 < values[f'janusd_tpot_seconds_sum{{model="{m}"}}'] < ok * 5.0
        states = {k: v for k, v in values.items() if k.startswith("janusd_instance_state{") and f'model="{m}"' in k}
        assert list(states.values()) == [1.0] and 'state="active"' in next(iter(states)), states
    assert values["janusd_dispatch_submitted_total"] == values["janusd_dispatch_completed_total"]
    # token times come from a fine clock, not uvloop's loop.time() (cached per iteration, whole
    # milliseconds), under which every TTFT, and so every sum of them, was a multiple of 1 ms
    sums = [values[f'janusd_ttft_seconds_sum{{model="{m}"}}'] * 1000 for m in MODELS]
    assert any(abs(x - round(x)) > 1e-6 for x in sums), sums
    assert values['janusd_pool_pages{device="0",kind="num_pages"}'] == 512
    # figures that are not page counts are not labelled as pages
    assert not any(k.startswith("janusd_pool_pages") and ("page_size" in k or "_pct" in k) for k in values)
    assert values['janusd_pool_stat{device="0",stat="page_size"}'] == 2 << 20


def test_stream_chunks_carry_every_token_id_exactly_once(daemon):
    """The `token_ids` extension accounts for every generated token, also those whose
    text is held back, so a replayer times each token by the chunk that carried it."""
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    body = {"model": "demo-qwen2", "prompt": PROMPT, "max_tokens": 40, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    ids, text, usage = [], [], None
    for raw in resp.read().decode().split("\n\n"):
        if not raw.startswith("data: ") or raw == "data: [DONE]":
            continue
        msg = json.loads(raw[len("data: "):])
        if msg.get("usage"):
            usage = msg["usage"]
        for c in msg["choices"]:
            ids.extend(c.get("token_ids", []))
            text.append(c["text"])
    conn.close()
    assert usage is not None and usage["completion_tokens"] == 40
    assert len(ids) == 40
    # the same ids and text as the non-streamed request
    st, _, full = daemon.http("POST", "/v1/completions", {k: v for k, v in body.items()
                                                          if k not in ("stream", "stream_options")})
    assert st == 200 and full["choices"][0]["text"] == "".join(text)


def test_each_model_answers_like_janus_generate(daemon):
    """The same prompt, seed and sampling through the daemon and through `janus generate`
    (a separate process running the same engine) give the same text and token count."""
    import json
    import subprocess
    import sys

    cfg = parse_config(DEFAULT_CONFIG_TOML)
    for m in MODELS:
        args = ["--prompt", PROMPT, "--max-tokens", "12", "--temperature", "0.9", "--top-p", "0.95", "--seed", "1234"]
        out = subprocess.run(
            [sys.executable, "-m", "janusd.cli", "generate", "--model", cfg.model(m).checkpoint, *args,
             "--dtype", cfg.model(m).dtype, "--cache-dir", str(SHARED_CACHE), "--threads", "1", "--json"],
            capture_output=True, text=True, timeout=240,
        )
        assert out.returncode == 0, out.stderr
        cli = json.loads(out.stdout.strip().splitlines()[-1])
        st, _, api = daemon.http("POST", "/v1/completions", {"model": m, "prompt": PROMPT, "max_tokens": 12,
                                                             "temperature": 0.9, "top_p": 0.95, "seed": 1234})
        assert st == 200, api
        assert api["choices"][0]["text"] == cli["text"], m
        assert api["usage"]["completion_tokens"] == cli["completion_tokens"] == len(cli["token_ids"])
        assert api["usage"]["prompt_tokens"] == cli["prompt_tokens"]

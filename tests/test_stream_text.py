"""The text at the ends of a streamed sequence.

1. A token without text (EOS, a stop token id) does not become an SSE chunk whose content
   is "": the stream ends as OpenAI's does, with a chunk whose delta is {} (completions:
   text "") and finish_reason set, and that chunk carries the last token's id in the
   `token_ids` extension so per-token accounting (trace/replay.py) still sees every token.
2. A reply cut (max_tokens, a stop token) inside a multi-byte UTF-8 character ends with
   its last complete character, never U+FFFD, streamed or not: the demo byte-level BPE
   splits emoji, CJK and the euro sign into several tokens, so cutting after each token
   hits the middle of characters.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from janusd.engine.sequence import Sequence
from janusd.engine.tokenizer import REPLACEMENT_CHAR as FFFD
from janusd.engine.tokenizer import IncrementalDetokenizer, Tokenizer
from janusd.engine.types import SamplingParams
from janusd.wire.worker_msgs import TokenDelta

TEXT = "ok 🙂 東京 costs 5€, très bien 🚀!"
EOS = 2  # <|im_end|> of the demo tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    """The byte-level BPE of the demo checkpoints and of engine_fixtures' tiny checkpoints."""
    from janusd.engine.checkpoint.demo import train_tokenizer

    return Tokenizer(train_tokenizer(512), bos_token="<|endoftext|>", eos_token="<|im_end|>")


def _cuts(tok: Tokenizer, ids: list[int]) -> list[int]:
    """Output lengths k whose text ends inside a character (decoding ids[:k] ends in U+FFFD)."""
    return [k for k in range(1, len(ids) + 1) if tok.decode(ids[:k]).endswith(FFFD)]


def _complete_prefix(tok: Tokenizer, ids: list[int]) -> str:
    return tok.decode(ids).rstrip(FFFD)


def _seq(tok: Tokenizer, params: SamplingParams) -> Sequence:
    prompt = tok.encode("Say it: ")
    return Sequence("r", prompt, params, 0, IncrementalDetokenizer(tok, prompt[-6:]), [EOS], 1024, None)


def test_the_text_splits_characters_across_tokens(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert len(_cuts(tok, ids)) >= 5  # the test below would prove nothing otherwise
    assert EOS not in ids and tok.eos_token_ids == [EOS]


@pytest.mark.parametrize("stop", [[], ["zzz"], ["€€"]])
def test_max_tokens_inside_a_character_ends_with_the_last_whole_one(tok: Tokenizer, stop: list[str]) -> None:
    """Every cut: no delta holds U+FFFD, and the text is the longest complete prefix (with
    stop strings that never match, which hold back text that could start one)."""
    ids = tok.encode(TEXT)
    for k in range(1, len(ids) + 1):
        seq = _seq(tok, SamplingParams(max_tokens=k, stop=stop))
        deltas = [seq.append_token(t) for t in ids[:k]]
        assert seq.finish_reason == "length"
        assert not any(FFFD in d for d in deltas), (k, deltas)
        text = "".join(deltas)
        assert text == _complete_prefix(tok, ids[:k]), k
        assert TEXT.startswith(text)


def test_stop_token_after_half_a_character_drops_the_half(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    other = next(t for t in range(EOS + 1, 512) if t not in ids)
    for k in _cuts(tok, ids):
        for stop_id, params in ((EOS, SamplingParams(max_tokens=100)),
                                (other, SamplingParams(max_tokens=100, stop_token_ids=[other]))):
            seq = _seq(tok, params)
            deltas = [seq.append_token(t) for t in [*ids[:k], stop_id]]
            assert seq.finish_reason == "stop" and seq.num_output == k + 1
            assert not any(FFFD in d for d in deltas)
            assert "".join(deltas) == _complete_prefix(tok, ids[:k])


class _Detok:
    """A detokenizer whose second token holds "€" and the first byte of another character."""

    def add(self, t: int) -> str:
        return "ax" if t == 10 else ""

    def flush(self) -> str:
        return "€" + FFFD


def test_characters_released_at_the_end_still_meet_the_stop_strings() -> None:
    for stop, want, reason in ((["x€"], "a", "stop"), (["zz"], "ax€", "length")):
        seq = Sequence("r", [1], SamplingParams(max_tokens=2, stop=stop), 0, _Detok(), [EOS], 64, None)
        deltas = [seq.append_token(10), seq.append_token(11)]
        assert "".join(deltas) == want and seq.finish_reason == reason


def test_a_character_completed_by_the_last_token_is_kept(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    seq = _seq(tok, SamplingParams(max_tokens=len(ids)))
    assert "".join(seq.append_token(t) for t in ids) == TEXT


# ---- the engine itself: ModelEngine._advance on a tiny checkpoint, tokens scripted ----

@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine_fixtures import write_hf_checkpoint
    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine

    d, _ = write_hf_checkpoint(tmp_path_factory.mktemp("ck") / "qwen2", "qwen2", seed=3)
    de = DeviceEngine(kind="cpu", memory_bytes=32 << 20, page_size=64 << 10, kv_cache_pages=(0, 0))
    me = de.load_model(ModelConfig(name="m", checkpoint=str(d), kv_cache_mib=1, max_model_len=128),
                       EngineConfig(block_size=4, max_num_batched_tokens=256, max_num_seqs=4))
    yield me
    de.unload_model("m")


def _scripted(monkeypatch: pytest.MonkeyPatch, script: list[int]) -> None:
    """The engine's sampler answers with `script`, one token per sampled row."""
    import janusd.engine.runner as runner

    it = iter(script)
    monkeypatch.setattr(runner, "sample", lambda logits, reqs: [(next(it), None) for _ in reqs])


def test_engine_cut_by_max_tokens_or_eos_inside_a_character(engine: Any, tok: Tokenizer,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ids = tok.encode(TEXT)
    assert engine.eos_token_ids == [EOS]
    prompt = tok.encode("Say it: ")
    for k in _cuts(tok, ids)[:4]:
        _scripted(monkeypatch, ids[:k])
        outs = engine.generate({"a": prompt}, SamplingParams(max_tokens=k, temperature=0.0))["a"]
        assert [t for o in outs for t in o.token_ids] == ids[:k]
        assert outs[-1].finished and outs[-1].finish_reason == "length"
        assert not any(FFFD in o.text for o in outs)
        assert "".join(o.text for o in outs) == _complete_prefix(tok, ids[:k])

        _scripted(monkeypatch, [*ids[:k], EOS])
        outs = engine.generate({"b": prompt}, SamplingParams(max_tokens=k + 5, temperature=0.0))["b"]
        assert outs[-1].token_ids == [EOS] and outs[-1].finish_reason == "stop"
        assert not any(FFFD in o.text for o in outs)
        assert "".join(o.text for o in outs) == _complete_prefix(tok, ids[:k])


# ---- the SSE shapes: api.py against a fake daemon that replays given deltas ----

class _FakeDaemon:
    started_wall = 0.0

    def __init__(self, deltas: list[TokenDelta]) -> None:
        from janusd.config import DEFAULT_CONFIG_TOML, parse_config

        self.cfg = parse_config(DEFAULT_CONFIG_TOML)
        self.deltas = deltas

    def admit(self, p: Any, request_id: str = "") -> Any:
        q: asyncio.Queue[Any] = asyncio.Queue()
        for d in self.deltas:
            q.put_nowait(d)
        n = sum(len(d.token_ids) for d in self.deltas)
        return SimpleNamespace(prompt_ids=[5, 6, 7], num_output_tokens=n, done=True), q

    def cancel(self, req: Any) -> None:
        pass


def _post(deltas: list[TokenDelta], path: str, body: dict[str, Any]) -> list[bytes]:
    """The SSE `data:` lines of one request to api.py serving `deltas`."""
    import aiohttp

    from janusd.server.api import start_http

    async def go() -> list[bytes]:
        runner, port = await start_http(_FakeDaemon(deltas), "127.0.0.1", 0)  # type: ignore[arg-type]
        try:
            async with aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{port}{path}", json=body) as r:
                assert r.status == 200
                return [line.strip() for line in (await r.read()).split(b"\n") if line.startswith(b"data:")]
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def _chunks(lines: list[bytes]) -> list[dict[str, Any]]:
    assert lines[-1] == b"data: [DONE]"
    return [json.loads(x[5:]) for x in lines[:-1]]


EOS_END = [TokenDelta(1, [40], "He"), TokenDelta(1, [41], ""), TokenDelta(1, [42], "llo"),
           TokenDelta(1, [EOS], "", True, "stop", 3, 4)]
LENGTH_END = [TokenDelta(1, [40], "He"), TokenDelta(1, [41], ""), TokenDelta(1, [42], "llo", True, "length", 3, 3)]


@pytest.mark.parametrize("deltas", [EOS_END, LENGTH_END], ids=["eos", "length"])
def test_chat_stream_has_no_empty_content_chunk_and_every_token_id(deltas: list[TokenDelta]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}}
    lines = _post(deltas, "/v1/chat/completions", body)
    chunks = _chunks(lines)
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(deltas)
    choices = [c["choices"][0] for c in chunks]
    assert choices[0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["delta"].get("content") != "" for c in choices[1:]), choices
    assert "".join(c["delta"].get("content", "") for c in choices) == "Hello"
    # OpenAI's ending: a last chunk with delta {} and the finish_reason; only it has one
    assert choices[-1]["delta"] == {} and choices[-1]["finish_reason"] == deltas[-1].finish_reason
    assert all(c["finish_reason"] is None for c in choices[:-1])
    # every token id exactly once, in order; the EOS id rides on the final chunk
    assert [t for c in choices for t in c.get("token_ids", [])] == [t for d in deltas for t in d.token_ids]
    assert len(choices) == 5  # role, "He", {} (held back), "llo", final: no chunk of its own for EOS
    if deltas is EOS_END:
        assert choices[-1]["token_ids"] == [EOS]
    else:
        assert "token_ids" not in choices[-1]


@pytest.mark.parametrize("deltas", [EOS_END, LENGTH_END], ids=["eos", "length"])
def test_completion_stream_ends_with_one_finish_chunk_the_replayer_counts(deltas: list[TokenDelta]) -> None:
    from janusd.trace.replay import _Stream

    body = {"model": "m", "prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
    lines = _post(deltas, "/v1/completions", body)
    chunks = _chunks(lines)
    usage = chunks.pop()
    choices = [c["choices"][0] for c in chunks]
    assert "".join(c["text"] for c in choices) == "Hello"
    # "He", "" (the held-back token's id), "llo", the final chunk (with the EOS id if any)
    assert len(choices) == 4
    assert choices[-1]["text"] == "" and choices[-1]["finish_reason"] == deltas[-1].finish_reason
    assert [t for c in choices for t in c.get("token_ids", [])] == [t for d in deltas for t in d.token_ids]
    assert usage["usage"]["completion_tokens"] == len(deltas)
    st = _Stream(0.0)
    for line in lines:
        st.feed(line, 1.0)
    assert st.done and st.error is None and len(st.token_times()) == len(deltas)
    assert len(st.times) == len(deltas)  # counted from the chunks, not padded from usage


# ---- end to end: a real daemon serving a demo model ----

@pytest.fixture(scope="module")
def daemon() -> Any:
    from daemon_harness import server_section, start_daemon

    models = """
[[models]]
name = "demo-llama"
checkpoint = "demo:llama-tiny"
ttft_slo_ms = 1000.0
tpot_slo_ms = 100.0
kv_cache_mib = 32
devices = [0]
"""
    d = start_daemon(server_section(Path("@RUN@")) + "[devices]\ncount = 1\nmemory_mib = 256\n" + models)
    yield d
    assert d.stop() == 0, d.log_text()


def _stream_lines(d: Any, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    conn.request("POST", path, json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()[:300]
    raw = resp.read().decode()
    conn.close()
    lines = [x for x in raw.split("\n\n") if x.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(x[len("data: "):]) for x in lines[:-1]]


def test_daemon_cut_inside_a_character_and_stop_token_chunks(daemon: Any) -> None:
    from daemon_harness import SHARED_CACHE
    from janusd.engine.loader import open_checkpoint

    dtok = open_checkpoint(SHARED_CACHE / "demo" / "llama-tiny").tokenizer
    # seeded sampling over a random model: a reproducible stream of mostly odd bytes
    base = {"model": "demo-llama", "prompt": "once upon a time", "temperature": 1.0, "seed": 7, "ignore_eos": True}
    chunks = _stream_lines(daemon, "/v1/completions", {**base, "max_tokens": 48})
    ids = [t for c in chunks if c["choices"] for t in c["choices"][0].get("token_ids", [])]
    assert len(ids) == 48
    cuts = _cuts(dtok, ids)
    assert cuts, dtok.decode(ids)
    for k in cuts[:3]:
        want = _complete_prefix(dtok, ids[:k])
        st, _, full = daemon.http("POST", "/v1/completions", {**base, "max_tokens": k})
        assert st == 200 and full["choices"][0]["finish_reason"] == "length"
        assert full["choices"][0]["text"] == want
        got = _stream_lines(daemon, "/v1/completions", {**base, "max_tokens": k})
        assert "".join(c["choices"][0]["text"] for c in got if c["choices"]) == want
        assert dtok.decode(ids[:k]).endswith(FFFD) and not want.endswith(FFFD)

    # a stop token id (the same path as EOS): its token has no text, and no chunk says ""
    chat = {"model": "demo-llama", "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0,
            "seed": 7, "max_tokens": 48}
    first = _stream_lines(daemon, "/v1/chat/completions", {**chat, "ignore_eos": True})
    cids = [t for c in first if c["choices"] for t in c["choices"][0].get("token_ids", [])]
    j = next(i for i in range(1, len(cids)) if cids[i] not in cids[:i])
    got = _stream_lines(daemon, "/v1/chat/completions", {**chat, "ignore_eos": True, "stop_token_ids": [cids[j]]})
    usage = got.pop()["usage"]
    choices = [c["choices"][0] for c in got]
    assert usage["completion_tokens"] == j + 1
    assert choices[-1]["delta"] == {} and choices[-1]["finish_reason"] == "stop"
    assert choices[-1]["token_ids"] == [cids[j]]
    assert all(c["delta"].get("content") != "" for c in choices[1:])
    assert [t for c in choices for t in c.get("token_ids", [])] == cids[: j + 1]

"""Errors on the worker's request path are never swallowed (engine/worker_proc.py,
engine/worker_tokenize.py): an abort that raises after a failed step is logged and
counted while every other request is still failed and freed; only the client's input
errors are answered as 400, a tokenizer bug is an internal error, logged and counted;
the counts reach the daemon in Stats.errors.

A real DeviceEngine and WorkerProc in process; faults are injected only where the engine
or the checkpoint's tokenizer would fail on their own (a step, an abort, an encode).
"""

from __future__ import annotations

import socket
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from janusd.config import EngineConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.tokenizer import Tokenizer
from janusd.engine.worker_log import Caught
from janusd.engine.worker_proc import WorkerProc
from janusd.engine.worker_tokenize import tokenize
from janusd.wire import worker_msgs as wm
from janusd.wire.framing import BlockingFramedSocket
from worker_frames import sent_frames

CACHE = Path(tempfile.gettempdir()) / "janusd-test-cache"
SPEC = wm.SamplingSpec(max_tokens=6, temperature=0.0, ignore_eos=True)


def _engine(*names: str) -> DeviceEngine:
    de = DeviceEngine(memory_bytes=32 << 20, page_size=64 << 10)
    for n in names:
        de.load_model(ModelConfig(name=n, checkpoint="demo:llama-tiny", kv_cache_mib=1, max_model_len=128),
                      EngineConfig(block_size=4), CACHE)
    return de


def _sent(a, b):  # type: ignore[no-untyped-def]
    return sent_frames(a, b)


def test_a_failed_step_fails_and_frees_every_request_even_when_one_abort_raises(capsys):
    de = _engine("a", "b")
    a_end, d_end = socket.socketpair()
    wp = WorkerProc(BlockingFramedSocket(a_end), de, 0, "cpu")
    ma, mb = de.models["a"], de.models["b"]
    for rid, model in ((1, "a"), (2, "b"), (3, "a")):
        wp._handle(wm.Generate(rid, model, [5, 6, 7, 8, 9], SPEC))
    wp._step()  # a real step: every request prefilled, its KV held
    assert ma.kv.alloc.num_used > 0 and mb.kv.alloc.num_used > 0

    real_abort = ma.abort

    def abort(req_id: str) -> bool:  # the engine's abort of request 1 fails (after the step it may be broken)
        if req_id == "1":
            raise RuntimeError("abort broke")
        return real_abort(req_id)

    def step() -> list:
        raise RuntimeError("step broke")

    ma.abort, de.step = abort, step
    wp._step()
    assert ma.num_requests() == 1 and "1" in ma.seqs  # its abort failed: what the count warns of
    assert mb.num_requests() == 0 and mb.kv.alloc.num_used == 0  # the neighbours are freed all the same
    assert wp.req_model == {}
    err = capsys.readouterr().err
    assert "aborting request 1 of a failed; its KV pages may stay held" in err
    assert "RuntimeError: abort broke" in err  # with its traceback

    del de.step  # the engine works again: the worker serves on
    ma.abort = real_abort
    wp._handle(wm.Generate(4, "b", [3, 4, 5], SPEC))
    while de.has_work():
        wp._step()
    wp._handle(wm.GetStats(9))
    sent = _sent(a_end, d_end)
    failed = {m.req_id: m.kind for m in sent if isinstance(m, wm.RequestFailed)}
    assert failed == {1: "internal", 2: "internal", 3: "internal"}
    tokens_4 = [t for m in sent if isinstance(m, wm.StepBatch) for o in m.outputs if o.req_id == 4 for t in o.token_ids]
    assert len(tokens_4) == 6
    stats = [m for m in sent if isinstance(m, wm.Stats)]
    assert len(stats) == 1 and stats[0].errors == {"abort": 1}


class _BrokenTokenizer:
    """A checkpoint's tokenizer with a bug: it raises on any text (not the client's fault)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        raise self.error

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        raise self.error


# a checkpoint's chat template that rejects what the client sent (as real ones do)
STRICT = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('the conversation must start with the "
          "user') }}{% endif %}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def backend() -> Any:
    de = _engine("m")
    return de.models["m"].tokenizer.backend


@pytest.mark.parametrize("bug", [RuntimeError("merges table out of range"), TypeError("bad argument"),
                                 KeyError("vocab")], ids=lambda e: type(e).__name__)
def test_only_the_clients_input_is_a_400_and_a_tokenizer_bug_is_internal_and_counted(backend, bug, capsys):
    models = {"strict": SimpleNamespace(tokenizer=Tokenizer(backend, chat_template=STRICT)),
              "plain": SimpleNamespace(tokenizer=Tokenizer(backend)),
              "broken": SimpleNamespace(tokenizer=_BrokenTokenizer(bug))}
    caught = Caught()
    user = [wm.ChatMessage("user", "hello there")]

    ok = tokenize(models, wm.Tokenize(1, "strict", messages=user), caught)
    assert isinstance(ok, wm.Tokenized) and ok.token_ids == backend.encode(
        "<|user|>hello there<|assistant|>", add_special_tokens=False).ids
    refused = {
        2: tokenize(models, wm.Tokenize(2, "strict", messages=[wm.ChatMessage("assistant", "hi")]), caught),
        3: tokenize(models, wm.Tokenize(3, "plain", messages=user), caught),
        4: tokenize(models, wm.Tokenize(4, "strict"), caught),
    }
    assert {s: (r.kind, r.req_id) for s, r in refused.items()} == {s: ("bad_request", s) for s in refused}
    assert "the conversation must start with the user" in refused[2].message
    assert "no chat template" in refused[3].message
    assert "neither a prompt nor messages" in refused[4].message
    assert caught.counts() == {}  # the client's mistakes are not errors of ours

    bad = tokenize(models, wm.Tokenize(5, "broken", prompt="hello"), caught)
    assert isinstance(bad, wm.RequestFailed) and bad.kind == "internal" and bad.req_id == 5
    assert "internal error while tokenizing" in bad.message and type(bug).__name__ in bad.message
    assert caught.counts() == {"tokenize": 1}
    err = capsys.readouterr().err
    assert "tokenizing a prompt for broken failed" in err and f"{type(bug).__name__}: " in err  # the traceback

    again = tokenize(models, wm.Tokenize(6, "strict", prompt="hello there"), caught)  # the neighbour serves on
    assert isinstance(again, wm.Tokenized) and again.token_ids == backend.encode("hello there").ids
    gone = tokenize(models, wm.Tokenize(7, "elsewhere", prompt="hi"), caught)  # a move raced the message
    assert isinstance(gone, wm.RequestFailed) and gone.kind == "unavailable" and caught.counts() == {"tokenize": 1}


def test_the_reader_thread_answers_a_tokenizer_bug_as_internal_and_stats_count_it():
    de = _engine("a", "b")
    de.models["a"].tokenizer = _BrokenTokenizer(RuntimeError("tokenizer bug"))
    a_end, d_end = socket.socketpair()
    wp = WorkerProc(BlockingFramedSocket(a_end), de, 0, "cpu")
    conn, dec = BlockingFramedSocket(d_end), wm.from_worker_decoder()
    reader = threading.Thread(target=wp.reader, daemon=True)
    reader.start()
    replies = []
    for seq, model in ((1, "a"), (2, "b"), (3, "a")):
        conn.send(wm.Tokenize(seq, model, prompt="once upon a time"))
        replies.append(dec.decode(conn.recv()))
    assert [(type(r).__name__, getattr(r, "kind", None)) for r in replies] == [
        ("RequestFailed", "internal"), ("Tokenized", None), ("RequestFailed", "internal")]
    assert replies[1].token_ids == de.models["b"].tokenizer.encode("once upon a time", add_special_tokens=True)
    conn.send(wm.GetStats(4))
    wp._handle(wp.inbox.get(timeout=10))
    stats = dec.decode(conn.recv())
    assert isinstance(stats, wm.Stats) and stats.errors == {"tokenize": 2}
    d_end.close()  # the daemon goes: the reader ends the worker
    reader.join(10)
    assert not reader.is_alive() and isinstance(wp.inbox.get(timeout=1), wm.Shutdown)

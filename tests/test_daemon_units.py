"""Pure parts of the daemon: wire messages and framing, the prefill estimator, the
systemd notify protocol (against a real datagram socket), placement, request parsing."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import tempfile

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from janusd.config import EngineConfig, LifecycleConfig, ModelConfig
from janusd.server import sdnotify
from janusd.policy.pinned import place
from janusd.server.openai_types import ApiError, parse_chat, parse_completion
from janusd.oracle.prefill_estimate import PrefillEstimator
from janusd.wire import admin_msgs as am
from janusd.wire import worker_msgs as wm
from janusd.wire.framing import MAX_FRAME_BYTES, BlockingFramedSocket, FrameError, encode_frame, read_frame

ENC = msgspec.msgpack.Encoder()

TO_WORKER = [
    wm.LoadModel(1, wm.WorkerModel.of(ModelConfig(name="m", checkpoint="demo:llama-tiny", devices=[1])),
                 wm.WorkerEngine.of(EngineConfig()), "/c", wm.WorkerLifecycle.of(LifecycleConfig())),
    wm.UnloadModel(2, "m"),
    wm.Tokenize(3, "m", prompt="hi"),
    wm.Tokenize(4, "m", messages=[wm.ChatMessage("user", "hé")]),
    wm.Generate(5, "m", [1, 2, 3], wm.SamplingSpec(max_tokens=4, temperature=0.0, seed=7, stop=["x"])),
    wm.Abort(6),
    wm.GetStats(7),
    wm.Shutdown(),
    wm.ImportKV(9, "m", wm.SamplingSpec(max_tokens=8, seed=3), wm.KVExport(
        req_id="9", model="m", block_size=16, block_bytes=4096, dtype="float32", block_ids=[3, 4],
        global_offsets=[[(0, 4096)], [(2093056, 4096)]], num_cached_tokens=20, prompt_len=20,
        token_ids=list(range(21)), page_ids=[0, 1], rng_state=b"\x00\x01"), "127.0.0.1:1234", 1 << 40),
]
FROM_WORKER = [
    wm.Ready(10, 0, "cpu"),
    wm.ModelLoaded(1, "m", 2048, 0.5, [2]),
    wm.ModelUnloaded(2, "m"),
    wm.Tokenized(3, [5, 6]),
    wm.Stats(7, {"free_pages": 3}, ["m"], 1, 1),
    wm.ErrorReply(8, "no", "bad_request"),
    wm.StepBatch([wm.TokenDelta(5, [9], "a", True, "length", 3, 1, 0.01, [-0.5])]),
    wm.RequestFailed(5, "bad", "unavailable"),
    wm.KVReady(9, wm.KVExport(req_id="9", model="m", block_size=16, block_bytes=64, dtype="bfloat16",
                              block_ids=[0], global_offsets=[[(0, 32), (2 << 20, 32)]], num_cached_tokens=3,
                              prompt_len=3, token_ids=[1, 2, 3, 4]), "127.0.0.1:1", 140000000000000),
    wm.KVImported(9, 8192, 0.002),
]


@pytest.mark.parametrize("msg", TO_WORKER)
def test_to_worker_messages_round_trip(msg):
    assert wm.to_worker_decoder().decode(ENC.encode(msg)) == msg


@pytest.mark.parametrize("msg", FROM_WORKER)
def test_from_worker_messages_round_trip(msg):
    assert wm.from_worker_decoder().decode(ENC.encode(msg)) == msg


def test_a_message_of_the_other_direction_is_refused():
    with pytest.raises(msgspec.ValidationError):
        wm.to_worker_decoder().decode(ENC.encode(wm.Ready(1, 0, "cpu")))
    with pytest.raises(msgspec.ValidationError):
        am.request_decoder().decode(ENC.encode(wm.Abort(1)))


def test_frames_are_compact_arrays():
    # array_like: a one-token delta is a positional array of a few bytes, not a dict
    body = ENC.encode(wm.StepBatch([wm.TokenDelta(5, [9], "a")]))
    assert len(body) < 30
    tag, deltas = msgspec.msgpack.decode(body)
    assert tag == "StepBatch" and deltas[0][:3] == [5, [9], "a"]


def test_blocking_framing_over_a_socketpair():
    a, b = socket.socketpair()
    with a, b:
        fa, fb = BlockingFramedSocket(a), BlockingFramedSocket(b)
        for m in TO_WORKER:
            fa.send(m)
        dec = wm.to_worker_decoder()
        assert [dec.decode(fb.recv()) for _ in TO_WORKER] == TO_WORKER
        a.sendall(struct.pack(">I", MAX_FRAME_BYTES + 1))
        with pytest.raises(FrameError):
            fb.recv()
    c, d = socket.socketpair()
    with d:
        c.sendall(struct.pack(">I", 10) + b"abc")  # a peer dying mid-frame reads as EOF
        c.close()
        assert BlockingFramedSocket(d).recv() is None


def test_async_read_frame_eof_and_truncation():
    async def go():
        r = asyncio.StreamReader()
        r.feed_data(encode_frame(ENC, wm.Abort(3)) + struct.pack(">I", 9) + b"xy")
        r.feed_eof()
        assert wm.to_worker_decoder().decode(await read_frame(r)) == wm.Abort(3)
        with pytest.raises(asyncio.IncompleteReadError):
            await read_frame(r)
        r2 = asyncio.StreamReader()
        r2.feed_eof()
        assert await read_frame(r2) is None

    asyncio.run(go())


@given(
    a=st.floats(0.0, 0.5), b=st.floats(0.0, 0.01),
    xs=st.lists(st.integers(1, 4000), min_size=2, max_size=30).filter(lambda v: len(set(v)) > 1),
)
def test_estimator_recovers_a_noiseless_line(a, b, xs):
    e = PrefillEstimator(decay=1.0)
    for x in xs:
        e.observe(x, a + b * x)
    fa, fb = e.coefficients()
    assert fa == pytest.approx(a, abs=1e-6)
    assert fb == pytest.approx(b, abs=1e-9)
    assert e.estimate(1000) == pytest.approx(a + b * 1000, abs=1e-5)


def test_estimator_prior_and_single_length_and_bad_input():
    e = PrefillEstimator(prior_a_s=0.01, prior_b_s=0.001)
    assert e.estimate(100) == pytest.approx(0.11)
    e.observe(100, 0.22)  # one length seen: the prior's shape, scaled to the observation
    assert e.estimate(100) == pytest.approx(0.22)
    assert e.estimate(200) == pytest.approx(0.42)
    with pytest.raises(ValueError, match="bad observation"):
        e.observe(10, float("nan"))
    with pytest.raises(ValueError, match="decay"):
        PrefillEstimator(decay=0)


def test_sdnotify_sends_datagrams_to_the_notify_socket():
    path = os.path.join(tempfile.mkdtemp(), "n")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        s.settimeout(2)
        assert sdnotify.notify("READY=1\nSTATUS=x", {"NOTIFY_SOCKET": path})
        assert s.recv(100) == b"READY=1\nSTATUS=x"
    assert not sdnotify.notify("READY=1", {})
    assert not sdnotify.notify("READY=1", {"NOTIFY_SOCKET": path + "-missing"})
    name = f"jd-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(2)
        assert sdnotify.notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@" + name})
        assert s.recv(100) == b"WATCHDOG=1"


def test_watchdog_interval():
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "2000000"}) == 1.0
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}) == 1.0
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_interval_s({}) is None
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "junk"}) is None


def test_placement_follows_devices_and_spreads_the_rest():
    ms = [ModelConfig(name="a", checkpoint="x", devices=[1, 0, 1]), ModelConfig(name="b", checkpoint="x"),
          ModelConfig(name="c", checkpoint="x"), ModelConfig(name="d", checkpoint="x")]
    assert place(ms, 2) == {"a": [0, 1], "b": [0], "c": [1], "d": [0]}


def test_parse_completion_and_chat():
    p = parse_completion(b'{"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"stop":"x","seed":3,'
                         b'"slo":{"ttft_ms":200},"stream":true,"stream_options":{"include_usage":true},"user":"u"}')
    assert (p.prompt, p.sampling.max_tokens, p.sampling.temperature, p.sampling.stop) == ("hi", 5, 0.0, ["x"])
    assert (p.ttft_ms, p.tpot_ms, p.stream, p.include_usage, p.chat) == (200.0, None, True, True, False)
    assert parse_completion(b'{"model":"m","prompt":[1,2,3]}').prompt_ids == [1, 2, 3]
    c = parse_chat(b'{"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"a"},'
                   b'{"type":"text","text":"b"}]}],"max_completion_tokens":7}')
    assert c.messages == [wm.ChatMessage("system", "ab")] and c.sampling.max_tokens == 7 and c.max_tokens_given
    assert not parse_chat(b'{"model":"m","messages":[{"role":"user","content":"q"}]}').max_tokens_given
    with pytest.raises(ApiError) as e:
        parse_completion(b'{"model":"m","prompt":"hi","top_p":1.5}')
    assert (e.value.status, e.value.param) == (400, "top_p")
    with pytest.raises(ApiError) as e:
        parse_completion(b'{"model":"m","prompt":"hi","min_tokens":9,"max_tokens":3}')
    assert e.value.param == "min_tokens"


def test_serve_print_config_applies_flag_overrides(tmp_path):
    import subprocess
    import sys

    from janusd.config import parse_config

    out = subprocess.run([sys.executable, "-m", "janusd.cli", "serve", "--print-config", "--port", "9123",
                          "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    cfg = parse_config(out.stdout)
    assert (cfg.server.host, cfg.server.port) == ("0.0.0.0", 9123)
    assert [m.name for m in cfg.models] == ["smollm2-135m-instruct", "demo-llama", "demo-qwen2"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nport = 'x'\n")
    out = subprocess.run([sys.executable, "-m", "janusd.cli", "serve", "--config", str(bad)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "server.port" in out.stderr


def test_a_failing_assignment_does_not_lose_the_rest_of_the_tick():
    from core_fakes import Rig

    from janusd.config import DispatchConfig

    rig = Rig(devices=1, dispatch=DispatchConfig(plan="window"))  # one tick assigns all three
    rig.model("m", [0])
    rig.activate("m", 0)
    w = rig.workers[0]
    real_send = w.send

    def send(msg):
        if getattr(msg, "req_id", None) == 1:
            raise OverflowError("can't serialize ints > 2**64 - 1")
        return real_send(msg)

    w.send = send
    rids = [rig.submit("m", ttft_ms=100_000) for _ in range(3)]
    rig.core.tick(rig.now)
    assert rids == [1, 2, 3] and w.generates() == [2, 3]
    assert rig.core.requests.by_id.get(1) is None and rig.events[1][0].status == 500
    assert rig.core.queue_length("m") == 0
    rig.core.check_integrity()


def test_cancelling_an_assigned_request_counts_as_cancelled_and_frees_its_epdt():
    from core_fakes import Rig

    rig = Rig(devices=1)
    rig.model("m", [0])
    rig.activate("m", 0)
    rid = rig.submit("m", ttft_ms=100_000)
    rig.core.tick(rig.now)
    inst = rig.core.instance("m", 0)
    assert rig.workers[0].generates() == [rid] and rig.core.dispatch.epdt(inst, rig.now) > rig.now
    rig.core.cancel(rig.core.requests.by_id[rid], rig.now)  # the client left before the first token
    st = rig.core.dispatch.stats()
    assert st["cancelled"] == 1 and st["completed"] == 0 and st["in_flight"] == 0
    assert rig.core.dispatch.epdt(inst, rig.now) == rig.now
    rig.core.check_integrity()


def test_a_request_tokenized_while_its_model_was_removed_is_refused_not_queued():
    from core_fakes import Rig

    from janusd.core.requests import Failure
    from janusd.lifecycle.states import InstanceState

    rig = Rig(devices=1)
    rig.model("m", [0])
    rig.activate("m", 0)
    rid = rig.submit_text("m", "hello")  # the worker tokenizes it...
    for inst in list(rig.core.registry.models["m"].instances.values()):  # ...while `ctl remove` unloads
        rig.core.set_state(inst, InstanceState.DRAINING, rig.now)
        rig.core.set_state(inst, InstanceState.UNLOADED, rig.now)
    rig.core.remove_model("m", rig.now)  # and forgets the model
    rig.tokenized(0, rid)  # its tokens come late
    (f,) = rig.events[rid]
    assert isinstance(f, Failure) and f.status == 404 and f.code == "model_not_found"
    assert rig.core.dispatch.pending("m") == 0 and rig.core.requests.count() == 0


def test_the_daemon_side_never_imports_the_engine_or_torch():
    # DESIGN.md: server/ talks to workers only through wire/; torch lives in worker processes
    import subprocess
    import sys

    code = ("import sys, janusd.serve_cli, janusd.ctl_cli, janusd.server.daemon, janusd.server.api, "
            "janusd.server.admin, janusd.server.model_ops; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'janusd.engine'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_client_that_leaves_while_queued_leaves_nothing_behind():
    from core_fakes import Rig

    from janusd.core.requests import Failure
    from janusd.lifecycle.states import InstanceState

    rig = Rig(devices=1)
    rig.model("m", [0])  # no instance is Active: the request waits (held) in its model's queue
    rid = rig.submit("m")
    req = rig.core.requests.by_id[rid]
    assert rig.core.queue_length("m") == 1 and rig.core.requests.count() == 1
    idle: list[bool] = []
    rig.core.obs.idle = lambda: idle.append(True)
    rig.core.cancel(req, rig.now)  # what the HTTP handler does when its client goes away
    assert rig.core.queue_length("m") == 0 and rig.core.requests.count() == 0 and idle == [True]
    assert list(rig.core.held) == []
    assert isinstance(rig.events[rid][0], Failure) and req.failure.code == "cancelled"
    rig.core.check_integrity()



def test_server_modules_import_each_other_without_a_circle():
    """DESIGN.md: api.py and admin.py name what they need of the daemon as Protocols; only
    daemon.py sees the whole daemon, so the import graph of server/ has no cycle."""
    import ast
    from pathlib import Path

    import janusd.server

    root = Path(janusd.server.__file__).parent
    graph: dict[str, set[str]] = {}
    for f in root.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("janusd.server."):
                    deps.add(node.module.split(".")[2])
                elif node.module == "janusd.server":
                    deps.update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".")[2] for a in node.names if a.name.startswith("janusd.server."))
        graph[f.stem] = deps - {f.stem}
    assert "daemon" not in set().union(*(d for m, d in graph.items() if m != "daemon"))
    seen: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        if seen.get(m) == 1:
            raise AssertionError(f"import circle: {' -> '.join(path + [m])}")
        if seen.get(m) == 2:
            return
        seen[m] = 1
        for d in graph.get(m, ()):
            visit(d, path + [m])
        seen[m] = 2

    for m in graph:
        visit(m, [])

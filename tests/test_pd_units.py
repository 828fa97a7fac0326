"""P/D pieces that need no processes: its config rules, the decode routing policy
(policy/decode_route.py) against a brute-force reference, and the Scheduler keeping
prefill work off decode instances while routing handoffs by backlog (core/, fake workers)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from janusd.config import ConfigError, DispatchConfig, parse_config
from janusd.policy.decode_route import DecodeLoad, least_decode_backlog
from worker_frames import sent_frames

BASE = "[devices]\ncount = 3\n[[models]]\nname = 'm'\ncheckpoint = 'demo:llama-tiny'\n"


@pytest.mark.parametrize("extra, message", [
    ("role = 'prefill'\n", "models[0].role: 'prefill' alone leaves no instance to decode"),
    ("devices = [0, 1]\nprefill_devices = [2]\n", "models[0].prefill_devices: [2] not in devices"),
    ("devices = [0, 1]\nprefill_devices = [0, 1]\n", "at least one device in devices must be left to decode"),
    ("devices = [0, 1]\nprefill_devices = [0]\nrole = 'decode'\n", "leave role at 'mixed'"),
])  # fmt: skip
def test_pd_config_mistakes_name_the_key(extra, message):
    with pytest.raises(ConfigError, match="prefill|role") as e:
        parse_config(BASE + extra, "t.toml")
    assert message in str(e.value) and "t.toml" in str(e.value)


def test_a_pd_model_config_is_accepted():
    cfg = parse_config(BASE + "devices = [0, 1, 2]\nprefill_devices = [0]\n")
    assert cfg.models[0].prefill_devices == [0] and cfg.models[0].role == "mixed"


loads = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 50)), max_size=6).map(
    lambda xs: [DecodeLoad(i + 1, s, t) for i, (s, t) in enumerate(xs)]
)


@given(loads)
def test_least_decode_backlog_is_the_brute_force_minimum(xs):
    pick = least_decode_backlog(xs)
    if not xs:
        assert pick is None
        return
    # reference: an instance no other beats on (sequences, then tokens, then id)
    best = [x for x in xs if all((x.sequences, x.token_budget, x.instance_id) <= (y.sequences, y.token_budget,
                                                                                 y.instance_id) for y in xs)]
    assert [b.instance_id for b in best] == [pick]
    for perm in itertools.islice(itertools.permutations(xs), 6):  # order of the candidates does not matter
        assert least_decode_backlog(list(perm)) == pick


def test_the_core_sends_prefill_work_only_to_prefill_instances_and_hands_off_by_backlog():
    from core_fakes import Rig

    from janusd.lifecycle.states import InstanceState

    from janusd.config import DispatchConfig

    rig = Rig(devices=3, dispatch=DispatchConfig(plan="window"))  # one tick assigns the whole burst
    rig.model("m", [0, 1, 2], prefill_devices=[0])
    for d in (0, 1, 2):
        rig.activate("m", d)
    for _ in range(6):
        rig.submit("m", ttft_ms=100_000)
    rig.tick()
    assert len(rig.workers[0].generates()) == 6
    assert rig.workers[1].generates() == [] and rig.workers[2].generates() == []
    # each handoff goes to the least loaded decode instance; loads as the core records them
    picks = []
    for rid, budget in ((1, 100), (2, 50), (3, 10), (4, 10)):
        t = rig.core._decode_target("m")
        assert t is not None
        t.decoding[rid] = budget
        picks.append(t.device)
    assert picks == [1, 2, 2, 1]  # (0,0)->1; (1,0)->2; (1,1) tie on sequences, 50 < 100 -> 2; (1,2)->1
    d1, d2 = rig.core.instance("m", 1), rig.core.instance("m", 2)
    rig.core.set_state(d1, InstanceState.DRAINING, rig.now)
    rig.core.set_state(d2, InstanceState.LOADING, rig.now)
    assert rig.core._decode_target("m") is d1  # only a draining one is left: it still takes handoffs
    rig.core.set_state(d1, InstanceState.UNLOADED, rig.now)
    assert rig.core._decode_target("m") is None
    assert rig.core.queue_length("m") == 0


# ---- the core's side of a handoff (core/kv_handoff.py), real objects, fake workers ----


def _pd_rig():
    from core_fakes import Rig

    from janusd.server.metrics import Metrics

    rig = Rig(devices=2)
    metrics = Metrics(lambda: {**rig.core.snapshot(rig.now), "workers": {}, "pools": {}})
    rig.core.obs.kv_transfer = metrics.kv_transfer
    rig.model("m", [0, 1], prefill_devices=[0])
    rig.activate("m", 0)
    rig.activate("m", 1)
    return rig, rig.core.instance("m", 1), metrics


def _prefilled(rig):
    """A request whose first token came from the prefill worker (device 0)."""
    rid = rig.submit("m", tokens=3, max_tokens=8)
    rig.tick()
    rig.token(0, rid)
    return rig.core.requests.by_id[rid]


def _kv(rid: int):
    from janusd.wire import worker_msgs as wm

    return wm.KVExport(req_id=str(rid), model="m", block_size=16, block_bytes=4096, dtype="float32", block_ids=[3],
                       global_offsets=[[(12288, 4096)]], num_cached_tokens=3, prompt_len=3, token_ids=[5, 6, 7, 9])


def test_a_handoff_that_cannot_be_sent_counts_one_failed_transfer():
    from janusd.wire import worker_msgs as wm

    rig, dec, metrics = _pd_rig()
    req = _prefilled(rig)
    rig.workers[1].up = False  # the decode worker is not running: the send fails
    rig.core.on_kv(0, wm.KVReady(req.rid, _kv(req.rid), "127.0.0.1:1", 1 << 30), rig.now)
    assert req.failed and req.failure.status == 503 and "decode worker for device 1" in req.failure.message
    assert dec.decoding == {}
    assert rig.workers[0].aborts() == [req.rid]  # the prefill side's blocks are freed
    get = metrics.registry.get_sample_value
    assert get("janusd_kv_transfers_total", {"model": "m", "outcome": "failed"}) == 1.0


def test_a_client_leaving_during_a_transfer_counts_as_cancelled_not_failed():
    from janusd.wire import worker_msgs as wm

    rig, dec, metrics = _pd_rig()
    req = _prefilled(rig)
    rig.core.on_kv(0, wm.KVReady(req.rid, _kv(req.rid), "127.0.0.1:1", 1 << 30), rig.now)  # ImportKV sent
    assert dec.decoding == {req.rid: 7} and req.device == 1 and req.kv_source == 0
    rig.core.cancel(req, rig.now)
    assert req.failed and dec.decoding == {}
    get = metrics.registry.get_sample_value
    assert get("janusd_kv_transfers_total", {"model": "m", "outcome": "cancelled"}) == 1.0
    assert get("janusd_kv_transfers_total", {"model": "m", "outcome": "failed"}) is None


def test_a_failure_report_from_the_prefill_worker_after_the_handoff_does_not_end_the_request():
    """After KVImported the request decodes on device 1; the prefill worker may still report
    it failed (its engine failed before the daemon's Abort reached it): that is stale."""
    from janusd.wire import worker_msgs as wm

    rig, dec, _ = _pd_rig()
    req = _prefilled(rig)
    rig.core.on_kv(0, wm.KVReady(req.rid, _kv(req.rid), "127.0.0.1:1", 1 << 30), rig.now)
    rig.core.on_kv(1, wm.KVImported(req.rid, 4096, 0.001), rig.now)  # handed off and imported
    assert req.kv_source is None and dec.decoding == {req.rid: 7}
    rig.core.on_failed(0, wm.RequestFailed(req.rid, "the engine failed during a step", "internal"), rig.now)
    assert not req.done and req.rid in rig.core.requests.by_id
    rig.core.on_failed(1, wm.RequestFailed(req.rid, "KV cache exhausted", "unavailable"), rig.now)
    assert req.failed and req.failure.status == 503 and dec.decoding == {}


# ---- the worker's side (engine/worker.py + worker_pd.py), a real engine in process ----


def test_an_engine_failure_while_kv_bytes_arrive_frees_the_blocks_only_after_the_transfer(tmp_path):
    """A step failure fails every request of the worker; an import whose bytes are still
    being written must keep its blocks until the transfer thread is done with them (else a
    new request reuses them under the write), and the late result must not crash the loop."""
    import socket

    from engine_fixtures import write_hf_checkpoint
    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.runner import SamplingParams
    from janusd.engine.worker_proc import WorkerProc
    from janusd.engine.worker_pd import Imported
    from janusd.wire import worker_msgs as wm
    from janusd.wire.framing import BlockingFramedSocket

    ck = str(write_hf_checkpoint(tmp_path / "ck", "llama", seed=0)[0])
    de = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10)
    eng = EngineConfig(block_size=4, max_num_batched_tokens=24, max_num_seqs=8)
    p = de.load_model(ModelConfig(name="p", checkpoint=ck, kv_cache_mib=1, max_model_len=128, role="prefill"), eng)
    dm = de.load_model(ModelConfig(name="d", checkpoint=ck, kv_cache_mib=1, max_model_len=128, role="decode"), eng)
    spec = wm.SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True)
    p.add_request("7", list(range(30, 43)), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    while p.has_work():
        p.step()
    kv = p.export_kv("7")
    a, b = socket.socketpair()
    wp = WorkerProc(BlockingFramedSocket(a), de, 0, "cpu")
    wp.pd.transport = "none: this test plays the transfer thread"  # start_import queues, nothing reads
    wp._handle(wm.ImportKV(7, "d", spec, kv, "127.0.0.1:1", 1 << 30))
    held = dm.kv.alloc.num_used
    assert held == 4 and dm.num_requests() == 1
    wp._fail_all("the engine failed during a step (see the worker log)")  # what _step does on an exception
    assert dm.kv.alloc.num_used == held  # still being written: not free for reuse yet
    wp._handle(Imported(7, "d", "", 4 * kv.block_bytes, 0.01))  # the transfer thread is done
    assert dm.num_requests() == 0 and dm.kv.alloc.num_used == 0
    a.close()
    rx, dec = BlockingFramedSocket(b), wm.from_worker_decoder()
    sent = []
    while (body := rx.recv()) is not None:
        sent.append(dec.decode(body))
    assert [type(m).__name__ for m in sent] == ["RequestFailed"] and sent[0].req_id == 7


def test_a_decode_role_model_outside_pd_loads_without_a_transfer_engine(tmp_path):
    """role = "decode" without prefill_devices serves whole requests and is never sent KV:
    it must not need Mooncake (which moves host memory only, so on a GPU device the load
    would fail) nor start one; a P/D model's instance does start it."""
    import socket

    from engine_fixtures import write_hf_checkpoint
    from janusd.config import EngineConfig, LifecycleConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.worker_proc import WorkerProc
    from janusd.wire import worker_msgs as wm
    from janusd.wire.framing import BlockingFramedSocket

    ck = str(write_hf_checkpoint(tmp_path / "ck", "llama", seed=0)[0])
    a, b = socket.socketpair()
    wp = WorkerProc(BlockingFramedSocket(a), DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10), 0, "cpu")
    cfg = ModelConfig(name="d", checkpoint=ck, kv_cache_mib=1, max_model_len=128, role="decode")
    wp._handle(wm.LoadModel(1, wm.WorkerModel.of(cfg), wm.WorkerEngine.of(EngineConfig(block_size=4)), "",
                            wm.WorkerLifecycle.of(LifecycleConfig())))
    wp._handle(wp.inbox.get(timeout=60))  # the loader thread's result
    assert "d" in wp.de.models and wp.pd.transport is None
    a.close()
    body = BlockingFramedSocket(b).recv()
    assert isinstance(wm.from_worker_decoder().decode(body), wm.ModelLoaded)


@pytest.mark.parametrize("devices", [[1, 2], [0]])
def test_ctl_load_of_a_pd_model_on_other_devices_keeps_its_prefill_and_decode_split(devices):
    """`janus ctl load m --devices ...` of a config P/D model: devices that drop its prefill
    devices (no instance takes prefill work) or leave none to decode are refused up front."""
    import asyncio

    from janusd.server import model_ops
    from janusd.server.daemon import Daemon

    d = Daemon(parse_config(BASE + "devices = [0, 1, 2]\nprefill_devices = [0]\n"))
    with pytest.raises(ValueError, match=r"devices: 'm' is a P/D model with prefill_devices \[0\]"):
        asyncio.run(model_ops.load_model(d.ops, d.config, "m", None, devices))
    assert d.core.registry.models == {} and d.core.registry.instances == {}


def test_an_unload_waits_for_kv_bytes_arriving_without_stalling_the_worker(tmp_path):
    """UnloadModel while a transfer still writes into the model's blocks: the main thread
    must not block on it (the other models here keep stepping); the unload is applied,
    and answered, once the transfer thread is done with those blocks."""
    import socket
    import time

    from engine_fixtures import write_hf_checkpoint
    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.runner import SamplingParams
    from janusd.engine.worker_proc import WorkerProc
    from janusd.wire import worker_msgs as wm
    from janusd.wire.framing import BlockingFramedSocket

    ck = str(write_hf_checkpoint(tmp_path / "ck", "llama", seed=0)[0])
    de = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10)
    eng = EngineConfig(block_size=4, max_num_batched_tokens=24, max_num_seqs=8)
    p = de.load_model(ModelConfig(name="p", checkpoint=ck, kv_cache_mib=1, max_model_len=128, role="prefill"), eng)
    dm = de.load_model(ModelConfig(name="d", checkpoint=ck, kv_cache_mib=1, max_model_len=128, role="decode"), eng)
    p.add_request("7", list(range(30, 43)), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    while p.has_work():
        p.step()
    a, b = socket.socketpair()
    wp = WorkerProc(BlockingFramedSocket(a), de, 0, "cpu")
    wp.pd.transport = "none: this test plays the transfer thread"
    spec = wm.SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True)
    wp._handle(wm.ImportKV(7, "d", spec, p.export_kv("7"), "127.0.0.1:1", 1 << 30))
    wp._handle(wm.Abort(7))  # the daemon ends the request, then unloads the model
    t0 = time.monotonic()
    wp._handle(wm.UnloadModel(5, "d"))
    assert time.monotonic() - t0 < 1.0  # not blocked on the transfer
    assert "d" in de.models and dm.kv.alloc.num_used == 4  # the bytes may still land there
    wp.pd._job_done(7, "d", "", 4 * dm.kv.block_bytes, 0.01)  # what the transfer thread does at the end
    while not wp.inbox.empty():
        wp._handle(wp.inbox.get_nowait())
    assert "d" not in de.models and "p" in de.models
    a.close()
    rx, dec = BlockingFramedSocket(b), wm.from_worker_decoder()
    sent = []
    while (body := rx.recv()) is not None:
        sent.append(dec.decode(body))
    assert [type(m).__name__ for m in sent] == ["ModelUnloaded"] and sent[0].seq == 5


def _decode_worker_with_a_full_region(tmp_path, timeout_s: float):
    """A worker whose decode model's KV blocks are all taken, and a prefilled request's KV."""
    import socket

    from engine_fixtures import write_hf_checkpoint
    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.runner import SamplingParams
    from janusd.engine.worker_proc import WorkerProc
    from janusd.wire.framing import BlockingFramedSocket

    ck = str(write_hf_checkpoint(tmp_path / "ck", "llama", seed=0)[0])
    de = DeviceEngine(memory_bytes=16 << 20, page_size=64 << 10)
    eng = EngineConfig(block_size=4, max_num_batched_tokens=24, max_num_seqs=8, kv_wait_timeout_s=timeout_s)
    p = de.load_model(ModelConfig(name="p", checkpoint=ck, kv_cache_mib=1, max_model_len=128, role="prefill"), eng)
    dm = de.load_model(ModelConfig(name="d", checkpoint=ck, kv_cache_mib=1, max_model_len=128, role="decode"), eng)
    p.add_request("7", list(range(30, 43)), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    while p.has_work():
        p.step()
    held = []
    while (got := dm.kv.allocate(1)) is not None:  # other requests hold every block of "d"
        held += got
    a, b = socket.socketpair()
    wp = WorkerProc(BlockingFramedSocket(a), de, 0, "cpu")
    wp.pd.transport = "none: this test plays the transfer thread"
    return wp, dm, p.export_kv("7"), held, a, b


def _sent(a, b):  # type: ignore[no-untyped-def]
    return sent_frames(a, b)


def test_an_import_without_free_blocks_waits_for_them_then_proceeds(tmp_path):
    """KV blocks on the decode side are held by other requests: the import waits (no error,
    the first token already reached the client) and starts once blocks come back."""
    from janusd.engine.worker_pd import Imported
    from janusd.wire import worker_msgs as wm

    wp, dm, kv, held, a, b = _decode_worker_with_a_full_region(tmp_path, 30.0)
    spec = wm.SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True)
    wp._handle(wm.ImportKV(7, "d", spec, kv, "127.0.0.1:1", 1 << 30))
    assert len(wp.pd._parked) == 1 and dm.num_requests() == 0
    wp._retry_parked()
    assert len(wp.pd._parked) == 1  # still no room
    dm.kv.free(held)  # the holders finish
    wp._retry_parked()
    assert wp.pd._parked == [] and dm.num_requests() == 1 and dm.kv.alloc.num_used == len(kv.block_ids)
    wp._handle(Imported(7, "d", "", len(kv.block_ids) * kv.block_bytes, 0.01))
    assert [type(m).__name__ for m in _sent(a, b)] == ["KVImported"]


def test_an_import_that_waits_too_long_fails_as_unavailable_and_an_abort_ends_the_wait(tmp_path):
    import time

    from janusd.wire import worker_msgs as wm

    wp, dm, kv, held, a, b = _decode_worker_with_a_full_region(tmp_path, 0.1)
    spec = wm.SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True)
    wp._handle(wm.ImportKV(7, "d", spec, kv, "127.0.0.1:1", 1 << 30))
    wp._handle(wm.ImportKV(8, "d", spec, kv, "127.0.0.1:1", 1 << 30))
    wp._handle(wm.Abort(8))  # the client left while it waited: it leaves quietly
    time.sleep(0.12)
    wp._retry_parked()
    assert wp.pd._parked == [] and wp.req_model == {} and dm.num_requests() == 0
    sent = _sent(a, b)
    assert [(type(m).__name__, m.req_id, m.kind) for m in sent] == [("RequestFailed", 7, "unavailable")]
    assert "after waiting" in sent[0].message and "no room" in sent[0].message
    dm.kv.free(held)
    assert dm.kv.alloc.num_used == 0


def test_a_newer_import_does_not_overtake_an_older_one_waiting_for_blocks(tmp_path):
    """Import 7 waits for blocks. Blocks for one import come back just as import 8 arrives
    (messages are handled before parked imports are retried): 8 must queue behind 7, not
    take the blocks, or a steady stream of newer imports starves 7 until its timeout.
    Once 7 has started, 8 follows when blocks come back again."""
    from janusd.wire import worker_msgs as wm

    wp, dm, kv, held, a, b = _decode_worker_with_a_full_region(tmp_path, 30.0)
    spec = wm.SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True)
    wp._handle(wm.ImportKV(7, "d", spec, kv, "127.0.0.1:1", 1 << 30))
    assert [p.msg.req_id for p in wp.pd._parked] == [7]
    n = len(kv.block_ids)
    dm.kv.free(held[:n])  # room for exactly one import
    wp._handle(wm.ImportKV(8, "d", spec, kv, "127.0.0.1:1", 1 << 30))
    wp._retry_parked()
    assert [p.msg.req_id for p in wp.pd._parked] == [8] and set(dm.seqs) == {"7"}
    dm.kv.free(held[n : 2 * n])
    wp._retry_parked()
    assert wp.pd._parked == [] and set(dm.seqs) == {"7", "8"} and dm.kv.alloc.num_used == len(held)
    assert _sent(a, b) == []


def test_imports_queued_behind_an_older_one_still_time_out(tmp_path):
    import time

    from janusd.wire import worker_msgs as wm

    wp, dm, kv, held, a, b = _decode_worker_with_a_full_region(tmp_path, 0.1)
    spec = wm.SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True)
    wp._handle(wm.ImportKV(7, "d", spec, kv, "127.0.0.1:1", 1 << 30))
    wp._handle(wm.ImportKV(8, "d", spec, kv, "127.0.0.1:1", 1 << 30))
    wp._retry_parked()
    assert [p.msg.req_id for p in wp.pd._parked] == [7, 8]
    time.sleep(0.12)
    wp._retry_parked()
    assert wp.pd._parked == [] and wp.req_model == {} and dm.num_requests() == 0
    sent = _sent(a, b)
    assert [(type(m).__name__, m.req_id, m.kind) for m in sent] == [("RequestFailed", 7, "unavailable"),
                                                                    ("RequestFailed", 8, "unavailable")]
    assert all("after waiting" in m.message and "no room" in m.message for m in sent)
    dm.kv.free(held)

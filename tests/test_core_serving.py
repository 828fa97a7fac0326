"""The serving core driven without asyncio or sockets: a hand clock and fake workers
(the worker edge only). Integrity (every request in exactly one place) is checked after
every step by the rig."""

from __future__ import annotations

import pytest

from janusd.config import DispatchConfig
from janusd.core.requests import Failure, Refused
from janusd.core.serving import Limits, Submission
from janusd.lifecycle.states import IllegalTransition, InstanceState
from janusd.wire import worker_msgs as wm

from core_fakes import Rig

S = InstanceState


def test_a_request_for_a_model_with_no_active_instance_waits_and_is_served_when_one_comes():
    rig = Rig()
    rig.model("m", [0])
    rid = rig.submit("m", ttft_ms=500)
    assert [r.rid for r in rig.core.held] == [rid] and rig.core.queue_length("m") == 1
    rig.now += 5.0  # far past its TTFT deadline: held, not rejected
    rig.tick()
    assert rig.events[rid] == [] and rig.workers[0].generates() == []
    rig.activate("m", 0)
    rig.tick()
    assert rig.workers[0].generates() == [rid]
    rig.token(0, rid, finished=True)
    assert [type(e) for e in rig.events[rid]] == [wm.TokenDelta]
    assert rig.core.requests.count() == 0


def test_a_held_request_fails_with_retry_after_when_no_instance_comes_within_the_bound():
    rig = Rig(limits=Limits(model_wait_timeout_s=2.0))
    rig.model("m", [0])
    rid = rig.submit("m")
    wake = rig.tick()
    assert wake == pytest.approx(102.0)
    rig.now = 102.0
    rig.tick()
    (f,) = rig.events[rid]
    assert isinstance(f, Failure) and f.status == 503 and f.code == "model_not_ready" and f.retry_after_s == 1.0
    assert list(rig.core.held) == [] and rig.core.requests.count() == 0


def test_co_located_models_share_one_epdt_per_device():
    """Model a's prefill work on device 0 delays model b's instance on the same device:
    a request of b that fits only on an idle device goes to device 1, not device 0."""
    rig = Rig()
    rig.model("a", [0])
    rig.model("b", [0, 1])
    for name, d in (("a", 0), ("b", 0), ("b", 1)):
        rig.activate(name, d)
    # a's long prompt: 10 ms + 0.5 ms * 1980 = 1.0 s of prefill on device 0
    ra = rig.submit("a", tokens=1980, ttft_ms=5000)
    rig.tick()
    assert rig.workers[0].generates() == [ra]
    b0 = rig.core.instance("b", 0)
    assert rig.core.dispatch.epdt(b0, rig.now) == pytest.approx(rig.now + 1.0)
    rb = rig.submit("b", tokens=10, ttft_ms=100)
    rig.tick()
    assert rig.workers[1].generates() == [rb] and rig.workers[0].generates() == [ra]


def test_a_burst_on_idle_instances_spreads_instead_of_30_0_0():
    rig = Rig(devices=3, dispatch=DispatchConfig(prepull_window_ms=20.0))
    rig.model("m", [0, 1, 2])
    for d in range(3):
        rig.activate("m", d)
    # 10 ms each (prior: 10 ms + 0.5 ms * 0 tokens... one token: 10.5 ms)
    rids = [rig.submit("m", tokens=1, ttft_ms=2000) for _ in range(30)]
    rig.tick()
    first = [len(rig.workers[d].generates()) for d in range(3)]
    assert all(n >= 1 for n in first), first
    assert sum(first) < 30  # the rest stays queued, re-planned as instances free up
    # run it: each worker finishes its oldest prefill after its estimate; tick at wake-ups
    done: set[int] = set()
    for _ in range(200):
        for d in range(3):
            pending = [r for r in rig.workers[d].generates() if r not in done]
            if pending:
                rig.token(d, pending[0], finished=True)
                done.add(pending[0])
        rig.now += 0.0105
        rig.tick()
        if len(done) == 30:
            break
    counts = [len(rig.workers[d].generates()) for d in range(3)]
    assert sum(counts) == 30 and max(counts) - min(counts) <= 2, counts
    assert all(isinstance(rig.events[r][-1], wm.TokenDelta) for r in rids)


@pytest.mark.parametrize("objective,second", [("requests", "s2"), ("tokens", "long")])
def test_under_overload_objective_tokens_serves_the_request_worth_more_tokens(objective, second):
    """One instance busy for 20 ms; three 20 ms prompts asking 1 token each and one 90 ms
    prompt asking 100, all due 140 ms after arrival: not all four fit. Counting requests
    keeps the three short ones; counting tokens keeps one short and the long one, so after
    the first short one the long one is sent, each request weighing its max_tokens."""
    rig = Rig(devices=1, dispatch=DispatchConfig(prepull_window_ms=5.0, objective=objective))
    rig.model("m", [0])
    rig.activate("m", 0)
    t0 = rig.now
    r0 = rig.submit("m", tokens=20, ttft_ms=1000)  # prior: 10 ms + 0.5 ms * 20 = 20 ms
    rig.tick()
    rids = {name: rig.submit("m", tokens=tok, max_tokens=mt, ttft_ms=140)
            for name, tok, mt in (("s1", 20, 1), ("s2", 20, 1), ("s3", 20, 1), ("long", 160, 100))}
    rig.tick()
    assert rig.workers[0].generates() == [r0]
    rig.now = t0 + 0.02
    rig.token(0, r0, finished=True, prefill_s=None)
    rig.tick()
    assert rig.workers[0].generates() == [r0, rids["s1"]]
    rig.now = t0 + 0.04
    rig.token(0, rids["s1"], finished=True, prefill_s=None)
    rig.tick()
    assert rig.workers[0].generates() == [r0, rids["s1"], rids[second]]


def test_worker_death_fails_its_requests_holds_the_queue_and_a_reload_serves_it():
    rig = Rig(devices=1)
    rig.model("m", [0])
    rig.activate("m", 0)
    r1 = rig.submit("m")
    rig.tick()
    assert rig.workers[0].generates() == [r1]
    rig.core.on_worker_death(0, rig.now)
    rig.core.check_integrity()
    (f,) = rig.events[r1]
    assert f.status == 503 and f.code == "worker_died"
    inst = rig.core.instance("m", 0)
    assert inst.state is S.LOADING and rig.core.dispatch.stats()["in_flight"] == 0
    r2 = rig.submit("m")
    rig.now += 3.0
    rig.tick()
    assert rig.events[r2] == [] and [r.rid for r in rig.core.held] == [r2]
    rig.core.loaded(inst, rig.now, 2048, 0.2)
    rig.tick()
    assert rig.workers[0].generates() == [r1, r2]


def test_unload_keeps_the_model_and_queued_requests_wait_for_the_next_load():
    rig = Rig(devices=1)
    rig.model("m", [0])
    rig.activate("m", 0)
    inst = rig.core.instance("m", 0)
    rig.core.set_state(inst, S.DRAINING, rig.now)
    rid = rig.submit("m")
    rig.tick()
    assert rig.workers[0].generates() == [] and rig.core.queue_length("m") == 1
    rig.core.set_state(inst, S.UNLOADED, rig.now)
    assert "m" in rig.core.registry.models
    rig.activate("m", 0)
    rig.tick()
    assert rig.workers[0].generates() == [rid]


def test_remove_ends_waiting_requests_with_404_and_forgets_the_model():
    rig = Rig(devices=1)
    rig.model("m", [0])
    rid = rig.submit("m")
    rig.core.remove_model("m", rig.now)
    (f,) = rig.events[rid]
    assert f.status == 404
    with pytest.raises(Refused) as e:
        rig.submit("m")
    assert e.value.failure.status == 404


def test_the_state_table_refuses_illegal_moves_and_names_the_current_state():
    rig = Rig(devices=1)
    rig.model("m", [0])
    inst = rig.core.instance("m", 0)
    with pytest.raises(IllegalTransition, match="is unloaded: cannot go active"):
        rig.core.set_state(inst, S.ACTIVE, rig.now)
    rig.activate("m", 0)
    with pytest.raises(IllegalTransition, match="is active: cannot go unloaded"):
        rig.core.set_state(inst, S.UNLOADED, rig.now)


def test_queue_limit_counts_held_requests_and_answers_429_with_retry_after():
    rig = Rig(devices=1, limits=Limits(queue_limit=2))
    rig.model("m", [0])
    rig.submit("m")
    rig.submit("m")
    with pytest.raises(Refused) as e:
        rig.submit("m")
    assert e.value.failure.status == 429 and e.value.failure.retry_after_s == 1.0


def test_a_cancelled_request_leaves_queue_and_epdt_and_is_aborted_on_its_worker():
    rig = Rig(devices=1)
    rig.model("m", [0])
    rig.activate("m", 0)
    rid = rig.submit("m", tokens=100)
    rig.tick()
    inst = rig.core.instance("m", 0)
    assert rig.core.dispatch.epdt(inst, rig.now) > rig.now
    rig.core.cancel(rig.core.requests.by_id[rid], rig.now)
    rig.core.check_integrity()
    assert rig.workers[0].aborts() == [rid]
    assert rig.core.dispatch.epdt(inst, rig.now) == rig.now


def test_telemetry_sees_arrivals_tokens_and_ends():
    rig = Rig(devices=1)
    rig.model("m", [0])
    rig.activate("m", 0)
    rid = rig.submit("m", tokens=20, max_tokens=3)
    rig.tick()
    rig.now += 0.05
    rig.token(0, rid)
    rig.token(0, rid)
    rig.token(0, rid, finished=True)
    w = rig.core.telemetry.model("m", rig.now)
    assert w.in_flight == 0 and w.finished == 1 and w.input_len_mean == 20 and w.output_len_mean == 3
    assert w.tokens_counted == 3 and w.tokens_on_time == 3
    assert w.ttft_mean_s == pytest.approx(0.05)


def test_a_request_no_instance_can_start_in_time_is_refused_at_admission_with_retry_after():
    rig = Rig(devices=1)
    rig.model("m", [0], max_model_len=8192)
    rig.activate("m", 0)
    long = rig.submit("m", tokens=3980, ttft_ms=10_000)  # 10 ms + 0.5 ms * 3980 = 2.0 s of prefill
    rig.tick()
    assert rig.workers[0].generates() == [long]
    rid = rig.submit("m", tokens=10, ttft_ms=500)  # the device is busy for 2 s: hopeless now
    (f,) = rig.events[rid]
    assert f.status == 503 and f.code == "slo_unattainable" and f.retry_after_s == 2.0
    assert rig.core.queue_length("m") == 0 and rig.core.dispatch.stats()["in_flight"] == 1
    rig.core.check_integrity()


def test_admission_queue_keeps_a_hopeless_request_until_its_latest_start():
    rig = Rig(devices=1, dispatch=DispatchConfig(admission="queue"))
    rig.model("m", [0], max_model_len=8192)
    rig.activate("m", 0)
    rig.submit("m", tokens=3980, ttft_ms=10_000)
    rig.tick()
    rid = rig.submit("m", tokens=10, ttft_ms=500)
    rig.tick()
    assert rig.events[rid] == [] and rig.core.queue_length("m") == 1
    rig.now += 0.6
    rig.tick()
    (f,) = rig.events[rid]
    assert f.status == 503 and f.code == "slo_unattainable"


def test_between_equally_free_instances_the_one_decoding_less_gets_the_request():
    """At light load every instance is free 'now': without the decode load as the tie-break
    every request went to the lowest id and one device decoded everything."""
    rig = Rig()
    rig.model("m", [0, 1])
    rig.activate("m", 0)
    rig.activate("m", 1)
    r1 = rig.submit("m", max_tokens=50)
    rig.tick()
    assert rig.workers[0].generates() == [r1]
    rig.token(0, r1)  # r1 is past its prefill: both instances are free again, device 0 decodes
    rig.now += 0.01
    r2 = rig.submit("m", max_tokens=50)
    rig.tick()
    assert rig.workers[1].generates() == [r2]
    rig.token(1, r2)
    rig.token(0, r1, finished=True)  # device 0 decodes nothing now, device 1 one sequence
    r3 = rig.submit("m", max_tokens=50)
    rig.tick()
    assert rig.workers[0].generates() == [r1, r3]


def test_an_omitted_max_tokens_is_capped_by_the_server_default_or_the_models_own():
    rig = Rig(devices=1, limits=Limits(default_max_tokens=100))
    rig.model("m", [0])
    rig.model("short", [0], default_max_tokens=7)
    for model, want in (("m", 100), ("short", 7)):
        req = rig.core.submit(Submission(model, wm.SamplingSpec(max_tokens=16), rig.now, False, list(range(10)),
                                         chat=True), rig.now, lambda ev: None)
        assert req.sampling.max_tokens == want
    small = Rig(devices=1, limits=Limits(default_max_tokens=5000))
    small.model("m", [0])  # context 2048: the cap never passes it
    req = small.core.submit(Submission("m", wm.SamplingSpec(), small.now, False, list(range(48))), small.now,
                            lambda ev: None)
    assert req.sampling.max_tokens == 2000


def test_the_decode_guard_keeps_new_prefills_off_a_device_decoding_slower_than_the_tpot_slo():
    rig = Rig()
    rig.model("m", [0, 1], tpot_slo_ms=50.0)
    rig.activate("m", 0)
    rig.activate("m", 1)
    r1 = rig.submit("m", max_tokens=100)
    rig.tick()
    assert rig.workers[0].generates() == [r1]
    rig.token(0, r1)
    for _ in range(5):  # device 0 decodes one sequence at 80 ms per token: over the 50 ms SLO
        rig.now += 0.08
        rig.token(0, r1)
    assert rig.core.guard.fit[0].step_s(2) > 0.05
    r2 = rig.submit("m", max_tokens=100)  # device 1 decodes nothing: it may always take work
    rig.tick()
    assert rig.workers[1].generates() == [r2]
    rig.token(1, r2)
    for _ in range(5):
        rig.now += 0.08
        rig.token(1, r2)
    r3 = rig.submit("m", max_tokens=5, ttft_ms=400)
    rig.tick()
    assert rig.core.instance("m", 0).saturated and rig.core.instance("m", 1).saturated
    assert rig.workers[0].generates() == [r1] and rig.workers[1].generates() == [r2]
    rig.token(0, r1, finished=True)  # device 0 drains: it takes the waiting request
    rig.tick()
    assert rig.workers[0].generates() == [r1, r3]


def test_the_decode_guard_follows_a_retuned_tpot_slo_with_nothing_else_changing():
    """Only devices marked changed are re-evaluated: a new TPOT SLO must mark its model's.
    (A tighter one: a sequence decoding keeps the SLO it was admitted with and bounds its
    device by it, tests/test_core_guard_classes.py, so loosening the model's SLO does not
    free a device that sequence still needs.)"""
    import msgspec

    rig = Rig(devices=1)
    rig.model("m", [0], tpot_slo_ms=500.0)
    rig.activate("m", 0)
    r1 = rig.submit("m", max_tokens=100)
    rig.tick()
    rig.token(0, r1)
    for _ in range(5):  # 80 ms per token with one sequence
        rig.now += 0.08
        rig.token(0, r1)
    rig.tick()
    assert not rig.core.instance("m", 0).saturated
    rig.core.retune(msgspec.structs.replace(rig.core.registry.models["m"].cfg, tpot_slo_ms=50.0))
    rig.tick()
    assert rig.core.instance("m", 0).saturated


def test_without_the_decode_guard_a_slow_device_still_takes_work():
    rig = Rig(devices=1, dispatch=DispatchConfig(decode_guard=False))
    rig.model("m", [0], tpot_slo_ms=50.0)
    rig.activate("m", 0)
    r1 = rig.submit("m", max_tokens=100)
    rig.tick()
    rig.token(0, r1)
    for _ in range(5):
        rig.now += 0.08
        rig.token(0, r1)
    r2 = rig.submit("m", max_tokens=5, ttft_ms=400)
    rig.tick()
    assert rig.workers[0].generates() == [r1, r2]


@pytest.mark.parametrize("waited", [False, True])
def test_a_request_that_waited_before_tokenizing_gets_a_fresh_ttft_budget_as_a_held_one_does(waited):
    """One rule for both waits ([U]): a text request held before it could be tokenized (no
    Active instance to tokenize on) gets a fresh TTFT budget once it is, as a tokenized
    request the core held does; one that did not wait keeps its arrival's deadline and,
    tokenized late (a slow worker), is refused as late."""
    rig = Rig()
    rig.model("m", [0])
    if not waited:
        rig.activate("m", 0)
    rid = rig.submit_text("m", "hello", ttft_ms=500.0)
    rig.now += 5.0  # 5 s pass (a wake, or a slow tokenizer), past its 500 ms SLO
    if waited:
        assert rig.core.held.count("m") == 1 and rig.workers[0].tokenizes() == []
        rig.activate("m", 0)
    assert rig.workers[0].tokenizes() == [rid] and rig.core.held.count("m") == 0
    rig.tokenized(0, rid)
    rig.tick()
    sink = rig.events[rid]
    if waited:
        assert rig.workers[0].generates() == [rid] and sink == []
    else:
        assert rig.workers[0].generates() == [] and isinstance(sink[-1], Failure) and sink[-1].status == 503


def test_a_drain_past_its_bound_ends_only_what_it_names_and_aborts_each_on_its_worker():
    """ServingCore.fail_requests: the one place a drain ends what is left (server/drain.py
    waits; this ends), for unload, remove, reload and state moves alike."""
    rig = Rig()
    rig.model("m", [0, 1])
    rig.activate("m", 0)
    rig.activate("m", 1)
    rids = [rig.submit("m") for _ in range(4)]
    rig.tick()
    on0 = [r for r in rig.core.requests.by_id.values() if r.device == 0]
    assert on0 and len(on0) < 4
    done = rig.core.fail_requests(on0 + on0[:1], Failure(503, "went warm", code="model_deactivated"), rig.now)
    assert done == len(on0)  # a request named twice ends once
    assert sorted(rig.workers[0].aborts()) == sorted(r.rid for r in on0) and rig.workers[1].aborts() == []
    for r in on0:
        assert isinstance(rig.events[r.rid][-1], Failure) and rig.events[r.rid][-1].code == "model_deactivated"
    assert rig.core.requests.count() == 4 - len(on0) and set(rig.core.requests.by_id) <= set(rids)


def test_removing_a_model_ends_its_held_requests_at_once():
    """[U] (b): a removal ends the requests the core holds for the model with 404 at once (not
    after model_wait_timeout_s), those still waiting to be tokenized included."""
    rig = Rig()
    rig.model("m", [0])
    rids = [rig.submit("m") for _ in range(3)] + [rig.submit_text("m", "hello")]
    assert rig.core.held.count("m") == 4
    rig.now += 0.5
    rig.core.remove_model("m", rig.now)
    assert rig.core.held.count("m") == 0 and rig.core.requests.count() == 0
    for rid in rids:
        assert isinstance(rig.events[rid][-1], Failure) and rig.events[rid][-1].status == 404


def test_the_views_a_shell_reads_agree_with_the_parts_they_read():
    """core/serving.py's views (the shells' whole read face, tests/test_shell_faces.py) say
    what the core's parts hold: requests per model and device, held ones, fits, instances."""
    rig = Rig()
    rig.model("a", [0, 1])
    rig.model("b", [1])
    rig.activate("a", 0)
    rig.activate("a", 1)
    core = rig.core
    ra = rig.submit("a", max_tokens=100)
    rb = rig.submit("b")  # no Active instance of b: held
    rig.tick()
    (on,) = [d for d in (0, 1) if ra in rig.workers[d].generates()]
    rig.token(on, ra)
    for _ in range(3):
        rig.now += 0.02
        rig.token(on, ra)
    assert core.in_flight() == 2 and core.in_flight("a") == core.in_flight("b") == 1
    assert core.held_count("b") == 1 and core.held_count("a") == 0
    assert core.request(ra).model == "a" and [r.rid for r in core.requests_of("a")] == [ra]
    assert [r.rid for r in core.requests_on(on)] == [ra] and core.requests_on(1 - on) == []
    assert core.device_load() == {on: 1} and core.device_load("a") == {on: 1} and core.device_load("b") == {}
    assert core.window("a", rig.now).in_flight == 1
    assert core.dispatch_stats() == core.snapshot(rig.now)["dispatch"]
    assert set(core.prefill_fits("a")) == {0, 1} and core.prefill_fits("b") == {}
    (tpot,) = core.decode_token_s("a")  # one device decodes, with a fit of its gaps
    assert tpot == pytest.approx(0.02, rel=0.2)
    assert set(core.models()) == {"a", "b"} and core.model("b") is core.models()["b"] and core.model("c") is None
    inst = core.instance("a", 0)
    assert core.holds(inst) and inst in core.instances_on(0) and core.epdt(inst, rig.now) is not None

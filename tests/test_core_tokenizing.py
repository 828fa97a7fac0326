"""[U] The core owns a request given as text from its arrival: it has a worker with an
Active instance tokenize it, holds it (and asks the shell to wake an instance) while none
is Active, maps each tokenizing failure to what the client gets, survives the tokenizing
worker's death and ends a request whose tokens never come. Fake workers at the edge and a
hand clock (tests/core_fakes.py); integrity is checked after every step."""

from __future__ import annotations

import pytest

from janusd.core.requests import Failure, Refused
from janusd.core.shell_hooks import Limits, Observers
from janusd.lifecycle.states import InstanceState
from janusd.wire import worker_msgs as wm

from core_fakes import Rig

S = InstanceState


def test_a_text_request_is_tokenized_on_an_active_worker_then_queued_and_served():
    rig = Rig()
    rig.model("m", [0, 1])
    rig.activate("m", 1)
    rid = rig.submit_text("m", "hello there", max_tokens=3)
    (msg,) = rig.workers[1].sent
    assert isinstance(msg, wm.Tokenize) and (msg.req_id, msg.model, msg.prompt) == (rid, "m", "hello there")
    assert rig.core.queue_length("m") == 1 and rig.workers[1].generates() == []
    rig.tokenized(1, rid, n=12)
    rig.tick()
    (gen,) = [m for m in rig.workers[1].sent if isinstance(m, wm.Generate)]
    assert gen.req_id == rid and gen.prompt_token_ids == list(range(12)) and gen.sampling.max_tokens == 3
    rig.token(1, rid, finished=True)
    assert rig.core.requests.count() == 0 and rig.core.queue_length("m") == 0


def test_a_text_request_for_a_resting_model_is_held_wakes_it_once_and_is_tokenized_when_it_is_active():
    woken: list[str] = []
    rig = Rig()
    rig.core.obs = Observers(wake=woken.append)
    rig.model("m", [0])
    rid = rig.submit_text("m", "hi")
    assert woken == ["m"] and rig.core.held.count("m") == 1 and rig.workers[0].sent == []
    assert rig.core.waiting_models() == ["m"]
    rig.now += 1.0
    rig.activate("m", 0)
    assert rig.workers[0].tokenizes() == [rid] and rig.core.held.count("m") == 0
    rig.tokenized(0, rid)
    rig.tick()
    assert rig.workers[0].generates() == [rid]


def test_a_request_given_as_ids_for_a_resting_model_also_asks_for_a_wake():
    """Before [U] only the shell's wait before tokenizing woke a model: a client's prompt of
    token ids for a Cold model waited out the whole bound."""
    woken: list[str] = []
    rig = Rig()
    rig.core.obs = Observers(wake=woken.append)
    rig.model("m", [0])
    rig.submit("m")
    assert woken == ["m"] and rig.core.held.count("m") == 1


@pytest.mark.parametrize("kind, status", [("bad_request", 400), ("internal", 500)])
def test_each_kind_of_tokenizing_failure_gets_its_status_and_the_neighbour_is_served(kind, status):
    rig = Rig(devices=1)
    rig.model("m", [0])
    rig.activate("m", 0)
    bad = rig.submit_text("m", "x")
    good = rig.submit_text("m", "y")
    rig.core.on_failed(0, wm.RequestFailed(bad, "boom", kind), rig.now)
    rig.core.check_integrity()
    (f,) = rig.events[bad]
    assert isinstance(f, Failure) and f.status == status and "boom" in f.message and f.retry_after_s is None
    assert (f.param == "prompt") == (status == 400)
    rig.tokenized(0, good)
    rig.tick()
    assert rig.workers[0].generates() == [good]


def test_a_worker_without_the_model_any_more_has_it_tokenized_elsewhere():
    rig = Rig()
    rig.model("m", [0, 1])
    rig.activate("m", 0)
    rig.activate("m", 1)
    rid = rig.submit_text("m", "x")
    first = 0 if rig.workers[0].tokenizes() else 1
    rig.core.set_state(rig.core.instance("m", first), S.DRAINING, rig.now)  # a scale-in raced it
    rig.core.on_failed(first, wm.RequestFailed(rid, "model 'm' is not loaded on this worker", "unavailable"),
                       rig.now)
    rig.core.check_integrity()
    assert rig.workers[1 - first].tokenizes() == [rid] and rig.events[rid] == []


def test_the_tokenizing_workers_death_sends_the_prompt_to_another_or_holds_it():
    rig = Rig()
    rig.model("m", [0, 1])
    rig.model("solo", [0])
    for name, d in (("m", 0), ("m", 1), ("solo", 0)):
        rig.activate(name, d)
    reqs = [rig.submit_text("m", f"p{i}") for i in range(4)]
    solo = rig.submit_text("solo", "alone")
    on0 = [r for r in reqs if r in rig.workers[0].tokenizes()]
    assert on0 and solo in rig.workers[0].tokenizes()
    rig.workers[0].up = False
    rig.core.on_worker_death(0, rig.now)
    rig.core.check_integrity()
    assert set(on0) <= set(rig.workers[1].tokenizes())  # tokenized again where the model still is
    assert rig.core.held.count("solo") == 1 and rig.events[solo] == []  # waits for its restart
    assert all(rig.events[r] == [] for r in reqs)


def test_tokens_that_never_come_end_the_request_with_503_after_the_bound():
    rig = Rig(devices=1, limits=Limits(tokenize_timeout_s=2.0))
    rig.model("m", [0])
    rig.activate("m", 0)
    rid = rig.submit_text("m", "x")
    assert rig.tick() == pytest.approx(rig.now + 2.0)
    rig.now += 2.0
    rig.tick()
    (f,) = rig.events[rid]
    assert isinstance(f, Failure) and f.status == 503 and f.retry_after_s == 1.0
    rig.tokenized(0, rid)  # late: ignored
    assert rig.core.requests.count() == 0 and rig.workers[0].generates() == []


def test_a_prompt_too_long_for_the_context_is_a_400_once_tokenized():
    rig = Rig(devices=1)
    rig.model("m", [0], max_model_len=64)
    rig.activate("m", 0)
    rid = rig.submit_text("m", "long", max_tokens=8)
    rig.tokenized(0, rid, n=60)
    (f,) = rig.events[rid]
    assert isinstance(f, Failure) and f.status == 400 and f.param == "max_tokens"
    fits = rig.submit_text("m", "short", max_tokens_given=False)
    rig.tokenized(0, fits, n=60)
    rig.tick()
    assert rig.core.requests.by_id[fits].sampling.max_tokens == 4 and rig.workers[0].generates() == [fits]


def test_a_cancelled_request_while_tokenizing_leaves_no_trace_and_its_tokens_are_ignored():
    rig = Rig(devices=1)
    rig.model("m", [0])
    rig.activate("m", 0)
    rid = rig.submit_text("m", "x")
    rig.core.cancel(rig.core.requests.by_id[rid], rig.now)
    rig.core.check_integrity()
    assert rig.core.queue_length("m") == 0
    rig.tokenized(0, rid)
    rig.tick()
    assert rig.workers[0].generates() == [] and rig.core.requests.count() == 0


def test_requests_being_tokenized_count_against_the_queue_limit():
    rig = Rig(devices=1, limits=Limits(queue_limit=2))
    rig.model("m", [0])
    rig.activate("m", 0)
    rig.submit_text("m", "a")
    rig.submit_text("m", "b")
    with pytest.raises(Refused) as e:
        rig.submit_text("m", "c")
    assert e.value.failure.status == 429


def test_a_request_for_an_unknown_model_is_refused_at_once():
    rig = Rig()
    with pytest.raises(Refused) as e:
        rig.submit_text("nope", "x")
    assert e.value.failure.status == 404 and rig.core.requests.count() == 0

"""The decode guard on a device shared by models of different SLO classes (issue 36's
mixed scenario): a new sequence slows every sequence decoding on the device, so the
tightest TPOT SLO among them bounds it, not only the new request's model's. Fake clock
and fake workers (core_fakes.Rig).

Found with `janus sim --scenario mixed` (bench/replay_sim.py): chat (TPOT 50 ms) and
batch (TPOT 100 ms) share both devices; the guard let the batch model take prefills while
the device decoded at 50-100 ms a token, so the chat sequences already decoding there
went late, and the chat instances, held at 50 ms, refused their own requests at their
latest start. Chat lost 1,461 of its 6,897 tokens to TPOT and 1,437 to refusals at 2x
(seed 11) while batch lost none."""

from __future__ import annotations

import pytest

from janusd.lifecycle.states import InstanceState

from core_fakes import Rig


def _chat_decoding_near_its_tpot(rig: Rig) -> list[int]:
    """Two chat sequences on device 0: 30 ms a token alone, 45 ms together, so a third
    sequence would make it ~60 ms: over chat's 50 ms, under batch's 100 ms."""
    a = rig.submit("chat", max_tokens=200)
    rig.tick()
    rig.token(0, a)
    for _ in range(6):
        rig.now += 0.030
        rig.token(0, a)
    b = rig.submit("chat", max_tokens=200)
    rig.tick()
    assert rig.workers[0].generates() == [a, b]  # 2 sequences: within 50 ms, chat takes it
    rig.token(0, b)
    for _ in range(12):
        rig.now += 0.045
        rig.token(0, a)
        rig.token(0, b)
    return [a, b]


def test_a_batch_prefill_is_held_off_a_device_whose_chat_sequences_it_would_make_late():
    rig = Rig(devices=1)
    rig.model("chat", [0], ttft_slo_ms=300.0, tpot_slo_ms=50.0)
    rig.model("batch", [0], ttft_slo_ms=2000.0, tpot_slo_ms=100.0)
    for m in ("chat", "batch"):
        rig.activate(m, 0)
    chats = _chat_decoding_near_its_tpot(rig)
    rig.tick()
    fit = rig.core.guard.fit[0]
    assert 0.050 < fit.step_s(3) < 0.100  # the premise: between the two classes' TPOT
    assert rig.core.instance("chat", 0).saturated
    # the batch model's own 100 ms would admit it (the rule before); the chat sequences' 50 ms does not
    assert rig.core.instance("batch", 0).saturated
    late = rig.submit("batch", tokens=10, max_tokens=20, ttft_ms=2000)
    rig.tick()
    assert rig.workers[0].generates() == chats
    # one chat sequence ends: two decoding again, within every class's TPOT: batch goes
    rig.token(0, chats[0], finished=True)
    rig.tick()
    assert not rig.core.instance("batch", 0).saturated
    assert rig.workers[0].generates() == chats + [late]


def test_the_tightest_class_is_counted_per_device_and_forgotten_when_it_ends():
    rig = Rig(devices=2)
    rig.model("chat", [0], ttft_slo_ms=300.0, tpot_slo_ms=50.0)
    rig.model("batch", [0, 1], ttft_slo_ms=2000.0, tpot_slo_ms=100.0)
    rig.activate("chat", 0)
    for d in (0, 1):
        rig.activate("batch", d)
    g = rig.core.guard
    assert g.tightest(0) == g.tightest(1) == float("inf")
    c = rig.submit("chat", max_tokens=3)
    rig.tick()
    rig.token(0, c)
    assert g.tightest(0) == pytest.approx(0.050) and g.tightest(1) == float("inf")
    rig.token(0, c)
    rig.token(0, c, finished=True)
    assert g.tightest(0) == float("inf") and g.decoding[0] == 0
    assert rig.core.instance("chat", 0).state is InstanceState.ACTIVE

"""A false refusal under light load (issue 36): the decode guard holds the only instance,
which is free and would finish the queued request's prefill in time, and its yield trade
declines, so the request is refused at its latest start. Fake clock and fake workers
(core_fakes.Rig).

Found on the real daemon at 0.7x (bench/RESULTS.md, [Q] session 4: 45 of 86 refusals at
0.7x late by under 5 ms with an instance free, every instance held) and in
`janus sim --scenario one` at 0.7x (round_robin/guarded seed 4: three requests refused
"late by 0.0 ms" with both instances free and held). The trade credited the request only
the tokens it would produce on time at the device's pace with one more sequence (a few,
on a device that would decode past its TPOT) against every remaining token of the
sequences the prefill's delay pushes off their curve; but the alternative to the yield
is a refusal, which loses all of the request's tokens."""

from __future__ import annotations

import pytest

from janusd.core import Refusal
from janusd.server.metrics import Metrics

from core_fakes import Rig

TPOT_S = 0.050
TTFT_S = 0.400


def _two_decoding(rig: Rig) -> tuple[int, int]:
    """Device 0 decodes `a` (loose: 400 ms TTFT, 200 tokens) and `b` (tight: a 50 ms TTFT,
    so a delay of one long prefill pushes it off its curve; 30 tokens) at 45 ms a token; one
    sequence decoded at 30 ms, so a third would make it ~60 ms: past the 50 ms TPOT."""
    a = rig.submit("m", max_tokens=200)
    rig.tick()
    rig.token(0, a)
    for _ in range(6):
        rig.now += 0.030
        rig.token(0, a)
    b = rig.submit("m", max_tokens=30, ttft_ms=50)
    rig.tick()
    rig.now += 0.010
    rig.token(0, b, prefill_s=None)
    for _ in range(6):
        rig.now += 0.045
        rig.token(0, a)
        rig.token(0, b)
    return a, b


def _wait(rig: Rig, a: int, b: int, c: int, until: float) -> None:
    """Tick at each wake-up the core asks for while `a` and `b` decode every 45 ms, until `c`
    is sent to the worker or has ended (or `until`)."""
    wake = rig.tick()
    token_at = rig.now + 0.045
    while c not in rig.workers[0].generates() and c in rig.core.requests.by_id and rig.now < until:
        if wake is not None and wake < token_at:
            rig.now = max(rig.now, wake)
        else:
            rig.now = token_at
            token_at += 0.045
            rig.token(0, a)
            rig.token(0, b)
        wake = rig.tick()


def _held() -> tuple[Rig, list[Refusal], int, int]:
    """One device whose instance of "m" the guard holds while `a` and `b` decode on it;
    the refusals the core reports."""
    rig = Rig(devices=1)
    refusals: list[Refusal] = []
    rig.core.obs.refused = refusals.append
    rig.model("m", [0], ttft_slo_ms=TTFT_S * 1000, tpot_slo_ms=TPOT_S * 1000)
    rig.activate("m", 0)
    a, b = _two_decoding(rig)
    rig.tick()
    return rig, refusals, a, b


def test_a_request_a_free_held_instance_can_start_in_time_is_not_refused():
    rig, refusals, a, b = _held()
    inst = rig.core.instance("m", 0)
    fit = rig.core.guard.fit[0]
    assert fit.step_s(2) < TPOT_S < fit.step_s(3)  # the premise: held, and two decode in time
    assert inst.saturated
    c = rig.submit("m", tokens=300, max_tokens=64)
    arrival = rig.now
    est = rig.core.dispatch.own_estimate(inst, 300)
    assert 0.1 < est < TTFT_S - 0.1  # a long prefill, that the free instance finishes well in time
    _wait(rig, a, b, c, arrival + TTFT_S)
    assert refusals == [], [r.line() for r in refusals]
    assert rig.workers[0].generates() == [a, b, c]
    assert rig.now + est <= arrival + TTFT_S + 1e-9  # started in time by the estimate
    assert rig.core.guard.declined == {}


def test_a_refusal_after_a_declined_yield_says_so():
    """The trade still declines where the delay costs more tokens than the request has
    (here 4 max_tokens against `b`'s remaining ones): the refusal record carries the
    declined yield's figures, and counts as the guard's, not as justified by the estimate."""
    rig, refusals, a, b = _held()
    c = rig.submit("m", tokens=300, max_tokens=4)
    arrival = rig.now
    _wait(rig, a, b, c, arrival + TTFT_S)
    (r,) = refusals
    assert (r.rid, r.stage, r.justified) == (c, "queue", "guard")
    d = r.declined
    assert d is not None and d.device == 0 and d.tokens == 4 and d.at_risk >= 4
    assert d.finish <= r.deadline == pytest.approx(arrival + TTFT_S)
    assert "declined to yield dev0" in r.line()
    assert c not in rig.core.guard.declined
    metrics = Metrics(dict)
    metrics.refused(r)
    assert metrics.registry.get_sample_value(
        "janusd_slo_refusals_total", {"model": "m", "stage": "queue", "justified": "guard"}) == 1.0

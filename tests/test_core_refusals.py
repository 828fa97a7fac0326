"""False refusals (issue 36): a request refused for its TTFT SLO must be one that no
instance could have finished in time by the estimate the refusal used, and every
refusal reports the figures it used. Fake clock and fake workers (core_fakes.Rig).

The false refusal found on a real daemon (bench dispatch-replay, 0.7x, two cpu devices):
the two devices' prefill fits differ about twofold (one worker stepped slower, or was
probed under contention), and the Dispatcher planned and refused by the *mean* of the
two. A 1042-token prompt was refused with "est 329.8 ms, deadline in 324.1 ms" while
device 0, free 76 ms from then, estimated it at 239 ms on itself: it would have been
done 8 ms early there by its own estimate."""

from __future__ import annotations

import pytest

from janusd.config import DispatchConfig
from janusd.core import Refusal
from janusd.lifecycle.states import InstanceState

from core_fakes import Rig

# probes as the worker times them at load (tokens, seconds); a + b * tokens fits them exactly
FAST = [(16, 0.010), (256, 0.070)]  # device 0: 6 ms + 0.25 ms/token -> 1000 tokens: 256 ms
SLOW = [(16, 0.030), (256, 0.210)]  # device 1: 18 ms + 0.75 ms/token -> 1000 tokens: 768 ms


def _two_speeds(admission: str = "reject_early", policy: str = "lst_imh") -> tuple[Rig, list[Refusal]]:
    rig = Rig(dispatch=DispatchConfig(admission=admission, policy=policy))  # type: ignore[arg-type]
    refusals: list[Refusal] = []
    rig.core.obs.refused = refusals.append
    rig.model("m", [0, 1], ttft_slo_ms=500.0, max_model_len=8192)
    for d, probe in ((0, FAST), (1, SLOW)):
        inst = rig.core.instance("m", d)
        rig.core.set_state(inst, InstanceState.LOADING, rig.now)
        rig.core.loaded(inst, rig.now, 8192, 0.1, probe)
    return rig, refusals


@pytest.mark.parametrize("admission", ["reject_early", "queue"])
def test_a_prompt_the_faster_device_can_prefill_in_time_is_served_there_not_refused(admission):
    """Both devices idle; 1000 tokens: 256 ms on device 0, 768 ms on device 1, their mean
    512 ms is past the 500 ms SLO. Device 0 can do it: it must get it."""
    rig, refusals = _two_speeds(admission)
    rid = rig.submit("m", tokens=1000, ttft_ms=500)
    rig.tick()
    assert refusals == [], [r.line() for r in refusals]
    assert rig.workers[0].generates() == [rid] and rig.workers[1].generates() == []
    assert rig.events[rid] == []  # nothing sent back yet: neither refused nor failed


def test_a_busy_fast_device_still_counts_when_it_frees_up_in_time():
    """Device 0 busy for ~100 ms, device 1 idle: 600 tokens take 156 ms on device 0 (done at
    ~256 ms) and 468 ms on device 1 (done at 468 ms), both in time; by their mean (312 ms)
    device 0 would end at ~412 ms. A 300 ms SLO: only device 0 makes it, by its own fit."""
    rig, refusals = _two_speeds()
    first = rig.submit("m", tokens=376, ttft_ms=5000)  # 100 ms on device 0
    rig.tick()
    assert rig.workers[0].generates() == [first]
    rid = rig.submit("m", tokens=600, ttft_ms=300)
    for _ in range(3):
        wake = rig.tick()
        if wake is None or rig.workers[0].generates()[-1] == rid:
            break
        rig.now = max(rig.now, wake)
    assert refusals == [], [r.line() for r in refusals]
    assert rig.workers[0].generates() == [first, rid]


def test_a_refusal_reports_the_estimate_the_deadline_and_each_instance():
    """Hopeless everywhere (3000 tokens: 756 ms on the faster device, SLO 500 ms): refused
    at admission, and the record carries what the refusal used, per instance."""
    rig, refusals = _two_speeds()
    rid = rig.submit("m", tokens=3000, ttft_ms=500)
    (f,) = rig.events[rid]
    assert f.status == 503 and f.code == "slo_unattainable"
    (r,) = refusals
    assert (r.rid, r.model, r.stage, r.tokens) == (rid, "m", "admission", 3000)
    assert r.deadline == pytest.approx(rig.now + 0.5)
    assert [i.device for i in r.instances] == [0, 1]
    assert [i.est_s for i in r.instances] == pytest.approx([0.006 + 0.00025 * 3000, 0.018 + 0.00075 * 3000])
    assert all(i.ready and i.given == 0 and i.epdt_s == 0.0 for i in r.instances)
    assert r.late_by_s is not None and r.late_by_s > 0  # justified by the estimate it used
    assert "refused request" in r.line() and "dev0" in r.line()


def test_a_prefill_ending_early_asks_the_shell_for_a_tick_while_work_waits():
    """The daemon ticks when asked, at the wake-up the last tick computed: one instance's
    prefill estimated at 400 ms ends after 100 ms, and the request planned behind it would
    wait 280 ms on an idle instance (and with a tight SLO reach its latest start and be
    refused). The core says a tick is wanted; with nothing queued it does not."""
    rig = Rig(devices=1)
    rig.model("m", [0])
    rig.activate("m", 0)
    first = rig.submit("m", tokens=780, ttft_ms=5000)  # prior: 10 ms + 0.5 ms * 780 = 400 ms
    rig.tick()
    second = rig.submit("m", tokens=10, ttft_ms=5000)
    wake = rig.tick()
    assert rig.workers[0].generates() == [first] and wake == pytest.approx(rig.now + 0.38)
    assert not rig.core.tick_wanted()
    rig.now += 0.1
    rig.token(0, first, prefill_s=0.1)
    assert rig.core.tick_wanted()
    rig.tick()
    assert rig.workers[0].generates() == [first, second]
    rig.token(0, second, prefill_s=0.01)
    assert not rig.core.tick_wanted()  # nothing queued


def _saturated(rig: Rig, device: int, rid: int) -> None:
    """`rid` decodes on `device` at 80 ms per token: over a 50 ms TPOT SLO, the guard holds it."""
    rig.token(device, rid)
    for _ in range(5):
        rig.now += 0.08
        rig.token(device, rid)


@pytest.mark.parametrize("yield_ms", [20.0, 0.0])
def test_the_decode_guard_yields_its_held_instance_to_a_request_at_its_latest_start(yield_ms):
    """The refusals left at 0.7x ([Q], bench/RESULTS.md): every instance of the model held by
    the decode guard until the queued request's latest start passed, then 503, while the
    held device had no prefill work at all. With the yield the request is started within
    `guard_yield_ms` of its latest start and finishes its prefill in time by the estimate;
    with the yield off (0, today's rule before the change) it is refused."""
    rig = Rig(devices=1, dispatch=DispatchConfig(guard_yield_ms=yield_ms))
    refusals: list[Refusal] = []
    rig.core.obs.refused = refusals.append
    rig.model("m", [0], tpot_slo_ms=50.0, ttft_slo_ms=400.0)
    rig.activate("m", 0)
    r1 = rig.submit("m", max_tokens=100)
    rig.tick()
    _saturated(rig, 0, r1)
    r2 = rig.submit("m", tokens=10, max_tokens=5)
    arrival = rig.now
    wake = rig.tick()
    assert rig.core.instance("m", 0).saturated and rig.workers[0].generates() == [r1]
    while wake is not None and wake <= arrival + 1.0 and r2 not in rig.workers[0].generates():
        rig.now = max(rig.now, wake)
        wake = rig.tick()
        if rig.core.requests.by_id.get(r2) is None:
            break
    est = rig.core.requests.by_id[r2].est_prefill_s if r2 in rig.core.requests.by_id else 0.0
    if yield_ms:
        assert rig.workers[0].generates() == [r1, r2] and refusals == []
        assert rig.now + est <= arrival + 0.4 + 1e-9  # on time by the estimate
        assert rig.now >= arrival + 0.4 - est - yield_ms / 1000 - 1e-9  # not before it had to
        rig.tick()  # the next tick holds the instance again
        assert rig.core.instance("m", 0).saturated
    else:
        assert rig.workers[0].generates() == [r1] and len(refusals) == 1 and refusals[0].stage == "queue"

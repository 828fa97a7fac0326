"""The online Dispatcher (janusd._native.Dispatcher): EPDT numbers, the pre-pull window,
reject vs relax, readiness, and no request lost or assigned twice under random events."""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis import event
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from janusd._native import Dispatcher

STAT_KEYS = {"submitted", "assigned", "completed", "rejected", "relaxed", "cancelled", "pending"}


def test_epdt_is_work_given_minus_work_done() -> None:
    d = Dispatcher(plan="window")  # both jobs at once (global: only what starts in the window)
    d.add_instance(7, "m")
    assert d.epdt(7, 1.0) == 1.0  # idle: EPDT is now
    d.submit(1, "m", 0.0, 1.0, 0.1)
    d.submit(2, "m", 0.0, 1.0, 0.2)
    assert d.tick(0.0) == [(1, 7), (2, 7)]
    assert d.epdt(7, 0.0) == pytest.approx(0.3)
    assert d.epdt(7, 0.1) == pytest.approx(0.3)  # time passing does not move it
    d.complete(1, 0.05)  # 0.05 s earlier than estimated: job 2 moves up
    assert d.epdt(7, 0.05) == pytest.approx(0.25)
    d.complete(2, 0.4)  # overran: nothing left to remove, EPDT is now
    assert d.epdt(7, 0.4) == 0.4
    s = d.stats()
    assert STAT_KEYS <= s.keys()
    assert (s["submitted"], s["assigned"], s["completed"], s["pending"]) == (2, 2, 2, 0)


def test_prepull_window() -> None:
    d = Dispatcher(prepull_window_s=0.020)
    d.add_instance(1, "m")
    d.submit(1, "m", 0.0, 10.0, 0.030)
    assert d.tick(0.0) == [(1, 1)]
    d.submit(2, "m", 0.0, 10.0, 0.010)
    assert d.tick(0.0) == []  # EPDT 30 ms away, window 20 ms: nothing
    assert d.pending("m") == 1
    assert d.next_wakeup(0.0) == pytest.approx(0.010)
    assert d.tick(0.015) == [(2, 1)]  # 15 ms away: inside the window
    assert d.epdt(1, 0.015) == pytest.approx(0.040)
    assert d.next_wakeup(0.015) is None


def test_worked_example_through_the_dispatcher() -> None:
    d = Dispatcher(prepull_window_s=5.0, plan="window")  # LST-IMH's own partition
    d.add_instance(1, "m")
    d.add_instance(2, "m")
    d.set_instance_ready(2, False)
    d.submit(100, "m", 0.0, 10.0, 3.0)  # makes instance 1 busy until 3
    assert d.tick(0.0) == [(100, 1)]
    d.set_instance_ready(2, True)
    for rid, p, dl in [(10, 4.0, 5.0), (11, 2.0, 6.0), (12, 2.0, 7.0)]:  # A, B, C
        d.submit(rid, "m", 0.0, dl, p)
    assert d.tick(0.0) == [(11, 1), (12, 1), (10, 2)]
    assert d.epdt(1, 0.0) == pytest.approx(7.0) and d.epdt(2, 0.0) == pytest.approx(4.0)


def test_unselected_jobs_stay_queued() -> None:
    d = Dispatcher(plan="window")
    d.add_instance(1, "m")
    d.submit(1, "m", 0.0, 0.1, 0.1)
    d.submit(2, "m", 0.0, 0.5, 0.1)
    d.submit(3, "m", 0.0, 0.1, 0.1)  # only one of 1 and 3 fits by 0.1
    assert d.tick(0.0) == [(1, 1), (2, 1)]
    assert d.pending("m") == 1 and d.take_rejected() == []
    # Job 3's latest start is 0.0: the next tick after it rejects it.
    wake = d.next_wakeup(0.0)
    assert wake is not None and 0.0 < wake < 1e-300  # the next float after 0.0
    d.tick(0.001)
    assert d.take_rejected() == [3]


def test_reject_versus_relax_accounting() -> None:
    rej = Dispatcher(requeue="reject")
    rel = Dispatcher(requeue="relax", relax_factor=1.5, max_relax=2)
    for d in (rej, rel):
        d.submit(1, "nobody-serves-this", 0.0, 1.0, 0.2)  # latest start 0.8
        d.tick(0.8)
        assert d.take_rejected() == []
        d.tick(0.9)
    assert rej.take_rejected() == [1] and rej.stats()["rejected"] == 1
    assert rej.stats()["relaxed"] == 0 and rej.pending("nobody-serves-this") == 0
    # relax: deadline 0.9 + 1.0 * 1.5 = 2.4, then 2.3 + 1.0 * 2.25 = 4.55, then rejected.
    assert rel.take_rejected() == [] and rel.stats()["relaxed"] == 1
    assert rel.next_wakeup(0.9) == pytest.approx(2.2)
    rel.tick(2.3)
    assert rel.stats()["relaxed"] == 2 and rel.pending("nobody-serves-this") == 1
    rel.tick(4.34)
    assert rel.take_rejected() == []
    rel.tick(4.36)
    assert rel.take_rejected() == [1]
    s = rel.stats()
    assert (s["relaxed"], s["rejected"], s["pending"]) == (2, 1, 0)
    assert rel.relaxed("nobody-serves-this") == 2 and rej.relaxed("nobody-serves-this") == 0


def test_relaxed_counts_are_kept_per_model() -> None:
    d = Dispatcher(requeue="relax", relax_factor=2.0, max_relax=3)
    d.submit(1, "a", 0.0, 0.1, 0.05)
    d.submit(2, "a", 0.0, 0.1, 0.05)
    d.submit(3, "b", 0.0, 10.0, 0.05)  # far from its latest start: never relaxed
    d.tick(1.0)
    assert (d.relaxed("a"), d.relaxed("b"), d.relaxed("unknown")) == (2, 0, 0)
    assert d.stats()["relaxed"] == d.relaxed("a") + d.relaxed("b")


def test_relaxed_job_is_served_when_an_instance_appears() -> None:
    d = Dispatcher(requeue="relax")
    d.submit(1, "m", 0.0, 0.1, 0.05)
    d.tick(1.0)  # latest start 0.05 passed: relaxed to 1.0 + 0.15
    d.add_instance(3, "m")
    assert d.tick(1.0) == [(1, 3)]
    assert d.stats()["relaxed"] == 1 and d.take_rejected() == []


def test_not_ready_instances_get_nothing() -> None:
    for policy in ("lst_imh", "round_robin", "least_load"):
        d = Dispatcher(policy=policy)
        d.add_instance(1, "m")
        d.set_instance_ready(1, False)
        d.submit(1, "m", 0.0, 10.0, 0.1)
        assert d.tick(0.0) == []
        d.set_instance_ready(1, True)
        assert d.tick(0.0) == [(1, 1)]


def test_baseline_policies() -> None:
    d = Dispatcher(policy="round_robin", prepull_window_s=1.0)
    for i in (1, 2, 3):
        d.add_instance(i, "m")
    for r in range(5):
        d.submit(r, "m", 0.0, 100.0, 0.1)
    assert d.tick(0.0) == [(0, 1), (1, 2), (2, 3)]  # one job per candidate per tick
    assert d.next_wakeup(0.0) == 0.0  # candidates left and work queued: tick again
    assert d.tick(0.0) == [(3, 1), (4, 2)]
    d.submit(5, "m", 0.0, 100.0, 0.1)
    assert d.tick(0.0) == [(5, 3)]  # the rotation continues after instance 2

    d = Dispatcher(policy="least_load", prepull_window_s=1.0)
    d.add_instance(1, "m")
    d.add_instance(2, "m")
    d.submit(0, "m", 0.0, 100.0, 0.5)
    d.tick(0.0)
    d.submit(1, "m", 0.0, 100.0, 0.1)
    assert d.tick(0.0) == [(1, 2)]


def test_unknown_model_waits_for_an_instance_and_models_are_separate() -> None:
    d = Dispatcher()
    d.submit(1, "later", 0.0, 10.0, 0.1)
    d.add_instance(1, "other")
    assert d.tick(0.0) == [] and d.pending("later") == 1 and d.pending("never") == 0
    d.add_instance(2, "later")
    assert d.tick(0.5) == [(1, 2)]


def test_remove_instance_returns_in_flight_requests() -> None:
    d = Dispatcher(plan="window")
    d.add_instance(1, "m")
    for r in (5, 3, 9):
        d.submit(r, "m", 0.0, 100.0, 0.1)
    d.tick(0.0)
    d.complete(3, 0.1)
    d.submit(4, "m", 0.0, 100.0, 0.1)
    assert d.remove_instance(1) == [5, 9]
    assert d.pending("m") == 1
    d.submit(5, "m", 0.0, 100.0, 0.1)  # the caller may resubmit a returned id
    assert d.stats()["pending"] == 2


def test_cancel() -> None:
    d = Dispatcher(plan="window")
    d.add_instance(1, "m")
    d.submit(1, "m", 0.0, 10.0, 0.5)
    d.submit(2, "m", 0.0, 10.0, 0.5)
    d.tick(0.0)
    d.submit(3, "m", 0.0, 10.0, 0.5)
    assert d.cancel(2) and d.cancel(3) and not d.cancel(3) and not d.cancel(99)
    assert d.epdt(1, 0.0) == pytest.approx(0.5)  # job 2's work left with it
    assert d.pending("m") == 0 and d.stats()["cancelled"] == 2


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_bad_times_raise_value_error(bad: float) -> None:
    d = Dispatcher()
    d.add_instance(1, "m")
    for args in [(1, "m", bad, 1.0, 0.1), (1, "m", 0.0, bad, 0.1), (1, "m", 0.0, 1.0, bad)]:
        with pytest.raises(ValueError, match="must be"):
            d.submit(*args)
    for call in (d.tick, d.next_wakeup, lambda t: d.epdt(1, t)):
        with pytest.raises(ValueError, match="now"):
            call(bad)
    assert d.stats()["submitted"] == 0


def test_bad_ids_and_config_raise_value_error() -> None:
    d = Dispatcher()
    d.add_instance(1, "m")
    with pytest.raises(ValueError, match="already exists"):
        d.add_instance(1, "m")
    for call in (lambda: d.remove_instance(2), lambda: d.set_instance_ready(2, True), lambda: d.epdt(2, 0.0)):
        with pytest.raises(ValueError, match="unknown instance 2"):
            call()
    d.submit(1, "m", 0.0, 1.0, 0.1)
    with pytest.raises(ValueError, match="already"):
        d.submit(1, "m", 0.0, 1.0, 0.1)
    with pytest.raises(ValueError, match="queued, not assigned"):
        d.complete(1, 0.0)
    with pytest.raises(ValueError, match="unknown request 2"):
        d.complete(2, 0.0)
    for kwargs in (
        {"policy": "fifo"},
        {"requeue": "retry"},
        {"prepull_window_s": -0.1},
        {"relax_factor": math.nan},
        {"relax_factor": 0.5},
        {"max_relax": -1},
        {"plan": "lazy"},
    ):
        with pytest.raises(ValueError):
            Dispatcher(**kwargs)


class DispatcherMachine(RuleBasedStateMachine):
    """Random events against a model of where each request must be."""

    def __init__(self) -> None:
        super().__init__()
        self.d = Dispatcher()
        self.now = 0.0
        self.next_id = 0
        self.queued: set[int] = set()
        self.flying: dict[int, int] = {}  # request -> instance
        self.ended: set[int] = set()
        self.req: dict[int, tuple[str, float, float]] = {}  # model, deadline, est
        self.inst: dict[int, str] = {}
        self.group: dict[int, int] = {}  # instance -> device group (one EPDT per group)
        self.ready: dict[int, bool] = {}
        self.policy = "lst_imh"
        self.requeue = "reject"

    @initialize(
        policy=st.sampled_from(["lst_imh", "round_robin", "least_load"]),
        requeue=st.sampled_from(["reject", "relax"]),
        plan=st.sampled_from(["global", "window"]),
    )
    def start(self, policy: str, requeue: str, plan: str) -> None:
        self.policy, self.requeue = policy, requeue
        self.d = Dispatcher(
            policy=policy, prepull_window_s=0.02, requeue=requeue, relax_factor=1.5, max_relax=2, plan=plan
        )
        assert self.d.plan == plan
        for i, model in ((0, "a"), (1, "b")):
            self.d.add_instance(i, model)
            self.inst[i], self.group[i], self.ready[i] = model, i, True

    @rule(i=st.integers(0, 3), model=st.sampled_from(["a", "b"]), group=st.sampled_from([None, 0, 1, 10]))
    def add_instance(self, i: int, model: str, group: int | None) -> None:
        if i in self.inst:
            with pytest.raises(ValueError):
                self.d.add_instance(i, model, group)
        else:
            self.d.add_instance(i, model, group)
            self.inst[i], self.ready[i] = model, True
            self.group[i] = i if group is None else group

    @rule(i=st.integers(0, 3))
    def remove_instance(self, i: int) -> None:
        if i not in self.inst:
            with pytest.raises(ValueError):
                self.d.remove_instance(i)
            return
        back = self.d.remove_instance(i)
        assert sorted(back) == sorted(r for r, at in self.flying.items() if at == i)
        for r in back:
            del self.flying[r]
            self.ended.add(r)
            event("orphaned")
        del self.inst[i], self.group[i]

    @rule(i=st.integers(0, 3), ready=st.booleans())
    def set_ready(self, i: int, ready: bool) -> None:
        if i in self.inst:
            self.d.set_instance_ready(i, ready)
            self.ready[i] = ready

    @rule(model=st.sampled_from(["a", "b", "c"]), slack=st.floats(0.0, 0.5), est=st.floats(0.0, 0.1))
    def submit(self, model: str, slack: float, est: float) -> None:
        rid = self.next_id
        self.next_id += 1
        self.d.submit(rid, model, self.now, self.now + slack, est)
        self.queued.add(rid)
        self.req[rid] = (model, self.now + slack, est)

    @rule(dt=st.one_of(st.just(0.0), st.floats(0.0, 0.05)), use_wakeup=st.booleans())
    def tick(self, dt: float, use_wakeup: bool) -> None:
        wake = self.d.next_wakeup(self.now)
        if use_wakeup and wake is not None:
            self.now = max(self.now, min(wake, self.now + 1.0))
        else:
            self.now += dt
        before = {i: self.d.epdt(i, self.now) for i in self.inst}
        finish = {self.group[i]: t for i, t in before.items()}  # one EPDT per group
        relaxed = self.d.stats()["relaxed"]
        early = wake is None or self.now < wake  # before the due time next_wakeup named
        for rid, i in self.d.tick(self.now):
            assert rid in self.queued, f"request {rid} assigned twice or never queued"
            self.queued.remove(rid)
            assert self.inst[i] == self.req[rid][0] and self.ready[i]
            assert before[i] - self.now <= 0.02 + 1e-12
            finish[self.group[i]] += self.req[rid][2]
            if self.policy == "lst_imh" and self.requeue == "reject":
                assert finish[self.group[i]] <= self.req[rid][1] + 1e-9  # on time under the estimate
            self.flying[rid] = i
            event("assigned")
        if early:  # reject/relax never comes due before next_wakeup said
            assert self.d.stats()["relaxed"] == relaxed
        for rid in self.d.take_rejected():
            assert not early, f"request {rid} rejected before the wake-up time {wake}"
            assert rid in self.queued
            self.queued.remove(rid)
            self.ended.add(rid)
            event("rejected")
            assert self.now + self.req[rid][2] >= self.req[rid][1] - 1e-12 or self.requeue == "relax"

    @precondition(lambda self: self.flying)
    @rule(k=st.integers(0, 1000))
    def complete(self, k: int) -> None:
        rid = sorted(self.flying)[k % len(self.flying)]
        self.d.complete(rid, self.now)
        event("completed")
        del self.flying[rid]
        self.ended.add(rid)

    @rule(k=st.integers(0, 1000))
    def cancel(self, k: int) -> None:
        rid = k % (self.next_id + 1)
        known = rid in self.queued or rid in self.flying
        if rid in self.flying:
            event("cancelled in flight")
        # Both forms: without a time, and at the current time.
        assert (self.d.cancel(rid, self.now) if k % 2 else self.d.cancel(rid)) == known
        if known:
            self.queued.discard(rid)
            self.flying.pop(rid, None)
            self.ended.add(rid)

    @invariant()
    def every_request_is_in_exactly_one_place(self) -> None:
        self.d.check_integrity()  # raises RuntimeError naming the broken rule
        s = self.d.stats()
        assert s["pending"] == len(self.queued) == sum(self.d.pending(m) for m in "abc")
        assert s["in_flight"] == len(self.flying)
        assert s["submitted"] == self.next_id == len(self.queued) + len(self.flying) + len(self.ended)
        assert s["submitted"] == (
            s["completed"] + s["rejected"] + s["cancelled"] + s["orphaned"] + s["pending"] + s["in_flight"]
        )
        assert s["assigned"] >= len(self.flying)
        if not self.queued:
            assert self.d.next_wakeup(self.now) is None
        for i in self.inst:
            assert self.d.epdt(i, self.now) >= self.now


TestDispatcherMachine = DispatcherMachine.TestCase
TestDispatcherMachine.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)

"""core/held.py on its own: expiry order and wake-up, drop from the middle, release skips
ended requests, and check() names each kind of breach."""

from __future__ import annotations

import pytest

from janusd.core.held import HeldQueues
from janusd.core.requests import Request
from janusd.wire import worker_msgs as wm


def _req(rid: int, model: str = "m") -> Request:
    return Request(rid, model, [1, 2], wm.SamplingSpec(max_tokens=4), 0.0, 1.0, 0.1)


def test_expire_takes_the_due_ones_and_says_when_the_next_is_due():
    h = HeldQueues()
    a, b, c, d = _req(1), _req(2), _req(3), _req(4, "n")
    for r, t in ((a, 0.0), (b, 1.0), (c, 2.0), (d, 0.5)):
        h.hold(r, t)
    out, wake = h.expire(now=1.5, timeout_s=1.0)  # a (due 1.0) and d (due 1.5)
    assert sorted(r.rid for r in out) == [1, 4] and wake == 2.0
    assert all(r.held_since is None for r in out) and h.count("m") == 2 and h.count("n") == 0
    h.drop(b)
    assert [r.rid for r in h] == [3] and b.held_since is None
    h.drop(b)  # idempotent
    c.done = True
    assert h.release("m") == [] and list(h) == []
    assert h.expire(10.0, 1.0) == ([], None)


def test_check_names_each_breach():
    h = HeldQueues()
    a, b = _req(1), _req(2)
    h.hold(a, 0.0)
    h.check({1: a})
    with pytest.raises(RuntimeError, match="held but has ended"):
        h.check({})
    b.held_since = 3.0
    with pytest.raises(RuntimeError, match="no held queue has it"):
        h.check({1: a, 2: b})
    a.instance = object()
    with pytest.raises(RuntimeError, match="both held and assigned"):
        h.check({1: a})

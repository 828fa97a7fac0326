"""core/requests.request_slo reads token times through a view when all tokens after the
first came in one delta (the simulator's shape): the same figures as the whole list."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.core.requests import request_slo
from janusd.trace.slo import request_attainment


@settings(max_examples=300, deadline=None)
@given(arrival=st.floats(0, 1e5), first=st.floats(0, 5), gap=st.floats(0, 600), n=st.integers(64, 3000),
       ttft=st.floats(0.05, 3), tpot=st.floats(0.005, 0.2), failed=st.booleans(), spread=st.booleans())
def test_runs_give_the_figures_of_the_whole_list(arrival, first, gap, n, ttft, tpot, failed, spread):
    times = [arrival + first] + [arrival + first + gap] * (n - 1)
    if spread:  # not the simulator's shape: the list path
        times[-1] += 0.5
    req = SimpleNamespace(token_times=times, arrival=arrival, failed=failed, ttft_slo_s=ttft, tpot_slo_s=tpot)
    rel = [t - arrival for t in times]
    want = request_attainment(rel, len(rel), ttft, tpot, ok=not failed)
    assert request_slo(req) == (want.on_time_tokens, want.total_tokens)

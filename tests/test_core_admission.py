"""core/admission.py: the context rule and the early-refusal arithmetic, case by case."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from janusd.core.admission import fit_to_context, late_by
from janusd.core.requests import Refused
from janusd.wire import worker_msgs as wm


def test_an_omitted_max_tokens_gets_the_default_capped_by_what_the_context_leaves():
    s = fit_to_context(100, wm.SamplingSpec(max_tokens=16, temperature=0.5), False, 128, 1024, chat=True)
    assert (s.max_tokens, s.temperature) == (28, 0.5)
    assert fit_to_context(100, wm.SamplingSpec(), False, 4096, 1024, chat=True).max_tokens == 1024
    given_ = wm.SamplingSpec(max_tokens=28)
    assert fit_to_context(100, given_, True, 128, 1024, chat=False) is given_


@pytest.mark.parametrize("n, max_tokens, given_, param", [(128, 1, True, "messages"), (200, 1, False, "messages"),
                                                          (100, 29, True, "max_tokens")])
def test_what_does_not_fit_is_refused_with_400_naming_the_field(n: int, max_tokens: int, given_: bool, param: str):
    with pytest.raises(Refused) as e:
        fit_to_context(n, wm.SamplingSpec(max_tokens=max_tokens), given_, 128, 1024, chat=True)
    f = e.value.failure
    assert (f.status, f.code, f.param) == (400, "context_length_exceeded", param)
    assert str(n) in f.message and "128" in f.message


@given(n=st.integers(1, 300), mt=st.integers(1, 300), given_=st.booleans())
def test_an_accepted_request_always_fits_the_context(n: int, mt: int, given_: bool):
    try:
        s = fit_to_context(n, wm.SamplingSpec(max_tokens=mt), given_, 256, 64, chat=False)
    except Refused:
        assert n >= 256 or (given_ and n + mt > 256)
        return
    assert n + s.max_tokens <= 256 and s.max_tokens >= 1


def test_late_by_is_the_wait_for_the_earliest_free_instance_only_when_the_deadline_is_out_of_reach():
    # free at 2.0, 0.5 s of prefill, due at 2.4: out of reach; Retry-After = 2.0 - 1.0
    assert late_by(2.0, 0.5, 2.4, now=1.0) == pytest.approx(1.0)
    assert late_by(2.0, 0.4, 2.4, now=1.0) is None  # exactly on time
    assert late_by(None, 9.0, 0.0, now=1.0) is None  # no instance known: the Dispatcher decides

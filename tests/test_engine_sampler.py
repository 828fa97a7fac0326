"""Sampling rules and stop handling, checked against their definitions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from janusd.engine.sampler import SampleRequest, make_generator, sample
from janusd.engine.sequence import Sequence
from janusd.engine.types import RequestError, SamplingParams


def _draw(logits: torch.Tensor, params: SamplingParams, n: int, seed: int = 0) -> list[int]:
    g = make_generator(seed)
    return [sample(logits[None], [SampleRequest(params, g)])[0][0] for _ in range(n)]


def test_greedy_is_argmax_per_row() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    out = sample(logits, [SampleRequest(SamplingParams(temperature=0)) for _ in range(5)])
    assert [t for t, _ in out] == logits.argmax(-1).tolist()


def test_top_k_keeps_k_tokens_with_renormalised_probabilities() -> None:
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.05, 0.05]))
    draws = _draw(logits, SamplingParams(temperature=1.0, top_k=2), 3000)
    assert set(draws) <= {0, 1}
    p0 = draws.count(0) / len(draws)
    assert abs(p0 - 0.4 / 0.7) < 0.04  # ~4.5 standard deviations


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert set(_draw(logits, SamplingParams(temperature=1.0, top_p=0.8), 1000)) == {0, 1}
    assert set(_draw(logits, SamplingParams(temperature=1.0, top_p=0.81), 2000)) == {0, 1, 2}
    assert set(_draw(logits, SamplingParams(temperature=1.0, top_p=0.3), 200)) == {0}


def test_temperature_sharpens() -> None:
    logits = torch.log(torch.tensor([0.6, 0.4]))
    cold = _draw(logits, SamplingParams(temperature=0.25), 2000)
    expect = 0.6**4 / (0.6**4 + 0.4**4)  # p^(1/T) renormalised
    assert abs(cold.count(0) / 2000 - expect) < 0.035


@given(st.integers(0, 2**63 - 1))
def test_seed_reproducible(seed: int) -> None:
    logits = torch.randn(100, generator=torch.Generator().manual_seed(5))
    p = SamplingParams(temperature=1.0, top_p=0.95, top_k=40, seed=seed)
    assert _draw(logits, p, 20, seed) == _draw(logits, p, 20, seed)


def test_different_seeds_differ_and_logprobs_are_raw_log_softmax() -> None:
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(2))
    assert _draw(logits[0], SamplingParams(), 30, 1) != _draw(logits[0], SamplingParams(), 30, 2)
    (tok, lp), = sample(logits, [SampleRequest(SamplingParams(temperature=0.7, logprobs=3), make_generator(3))])
    ref = torch.log_softmax(logits[0], -1)
    assert lp is not None and lp.token_id == tok and math.isclose(lp.logprob, ref[tok].item(), rel_tol=1e-6)
    assert [i for i, _ in lp.top] == ref.topk(3).indices.tolist()


def test_suppressed_tokens_never_sampled() -> None:
    logits = torch.tensor([[10.0, 0.0, -1.0]])
    (tok, _), = sample(logits, [SampleRequest(SamplingParams(temperature=0), None, [0])])
    assert tok == 1


@pytest.mark.parametrize("bad, field", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-1.0), "temperature"), (dict(top_p=0.0), "top_p"),
    (dict(top_k=-2), "top_k"), (dict(stop=[""]), "stop"), (dict(stop_token_ids=[10_000]), "stop_token_ids"),
    (dict(logprobs=50), "logprobs"), (dict(min_tokens=20, max_tokens=5), "min_tokens"),
    (dict(temperature=float("nan")), "temperature"),
])
def test_bad_params_name_the_field(bad: dict, field: str) -> None:
    with pytest.raises(RequestError, match=field):
        SamplingParams(**bad).validate(1000)


class _CharDetok:
    """Token i decodes to TABLE[i] (enough to exercise the stop-string buffer)."""

    TABLE = ["a", "b", "c", "d", "<", "/", ">", "xy", "END"]

    def add(self, t: int) -> str:
        return self.TABLE[t]

    def flush(self) -> str:
        return ""


def _run(tokens: list[int], **kw) -> tuple[str, str | None, int]:
    seq = Sequence("r", [0], SamplingParams(**kw), 0, _CharDetok(), [8], 1000, None)
    text = ""
    for t in tokens:
        text += seq.append_token(t)
        if seq.finish_reason:
            break
    return text, seq.finish_reason, seq.num_output


def test_stop_string_cut_exactly_across_tokens() -> None:
    # "ab</" ... stop "</>" spans three tokens; "<" alone must be held back, never emitted
    assert _run([0, 1, 4, 5, 6, 2], stop=["</>"], max_tokens=20) == ("ab", "stop", 5)
    assert _run([0, 4, 2, 4, 5, 6], stop=["</>"], max_tokens=20) == ("a<c", "stop", 6)
    # a held-back prefix that does not complete is released
    assert _run([0, 4, 2], stop=["</>"], max_tokens=3) == ("a<c", "length", 3)
    # stop string inside one token's text: text before it is emitted, nothing after
    assert _run([0, 7], stop=["y"], max_tokens=9) == ("ax", "stop", 2)
    # the earliest of several stop strings wins
    assert _run([0, 1, 2, 3], stop=["cd", "bc"], max_tokens=9) == ("a", "stop", 3)


def test_eos_and_stop_token_ids_and_min_tokens() -> None:
    assert _run([0, 8, 1], max_tokens=9) == ("a", "stop", 2)
    assert _run([0, 8, 1], max_tokens=3, ignore_eos=True) == ("aENDb", "length", 3)
    assert _run([0, 3, 1], stop_token_ids=[3], max_tokens=9) == ("a", "stop", 2)
    seq = Sequence("r", [0], SamplingParams(min_tokens=2, max_tokens=5), 0, _CharDetok(), [8], 1000, None)
    assert seq.banned_now() == [8]
    seq.append_token(0)
    seq.append_token(1)
    assert seq.banned_now() is None


def test_tiny_temperature_is_greedy_not_a_nan_crash() -> None:
    logits = torch.tensor([[3.0, 40.0, -2.0, 39.5], [1.0, -5.0, 2.0, 0.0]])
    reqs = [SampleRequest(SamplingParams(temperature=t, top_p=0.5, top_k=2), make_generator(1)) for t in (1e-38, 1e-6)]
    assert [tok for tok, _ in sample(logits, reqs)] == [1, 2]

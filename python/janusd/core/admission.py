"""Admission rules that need no state: a request against its model's context, and the
early refusal of a request no instance can start in time.

Pure functions of their arguments, so ServingCore stays the one place that holds state
and these can be checked case by case (tests/test_core_admission.py).
"""

from __future__ import annotations

import msgspec

from janusd.core.requests import Failure, Refused
from janusd.wire import worker_msgs as wm


def fit_to_context(n_prompt: int, sampling: wm.SamplingSpec, max_tokens_given: bool, max_len: int,
                   default_max_tokens: int, chat: bool) -> wm.SamplingSpec:
    """The sampling with max_tokens settled: a request that omits it gets the default,
    capped by what the context leaves; one whose prompt (plus given max_tokens) does not
    fit is refused with 400 naming the field at fault."""
    where = "messages" if chat else "prompt"
    if n_prompt >= max_len:
        raise Refused(Failure(400, f"{where}: the prompt has {n_prompt} tokens; this model's context is "
                                   f"{max_len}", "invalid_request_error", code="context_length_exceeded",
                              param=where))
    if not max_tokens_given:
        return msgspec.structs.replace(sampling, max_tokens=min(default_max_tokens, max_len - n_prompt))
    if n_prompt + sampling.max_tokens > max_len:
        raise Refused(Failure(400, f"max_tokens: {n_prompt} prompt tokens + max_tokens {sampling.max_tokens} "
                                   f"exceed this model's context of {max_len}", "invalid_request_error",
                              code="context_length_exceeded", param="max_tokens"))
    return sampling


def late_by(earliest_free: float | None, est_prefill_s: float, deadline: float, now: float) -> float | None:
    """How long until the earliest-free instance frees up (the Retry-After) when even it
    cannot finish the prefill by the deadline by the estimate; None when the request may
    be on time or no instance is known (then the Dispatcher decides)."""
    if earliest_free is None or earliest_free + est_prefill_s <= deadline:
        return None
    return earliest_free - now

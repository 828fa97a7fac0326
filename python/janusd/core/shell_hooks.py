"""What a shell hands ServingCore besides its workers: the request limits (from the
daemon's `[server]` config, or the simulator's) and the observers it wants called.
Its own module so the core's parts (core/serving.py and the modules it is built from)
and both shells share one definition."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from janusd.core.dispatch import Refusal
from janusd.core.requests import Request


@dataclass(frozen=True)
class Limits:
    queue_limit: int = 256
    model_wait_timeout_s: float = 30.0
    default_max_tokens: int = 1024  # a model's own default_max_tokens overrides it
    tokenize_timeout_s: float = 30.0  # a worker that has not tokenized a prompt by then: 503


def _nothing(*_: Any) -> None:
    return None


@dataclass
class Observers:
    """What the shell wants to hear; each default does nothing (tests, the simulator)."""

    finished: Callable[[Request, str], None] = _nothing  # (request, outcome)
    rejected: Callable[[str, str], None] = _nothing  # (model, reason)
    refused: Callable[[Refusal], None] = _nothing  # a TTFT-SLO refusal and the figures it used
    kv_transfer: Callable[[str, str, int, float | None], None] = _nothing
    estimate_error: Callable[[str, float], None] = _nothing  # (model, observed - estimated prefill s)
    wake: Callable[[str], None] = _nothing  # a new request waits for the model: bring an instance up
    idle: Callable[[], None] = _nothing  # the last in-flight request ended

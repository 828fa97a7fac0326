"""What a shell hands the core for one client request: the parsed request, before any
token exists. The core owns the request from here to its end, tokenizing included, so a
shell never waits, tokenizes or re-checks a model itself (the daemon's HTTP handler and
the simulator's arrivals both make one of these and call ServingCore.submit)."""

from __future__ import annotations

from dataclasses import dataclass

from janusd.wire import worker_msgs as wm


@dataclass(frozen=True)
class Submission:
    model: str
    sampling: wm.SamplingSpec
    arrival: float  # the request's clock (SLO deadlines, token times) starts here
    max_tokens_given: bool = True  # False: the core settles max_tokens from the context left
    prompt_ids: list[int] | None = None  # already tokens (the client sent ids; the simulator)
    prompt: str | None = None  # else text, tokenized on a worker with an Active instance
    messages: list[wm.ChatMessage] | None = None  # or chat messages, through the model's template
    chat: bool = False  # the request came as chat (errors name `messages`, not `prompt`)
    ttft_ms: float | None = None  # per-request SLOs; None: the model's
    tpot_ms: float | None = None
    request_id: str = ""  # the id the client and the log know it by

    @property
    def where(self) -> str:
        """The request field a tokenizing error names."""
        return "messages" if self.chat else "prompt"

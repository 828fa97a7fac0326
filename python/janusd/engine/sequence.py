"""One request's state inside a ModelEngine, and what each new token does to it.

`Sequence` holds the token list (prompt + outputs), how many of those tokens have KV in
the cache (`num_computed`), its block table, and its text state. `append_token` applies
the stop rules (stop token ids, EOS, stop strings, max_tokens, max_model_len) and
returns the text that may be emitted now: the incremental detokenizer never yields a
broken UTF-8 character, and text that could still turn out to be the start of a stop
string is held back until it cannot, so a stop string and everything after it are never
emitted. When the request ends (max_tokens, max_model_len, a stop token) in the middle of
a multi-byte character, the bytes no later token will complete are dropped: the text
ends with the last complete character, never with U+FFFD (see `_flush`).
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from janusd.engine.types import FinishReason, SamplingParams

REPLACEMENT_CHAR = "\ufffd"


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    KV_READY = "kv_ready"    # prefill role: prompt KV complete, held for export
    IMPORTING = "importing"  # decode role: blocks reserved, KV bytes arriving
    FINISHED = "finished"


class Sequence:
    def __init__(self, req_id: str, prompt: list[int], params: SamplingParams, arrival: int,
                 detok: Any, eos_ids: list[int], max_model_len: int, generator: torch.Generator | None) -> None:
        self.req_id = req_id
        self.params = params
        self.arrival = arrival
        self.tokens = list(prompt)
        self.prompt_len = len(prompt)
        self.num_computed = 0
        self.blocks: list[int] = []
        self.status = Status.WAITING
        self.generator = generator
        self.detok = detok
        self.eos_ids = set(eos_ids)
        self.stop_ids = set(params.stop_token_ids)
        self.max_model_len = max_model_len
        self.text = ""
        self.emitted = 0
        self.finish_reason: FinishReason | None = None
        self.prefill_s = 0.0
        self.prefill_reported = False
        self.max_stop = max((len(s) for s in params.stop), default=0)
        self.kv_wait_since: float | None = None  # scheduler clock when it began waiting for KV pages
        self.fail_reason = ""  # why the scheduler failed it (Schedule.failed)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    def banned_now(self) -> list[int] | None:
        """Tokens that may not be sampled yet (min_tokens keeps EOS and stop ids away)."""
        if self.num_output >= self.params.min_tokens:
            return None
        banned = set(self.stop_ids)
        if not self.params.ignore_eos:
            banned |= self.eos_ids
        return sorted(banned) or None

    def append_token(self, tok: int) -> str:
        """Add a sampled token; set finish_reason if it ends the request; return the text delta."""
        self.tokens.append(tok)
        stop_tok = tok in self.stop_ids or (not self.params.ignore_eos and tok in self.eos_ids)
        if stop_tok and self.num_output >= self.params.min_tokens:
            self.finish_reason = "stop"
            return self._flush()
        prev_len = len(self.text)
        self.text += self.detok.add(tok) if self.detok is not None else ""
        if self.params.stop and self.num_output >= self.params.min_tokens:
            start = max(0, prev_len - self.max_stop + 1)
            hits = [i for i in (self.text.find(s, start) for s in self.params.stop) if i >= 0]
            if hits:
                cut = min(hits)
                self.finish_reason = "stop"
                delta = self.text[self.emitted : cut] if cut > self.emitted else ""
                self.emitted = max(self.emitted, cut)
                return delta
        if self.num_output >= self.params.max_tokens or self.num_tokens >= self.max_model_len:
            self.finish_reason = "length"
            return self._flush()
        safe = len(self.text) - self._held_back()
        delta = self.text[self.emitted : safe] if safe > self.emitted else ""
        self.emitted = max(self.emitted, safe)
        return delta

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        for k in range(min(self.max_stop - 1, len(self.text) - self.emitted), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.params.stop):
                return k
        return 0

    def _flush(self) -> str:
        """The end of the sequence: emit everything still held back. What the detokenizer
        still holds is held because its decoding ends in U+FFFD, i.e. the bytes of a
        character that no token will now complete (or invalid bytes): drop that tail, so
        the text ends with its longest complete prefix. (A U+FFFD the model itself wrote
        as the very last character cannot be told apart from that and is dropped too.)
        Whole characters released here may complete a stop string: it is cut as always."""
        prev_len = len(self.text)
        if self.detok is not None and hasattr(self.detok, "flush"):
            self.text += self.detok.flush().rstrip(REPLACEMENT_CHAR)
        end = len(self.text)
        if self.params.stop and end > prev_len and self.num_output >= self.params.min_tokens:
            start = max(0, prev_len - self.max_stop + 1)
            hits = [i for i in (self.text.find(s, start) for s in self.params.stop) if i >= 0]
            if hits:
                end = min(hits)
                self.finish_reason = "stop"
        delta = self.text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return delta

    def resume_streamed(self, output_ids: list[int]) -> None:
        """Decode side of a P/D split: `output_ids` (already in `tokens`) were produced and
        streamed by the prefill side, which held back any text that could start a stop
        string. Rebuild the same text state so that held-back text is emitted here once it
        is safe (not lost), and nothing already streamed is repeated; the prefill side
        also reported the prefill time."""
        if self.detok is not None:
            for t in output_ids:
                self.text += self.detok.add(t)
        self.emitted = len(self.text) - self._held_back()
        self.prefill_reported = True

    def reset_for_recompute(self) -> None:
        """After preemption: KV is gone, every token (prompt and outputs) is recomputed."""
        self.num_computed = 0
        self.blocks = []
        self.status = Status.WAITING

"""Per-request token sampling: greedy, temperature, top-k, top-p, seeds, logprobs.

Runs on CPU float32 logits (the engine copies the few rows that sample off the device):
one code path for every device kind, and a per-request `torch.Generator` makes seeded
sampling reproducible independently of which other requests share the batch. Greedy
rows are one batched argmax. `suppress` bans tokens for this step only (EOS and stop
token ids before `min_tokens`). Logprobs come from the raw distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from janusd.engine.types import SamplingParams, TokenLogprob


# Temperatures below this sample greedily: logits / 1e-38 overflow to inf, softmax gives
# NaN and multinomial would raise, failing the whole batch's step (vLLM uses 1e-5 too).
GREEDY_BELOW = 1e-5


@dataclass
class SampleRequest:
    params: SamplingParams
    generator: torch.Generator | None = None
    suppress: list[int] | None = None


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator; unseeded requests draw a fresh seed from torch's global RNG."""
    g = torch.Generator(device="cpu")
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    g.manual_seed(seed % (2**64))
    return g


def _filter(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside top-k / the top-p nucleus to -inf (row is a fresh tensor)."""
    if 0 < top_k < row.shape[0]:
        kth = torch.topk(row, top_k).values[-1]
        row[row < kth] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly above each token
        drop = before >= top_p
        drop[0] = False
        row[order[drop]] = float("-inf")
    return row


def sample(logits: torch.Tensor, reqs: list[SampleRequest]) -> list[tuple[int, TokenLogprob | None]]:
    """logits: [n, vocab] float32 on CPU, one row per request. Returns (token, logprobs)."""
    if logits.shape[0] != len(reqs):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(reqs)} requests")
    greedy = torch.argmax(logits, dim=-1).tolist() if len(reqs) else []
    out: list[tuple[int, TokenLogprob | None]] = []
    for i, r in enumerate(reqs):
        p = r.params
        row = logits[i]
        if r.suppress or p.temperature >= GREEDY_BELOW:
            row = row.clone()
            if r.suppress:
                row[r.suppress] = float("-inf")
        if p.temperature < GREEDY_BELOW:
            tok = greedy[i] if not r.suppress else int(torch.argmax(row))
        else:
            row = _filter(row / p.temperature, p.top_k, p.top_p)
            probs = torch.softmax(row, dim=-1)
            tok = int(torch.multinomial(probs, 1, generator=r.generator).item())
        lp: TokenLogprob | None = None
        if p.logprobs is not None:
            raw = torch.log_softmax(logits[i], dim=-1)
            top = torch.topk(raw, p.logprobs) if p.logprobs > 0 else None
            pairs = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
            lp = TokenLogprob(token_id=tok, logprob=float(raw[tok]), top=pairs)
        out.append((tok, lp))
    return out

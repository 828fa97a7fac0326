"""Decode routing on P/D models: which decode instance continues a prefilled request.

The paper routes to the decode instance with the least decode backlog (PAPER.md §6; the
public code's round-robin ignores how busy each instance is). A decode step's cost grows
with the number of sequences it carries, so backlog is first the sequences decoding
there (transfers in flight included), then the tokens they may still produce (sum of
their max_tokens: an instance near the end of its work frees up sooner), then the lower
instance id, so the choice is deterministic. Pure: no clock, no I/O.
"""

from __future__ import annotations

from typing import NamedTuple


class DecodeLoad(NamedTuple):
    instance_id: int
    sequences: int
    token_budget: int


def least_decode_backlog(loads: list[DecodeLoad]) -> int | None:
    """The instance id to decode on, or None when there is no candidate."""
    if not loads:
        return None
    return min(loads, key=lambda x: (x.sequences, x.token_budget, x.instance_id)).instance_id

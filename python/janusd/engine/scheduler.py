"""Continuous batching for one model: which tokens of which sequences run this step.

Every step fills a token budget (`max_num_batched_tokens`) in arrival order: running
sequences first (a decode costs one token, an unfinished prefill continues with a
chunk), then waiting sequences are admitted (up to `max_num_seqs` running) with a
prefill chunk of whatever budget is left. Prefills are therefore chunked and mixed
with decodes in the same step.

When a running sequence needs a new KV block and none can be had (the region is at its
maximum or the shared pool has no free page), the YOUNGEST running sequence is
preempted: its blocks are freed and it goes back to the front of the waiting queue to
be recomputed later from its prompt and the tokens it already produced (recompute, not
swap: the KV is rebuilt by a prefill over prompt + outputs, so greedy output is the same
as without preemption). No waiting sequence is admitted in a step that preempted.
A sequence that cannot get a block while it is the only one running (the pool is held
by other models or by this model's held/importing KV, or it alone needs more than the
pool) is not preempted but FAILS (`Schedule.failed`): recomputing it alone would only
hit the same wall again, so step() can never loop forever on it.

The scheduler knows sequences and block ids, never tensors; `blocks` is anything with
`allocate(n) -> list[int] | None` and `free(ids)` (PagedKVCache or a BlockAllocator).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from janusd.engine.sequence import Sequence, Status


class BlockSource(Protocol):
    def allocate(self, n: int) -> list[int] | None: ...
    def free(self, ids: list[int]) -> None: ...


@dataclass
class Scheduled:
    seq: Sequence
    start: int
    n: int

    @property
    def samples(self) -> bool:
        """This chunk reaches the last token, so its last row's logits give the next token."""
        return self.start + self.n == self.seq.num_tokens


@dataclass
class Schedule:
    items: list[Scheduled] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    failed: list[Sequence] = field(default_factory=list)  # cannot grow with nothing left to preempt (blocks freed)

    @property
    def num_tokens(self) -> int:
        return sum(i.n for i in self.items)


class Scheduler:
    def __init__(self, block_size: int, max_num_seqs: int, max_num_batched_tokens: int, blocks: BlockSource) -> None:
        if block_size < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1")
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A sequence whose KV is already in its blocks (imported): it decodes next step."""
        seq.status = Status.RUNNING
        self.running.append(seq)
        self.running.sort(key=lambda s: s.arrival)

    def remove(self, seq: Sequence, free_blocks: bool = True) -> None:
        """Take a sequence out of the queues (finished, aborted, or held for export)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if free_blocks and seq.blocks:
            self.blocks.free(seq.blocks)
            seq.blocks = []

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        if seq.blocks:
            self.blocks.free(seq.blocks)
        seq.reset_for_recompute()
        # back to the waiting queue, in arrival order among the preempted
        i = 0
        while i < len(self.waiting) and self.waiting[i].arrival < seq.arrival:
            i += 1
        self.waiting.insert(i, seq)
        self.num_preemptions += 1

    def schedule(self) -> Schedule:
        out = Schedule()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            need = self._blocks_for(seq.num_computed + n) - len(seq.blocks)
            got = self.blocks.allocate(need) if need > 0 else []
            while got is None:
                victim = self.running[-1]
                if victim is seq and len(self.running) == 1:
                    # nothing of this model is left to preempt: recomputing alone would hit
                    # the same wall again, forever, so the request ends with an error
                    self.remove(seq)
                    out.failed.append(seq)
                    break
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
                got = self.blocks.allocate(need)
            if got is None:
                break
            seq.blocks += got
            out.items.append(Scheduled(seq, seq.num_computed, n))
            budget -= n
            i += 1
        if out.preempted:
            return out
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = min(seq.num_tokens - seq.num_computed, budget)
            got = self.blocks.allocate(self._blocks_for(n))
            if got is None and not self.running:
                n = min(n, self.block_size)  # the smallest useful chunk
                got = self.blocks.allocate(1)
                if got is None:
                    self.waiting.popleft()
                    out.failed.append(seq)
                    continue
            if got is None:
                break
            self.waiting.popleft()
            seq.blocks = got
            seq.status = Status.RUNNING
            bisect.insort(self.running, seq, key=lambda s: s.arrival)  # youngest last, for preemption
            out.items.append(Scheduled(seq, seq.num_computed, n))
            budget -= n
        return out

    def complete(self, sched: Schedule) -> None:
        """Record that the scheduled tokens now have KV in the cache."""
        for item in sched.items:
            item.seq.num_computed = item.start + item.n

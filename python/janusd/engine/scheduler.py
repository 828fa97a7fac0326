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

Waiting for pages. On a shared device the pages a model lacks are usually held by OTHER
models' requests (or by this model's KV_READY/IMPORTING P/D sequences, which are outside
the queues), and those return them within moments. So a sequence that cannot get a
block while nothing else of its model runs (the sole running sequence cannot grow, or
the head of the queue cannot be admitted with nothing running) does not fail: the sole
runner is preempted back to the queue (its pages go back, so two models short of pages
never hold each other's), and the head stays waiting. Its `kv_wait_since` records when
it started waiting (the caller's clock, passed as `now`: no clock is read here); it is
cleared when the sequence is admitted again with blocks for ALL its tokens (a waiter is
never re-admitted piecemeal, so it cannot bounce between a partial prefill and the wall:
each admission after a wait reaches the next token), and when it waits behind running
sequences of its own model (that is ordinary queueing; they progress). After
`kv_wait_timeout_s` of waiting it fails ("KV cache exhausted ..."); 0 fails at once.

A request whose KV can NEVER fit - prompt + max_tokens need more blocks than
`max_blocks` (the model's KV region, or the device pool less this model's own weights,
whichever is smaller) - fails at the next schedule() without waiting, as does a running
sequence (e.g. imported) that reaches that ceiling.

step() can never loop forever: with no progress possible, schedule() returns an empty
Schedule (the engine reports it as stalled so the worker waits instead of spinning) and
the timeout ends the wait. Failed sequences are in `Schedule.failed`, blocks freed, the
reason in `seq.fail_reason`.

The scheduler knows sequences and block ids, never tensors; `blocks` is anything with
`allocate(n) -> list[int] | None`, `free(ids)` and `max_blocks` (PagedKVCache or a
BlockAllocator).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from janusd.engine.sequence import Sequence, Status


class BlockSource(Protocol):
    @property
    def max_blocks(self) -> int: ...

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
    failed: list[Sequence] = field(default_factory=list)  # never fits, or waited too long (blocks freed)

    @property
    def num_tokens(self) -> int:
        return sum(i.n for i in self.items)


class Scheduler:
    def __init__(self, block_size: int, max_num_seqs: int, max_num_batched_tokens: int, blocks: BlockSource,
                 kv_wait_timeout_s: float = 0.0, max_blocks: int | None = None) -> None:
        """`max_blocks`: the most blocks this model can ever hold (None: `blocks.max_blocks`)."""
        if block_size < 1 or max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1")
        if not kv_wait_timeout_s >= 0:
            raise ValueError(f"kv_wait_timeout_s must be >= 0, got {kv_wait_timeout_s}")
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.blocks = blocks
        self.kv_wait_timeout_s = kv_wait_timeout_s
        self._max_blocks = max_blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._never_fit: list[Sequence] = []

    @property
    def max_blocks(self) -> int:
        return self._max_blocks if self._max_blocks is not None else int(self.blocks.max_blocks)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._never_fit)

    def waiting_for_pages(self) -> bool:
        """Nothing of this model runs and its queue head waits for pages other owners hold:
        another schedule() right now would do nothing."""
        return not self.running and not self._never_fit and bool(self.waiting) and \
            self.waiting[0].kv_wait_since is not None

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        seq.kv_wait_since = None
        if self._blocks_for(seq.prompt_len + seq.params.max_tokens) > self.max_blocks:
            self._never_fit.append(seq)  # reported by the next schedule(), without waiting
        else:
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
        elif seq in self._never_fit:
            self._never_fit.remove(seq)
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

    def _fail_never(self, seq: Sequence, blocks: int, out: Schedule) -> None:
        self.remove(seq)
        seq.fail_reason = (
            f"KV cache exhausted: this request needs {blocks} KV blocks of {self.block_size} tokens but at most "
            f"{self.max_blocks} can ever fit for this model on this device (its KV region, or the device pool less "
            "its weights); it can never run here"
        )
        out.failed.append(seq)

    def _waited_out(self, seq: Sequence, now: float) -> bool:
        """Start (or continue) `seq`'s wait for pages; True once it has waited too long."""
        if seq.kv_wait_since is None:
            seq.kv_wait_since = now
        waited = now - seq.kv_wait_since
        if waited < self.kv_wait_timeout_s:
            return False
        seq.fail_reason = (
            f"KV cache exhausted: waited {waited:.2f} s (kv_wait_timeout_s = {self.kv_wait_timeout_s:g}) for KV "
            "pages that other requests on this device hold"
        )
        return True

    def schedule(self, now: float) -> Schedule:
        """One step's work. `now` is the caller's monotonic clock in seconds (waits for
        pages are measured with it)."""
        out = Schedule()
        while self._never_fit:
            seq = self._never_fit[0]
            self._fail_never(seq, self._blocks_for(seq.prompt_len + seq.params.max_tokens), out)
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            total = self._blocks_for(seq.num_computed + n)
            need = total - len(seq.blocks)
            got = self.blocks.allocate(need) if need > 0 else []
            while got is None:
                victim = self.running[-1]
                if victim is seq and len(self.running) == 1:
                    # nothing of this model is left to preempt: the pages are held by other
                    # owners (or it can never have them); wait for them off the running list
                    if total > self.max_blocks:
                        self._fail_never(seq, total, out)
                    elif self._waited_out(seq, now):
                        self.remove(seq)
                        out.failed.append(seq)
                    else:
                        since = seq.kv_wait_since
                        self._preempt(seq)
                        seq.kv_wait_since = since
                        out.preempted.append(seq)
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
        if self.running and self.waiting:  # queued behind its own model, which progresses (even when
            self.waiting[0].kv_wait_since = None  # no budget or seat is left to try admitting it)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = min(seq.num_tokens - seq.num_computed, budget)
            want = self._blocks_for(n)
            if seq.kv_wait_since is not None:  # after a wait: all its tokens' blocks at once
                want = max(want, self._blocks_for(seq.num_tokens))
            got = self.blocks.allocate(want)
            if got is None and not self.running and seq.kv_wait_since is None:
                n = min(n, self.block_size)  # the smallest useful chunk
                got = self.blocks.allocate(1)
            if got is None:
                if self.running:
                    seq.kv_wait_since = None  # queued behind its own model, which progresses
                elif self._waited_out(seq, now):
                    self.waiting.popleft()
                    out.failed.append(seq)
                    continue
                break
            self.waiting.popleft()
            seq.blocks = got
            seq.kv_wait_since = None
            seq.status = Status.RUNNING
            bisect.insort(self.running, seq, key=lambda s: s.arrival)  # youngest last, for preemption
            out.items.append(Scheduled(seq, seq.num_computed, n))
            budget -= n
        return out

    def complete(self, sched: Schedule) -> None:
        """Record that the scheduled tokens now have KV in the cache."""
        for item in sched.items:
            item.seq.num_computed = item.start + item.n

"""A shard's side of tensor parallelism: its collectives (TPShard, what LlamaModel calls),
the leader's announcements (LeaderLink) and the followers' loop (Follower).

Lockstep: the leader (rank 0) owns the one scheduler, the sequences and the sampler of
the instance (an ordinary ModelEngine). Before each forward it announces the step: the
packed token ids and positions, the decode and prefill block tables, and the rows that
sample; every follower rebuilds the same attention metadata and runs the same forward on
its shard, so the collectives inside the forward meet. KV block ids are the leader's:
every shard's KV region has the same blocks (a shard's block holds its own KV heads, the
same bytes on every shard), and when the leader's region maps pages or gives them back,
the followers' regions do the same first (LeaderLink.kv_pages): a follower that cannot
map them makes the leader's allocation fail as a full pool would (the request waits).

An announcement is one broadcast of HEAD int64s (op, payload length, the model's slot:
a group of devices may hold several tp models, as a device holds several models; then the
payload's first HEAD - 3 ints: a decode step of a small batch fits), and a second one
only for a longer payload. On gloo each collective costs about a millisecond on the 2-core VM this
was built on (bench/RESULTS.md "tp"), so fewer is faster.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from janusd.engine.models.attention import build_attn_batch
from janusd.engine.runner import stream_scope
from janusd.engine.tp.comm import TPComm
from janusd.engine.tp.layout import ShardLayout
from janusd.engine.types import EngineError

HEAD = 256
OP_STEP, OP_KV_PAGES, OP_CALL, OP_STOP = 1, 2, 3, 4


class TPShard:
    """What the forward of one shard needs: its layout and the group's collectives."""

    def __init__(self, layout: ShardLayout, comm: TPComm) -> None:
        self.layout = layout
        self.comm = comm

    def all_reduce(self, t: torch.Tensor) -> None:
        self.comm.all_reduce(t)

    def gather_vocab(self, local: torch.Tensor) -> torch.Tensor:
        """[rows, vocab_per] logits of this shard's vocabulary slice -> [rows, vocab]."""
        parts = self.comm.all_gather(local)
        return torch.cat(parts, dim=-1)[:, : self.layout.arch.vocab_size]


# ---- step encoding ---------------------------------------------------------------------
def encode_step(ids: list[int], pos: list[int], decodes: list[tuple[list[int], int]],
                prefills: list[tuple[list[int], int, int]], rows: list[int], block_size: int) -> list[int]:
    """One step as ints: [T, decodes, prefills, rows] ids pos rows, then per decode
    (ctx, nb, table[:nb]) and per prefill (start, n, nb, table[:nb]); nb = the blocks the
    step can touch (not the sequence's whole table)."""
    out = [len(ids), len(decodes), len(prefills), len(rows), *ids, *pos, *rows]
    for table, ctx in decodes:
        nb = -(-ctx // block_size)
        out += [ctx, nb, *table[:nb]]
    for table, start, n in prefills:
        nb = -(-(start + n) // block_size)
        out += [start, n, nb, *table[:nb]]
    return out


def decode_step(p: list[int]) -> tuple[list[int], list[int], list[tuple[list[int], int]],
                                       list[tuple[list[int], int, int]], list[int]]:
    t, nd, npf, nr = p[0], p[1], p[2], p[3]
    at = 4
    ids = p[at : at + t]
    pos = p[at + t : at + 2 * t]
    rows = p[at + 2 * t : at + 2 * t + nr]
    at += 2 * t + nr
    decodes: list[tuple[list[int], int]] = []
    for _ in range(nd):
        ctx, nb = p[at], p[at + 1]
        decodes.append((p[at + 2 : at + 2 + nb], ctx))
        at += 2 + nb
    prefills: list[tuple[list[int], int, int]] = []
    for _ in range(npf):
        start, n, nb = p[at], p[at + 1], p[at + 2]
        prefills.append((p[at + 3 : at + 3 + nb], start, n))
        at += 3 + nb
    if at != len(p):
        raise EngineError(f"tp step announcement: {len(p) - at} ints left over (leader and follower disagree)")
    return ids, pos, decodes, prefills, rows


# ---- the leader's end --------------------------------------------------------------------
_INLINE = HEAD - 3


class LeaderLink:
    """Rank 0's announcements to the followers (cpu group broadcasts) about the model in
    `slot` (the followers' index of it; -1: no model, group commands)."""

    def __init__(self, comm: TPComm, slot: int = -1) -> None:
        self.comm = comm
        self.slot = slot
        self.block_size = 0

    def for_model(self, slot: int) -> LeaderLink:
        return LeaderLink(self.comm, slot)

    def _send(self, op: int, payload: list[int]) -> None:
        t0 = time.perf_counter()
        head = torch.zeros(HEAD, dtype=torch.int64)
        head[0], head[1], head[2] = op, len(payload), self.slot
        first = payload[:_INLINE]
        if first:
            head[3 : 3 + len(first)] = torch.tensor(first, dtype=torch.int64)
        self.comm.broadcast_(head)
        if len(payload) > _INLINE:
            self.comm.broadcast_(torch.tensor(payload[_INLINE:], dtype=torch.int64))
        self.comm.announce_s += time.perf_counter() - t0

    def announce_step(self, ids: list[int], pos: list[int], decodes: list[tuple[list[int], int]],
                      prefills: list[tuple[list[int], int, int]], rows: list[int]) -> None:
        """ModelEngine.step calls this just before its forward (runner.py `group`)."""
        self._send(OP_STEP, encode_step(ids, pos, decodes, prefills, rows, self.block_size))

    def kv_pages(self, pages: int) -> bool:
        """Every follower's KV region to `pages` mapped pages (PagedKVCache.mirror): True when
        all of them have them (growing may fail on a full device; shrinking does not)."""
        self._send(OP_KV_PAGES, [pages])
        return self.comm.agree(True)

    def call(self, data: bytes) -> None:
        """A command for every follower (JSON; Follower.on_call), sent after the header."""
        self._send(OP_CALL, [])
        self.comm.broadcast_bytes(data)

    def stop(self) -> None:
        self._send(OP_STOP, [])


def attach_leader(me: Any, link: LeaderLink) -> None:
    """Make a shard's ModelEngine the leader of its instance: it announces every step and
    mirrors its KV pages onto the followers."""
    if me.role != "mixed":
        raise EngineError(f"model {me.name!r}: tp > 1 serves the mixed role only (P/D export/import of a "
                          f"tensor-parallel instance's KV, one piece per shard, is not built); got role {me.role!r}")
    link.block_size = me.block_size
    me.group = link
    me.kv.mirror = link.kv_pages


# ---- a follower's end --------------------------------------------------------------------
class Follower:
    """Rank > 0: receive the leader's announcements and run the same forward on this
    shard, until OP_STOP. `on_call(bytes)` answers OP_CALL commands (proc.py).
    `models[slot]` is this shard's ModelEngine of each model the leader loaded (its model
    and KV cache; its scheduler stays unused)."""

    def __init__(self, comm: TPComm, on_call: Any) -> None:
        self.comm = comm
        self.on_call = on_call
        self.models: dict[int, Any] = {}

    def _recv(self) -> tuple[int, int, list[int]]:
        head = self.comm.broadcast_(torch.zeros(HEAD, dtype=torch.int64))
        op, n, slot = int(head[0]), int(head[1]), int(head[2])
        payload = head[3 : 3 + min(n, _INLINE)].tolist()
        if n > _INLINE:
            payload += self.comm.broadcast_(torch.zeros(n - _INLINE, dtype=torch.int64)).tolist()
        return op, slot, payload

    def serve(self) -> None:
        while True:
            op, slot, payload = self._recv()
            if op == OP_STOP:
                return
            if op == OP_STEP:
                self.step(slot, payload)
            elif op == OP_KV_PAGES:
                self.comm.agree(self._map(slot, payload[0]))
            elif op == OP_CALL:
                self.on_call(self.comm.broadcast_bytes(None))
            else:
                raise EngineError(f"tp follower: unknown op {op} from the leader")

    def _map(self, slot: int, pages: int) -> bool:
        from janusd.memory import XTensorError

        me = self.models.get(slot)
        if me is None:
            return False
        try:
            me.kv.region.resize(pages)
        except XTensorError:
            return False
        return True

    def step(self, slot: int, payload: list[int]) -> None:
        me = self.models.get(slot)
        if me is None:
            raise EngineError(f"tp follower: a step of model slot {slot} was announced, which this shard lacks")
        ids, pos, decodes, prefills, rows = decode_step(payload)
        meta = build_attn_batch(decodes, prefills, me.block_size, me.device, window=me._window)
        input_ids = torch.tensor(ids, dtype=torch.long, device=me.device)
        positions = torch.tensor(pos, dtype=torch.long, device=me.device)
        with torch.inference_mode(), stream_scope(me._stream):
            hidden = me.model.forward(input_ids, positions, meta, me._kv_layers)
            if rows:
                me.model.logits(hidden[rows])  # its part of the logits gather

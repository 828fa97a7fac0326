"""Attention over the paged KV cache, on any torch device, with SDPA.

One step's tokens are packed as rows: first one row per *decoding* sequence, then the
chunks of *prefilling* sequences. Decodes run as one batched SDPA call: each sequence's
KV is gathered from its blocks into a padded [S, L, kv_heads, head_dim] tensor with a
length mask, and the G query heads that share a KV head are laid out as G "queries" of
that head, so GQA needs no repeat. Prefill chunks run one SDPA call each (their compute
dwarfs the call overhead); a chunk with earlier context gathers it from the cache and
uses an offset causal mask. `AttnBatch` is built once per step and shared by all layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from janusd.engine.models import qkernel


@dataclass
class PrefillChunk:
    row0: int
    n: int
    ctx_len: int                       # tokens of context including this chunk
    blk: torch.Tensor | None = None    # [ctx_len] block ids to gather (None: no earlier context)
    off: torch.Tensor | None = None
    mask: torch.Tensor | None = None   # [n, ctx_len] bool, True = attend


@dataclass
class AttnBatch:
    num_rows: int
    write_blk: torch.Tensor | None      # [T] block id of each row's new KV (None: no cache)
    write_off: torch.Tensor | None
    num_decode: int = 0
    dec_blk: torch.Tensor | None = None  # [S, Lmax]
    dec_off: torch.Tensor | None = None
    # one decoding sequence: its first Lmax slots are all written, so whole blocks are
    # gathered (index_select, a copy per block: ~4x cheaper here than the (block, offset)
    # gather, which the padded batch of several sequences keeps) and cut at Lmax
    dec_blocks: torch.Tensor | None = None  # [ceil(Lmax / block_size)]
    dec_mask: torch.Tensor | None = None  # [S, 1, 1, Lmax] float32, 0 = attend, -inf = not; None: all attend
    prefills: list[PrefillChunk] = field(default_factory=list)


def _slots(table: list[int], start: int, stop: int, block_size: int) -> tuple[list[int], list[int]]:
    blk = [table[p // block_size] for p in range(start, stop)]
    off = [p % block_size for p in range(start, stop)]
    return blk, off


def build_attn_batch(decodes: list[tuple[list[int], int]], prefills: list[tuple[list[int], int, int]],
                     block_size: int, device: torch.device, use_cache: bool = True,
                     window: int | None = None) -> AttnBatch:
    """decodes: (block_table, ctx_len) with the new token at position ctx_len-1;
    prefills: (block_table, start, n) computing positions [start, start+n).
    `window` (Mistral's sliding window): a query at i sees keys j with i - j < window."""
    wb: list[int] = []
    wo: list[int] = []
    for table, ctx in decodes:
        wb.append(table[(ctx - 1) // block_size])
        wo.append((ctx - 1) % block_size)
    batch = AttnBatch(num_rows=len(decodes) + sum(n for _, _, n in prefills), write_blk=None, write_off=None)
    if decodes:
        lmax = max(c for _, c in decodes)
        nb = (lmax + block_size - 1) // block_size
        tables = torch.tensor([t[:nb] + [t[0]] * (nb - len(t[:nb])) for t, _ in decodes], dtype=torch.long)
        pos = torch.arange(lmax)
        lens = torch.tensor([c for _, c in decodes])
        dmask = pos[None, :] < lens[:, None]
        # A shorter sequence's padding reads its own position 0 (written by its prefill), not
        # the unwritten slots past its length: those hold whatever the pool's page held
        # before (another model's weights, another dtype's KV), and a NaN there poisons the
        # row even masked (softmax weight 0 times NaN is NaN; seen as bfloat16 SmolLM2
        # emitting token 0 on KV pages an fp32 model had used)
        blk = tables[:, pos // block_size]
        batch.dec_blk = torch.where(dmask, blk, blk[:, :1]).to(device)
        batch.dec_off = torch.where(dmask, pos % block_size, 0).to(device)
        if len(decodes) == 1:
            batch.dec_blocks = tables[0].to(device)
        if window is not None:
            dmask &= pos[None, :] >= (lens[:, None] - window)
        if not bool(dmask.all()):  # else (one sequence, no window: batch-1 decode) no mask at all
            # additive, built once per step: SDPA turns a bool mask into this per call (per layer)
            add = torch.zeros(dmask.shape).masked_fill_(~dmask, float("-inf"))
            batch.dec_mask = add.view(len(decodes), 1, 1, lmax).to(device)
        batch.num_decode = len(decodes)
    row = len(decodes)
    for table, start, n in prefills:
        if use_cache:
            b, o = _slots(table, start, start + n, block_size)
            wb += b
            wo += o
        chunk = PrefillChunk(row0=row, n=n, ctx_len=start + n)
        if start > 0:
            cb, co = _slots(table, 0, start + n, block_size)
            chunk.blk = torch.tensor(cb, device=device)
            chunk.off = torch.tensor(co, device=device)
        if start > 0 or (window is not None and n > window):
            q_pos = torch.arange(start, start + n)[:, None]
            k_pos = torch.arange(start + n)[None, :]
            mask = k_pos <= q_pos
            if window is not None:
                mask &= (q_pos - k_pos) < window
            chunk.mask = mask.to(device)
        batch.prefills.append(chunk)
        row += n
    if use_cache:
        batch.write_blk = torch.tensor(wb, dtype=torch.long, device=device)
        batch.write_off = torch.tensor(wo, dtype=torch.long, device=device)
    return batch


def t_is_one(q: torch.Tensor) -> bool:
    return q.shape[0] == 1


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_cache: torch.Tensor | None, v_cache: torch.Tensor | None, meta: AttnBatch) -> torch.Tensor:
    """q: [T, Hq, D]; k, v: [T, Hkv, D]; caches: [num_blocks, block_size, Hkv, D] views.
    Writes this step's k/v into the cache, returns [T, Hq, D]. One float32 sequence decoding
    alone on cpu (batch-1 decode) takes one native call instead (qkernel.decode_attention:
    the KV write, the gather, SDPA and the copies were ~170 us a layer here)."""
    if (meta.num_decode == 1 and t_is_one(q) and not meta.prefills and meta.dec_blocks is not None
            and meta.dec_mask is None and k_cache is not None and v_cache is not None
            and qkernel.decode_attention_fits(q, k_cache, v_cache)):
        return qkernel.decode_attention(q, k, v, k_cache, v_cache, meta.dec_blocks, meta.dec_blk.shape[1])  # type: ignore[union-attr]
    if k_cache is not None and v_cache is not None and meta.write_blk is not None:
        k_cache[meta.write_blk, meta.write_off] = k
        v_cache[meta.write_blk, meta.write_off] = v
    t, hq, d = q.shape
    hkv = k.shape[1]
    out = torch.empty_like(q)
    s = meta.num_decode
    if s:
        if k_cache is None or v_cache is None:
            raise RuntimeError("decode rows need a KV cache")
        if meta.dec_blocks is not None:
            n, bs = meta.dec_blocks.shape[0], k_cache.shape[1]
            ln = meta.dec_blk.shape[1]  # type: ignore[union-attr]
            kk = k_cache.index_select(0, meta.dec_blocks).view(1, n * bs, hkv, d)[:, :ln].transpose(1, 2)
            vv = v_cache.index_select(0, meta.dec_blocks).view(1, n * bs, hkv, d)[:, :ln].transpose(1, 2)
        else:
            kk = k_cache[meta.dec_blk, meta.dec_off].transpose(1, 2)  # [S, Hkv, L, D]
            vv = v_cache[meta.dec_blk, meta.dec_off].transpose(1, 2)
        qd = q[:s].view(s, hkv, hq // hkv, d)
        mask = meta.dec_mask
        if mask is not None and mask.dtype != q.dtype:  # once per step: the layers share it
            meta.dec_mask = mask = mask.to(q.dtype)
        o = F.scaled_dot_product_attention(qd, kk, vv, attn_mask=mask)
        out[:s] = o.reshape(s, hq, d)
    for c in meta.prefills:
        qp = q[c.row0 : c.row0 + c.n].transpose(0, 1)
        if c.blk is None:
            kp = k[c.row0 : c.row0 + c.n].transpose(0, 1)
            vp = v[c.row0 : c.row0 + c.n].transpose(0, 1)
            causal = c.mask is None and c.n > 1
            o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=c.mask, is_causal=causal, enable_gqa=hq != hkv)
        else:
            if k_cache is None or v_cache is None:
                raise RuntimeError("a prefill chunk with earlier context needs a KV cache")
            kp = k_cache[c.blk, c.off].transpose(0, 1)
            vp = v_cache[c.blk, c.off].transpose(0, 1)
            o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=c.mask, enable_gqa=hq != hkv)
        out[c.row0 : c.row0 + c.n] = o.transpose(0, 1)
    return out

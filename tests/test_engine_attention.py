"""Batched decode attention over the paged KV cache: a sequence's result must not depend on
what else is in the batch, nor on what the pool's pages held before.

KV pages are shared by every model on a device; a slot no step has written yet still holds
the previous tenant's bytes (another model's weights, another dtype's KV), and reinterpreted
as bfloat16 those are NaN or Inf often. The batched decode pads shorter sequences up to the
longest; the padding is masked, but a masked NaN still poisons the row (its softmax weight 0
times NaN is NaN). Here the caches start as all NaN, so any read of an unwritten slot shows."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.engine.models.attention import build_attn_batch, paged_attention

HKV, G, D = 2, 3, 8  # GQA: 3 query heads per KV head


def _decode(qs, ks, vs, tables, lens, k_cache, v_cache, block_size):
    """One batched decode step: row i is sequence i's new token at position lens[i]-1."""
    meta = build_attn_batch([(t, n) for t, n in zip(tables, lens)], [], block_size, torch.device("cpu"))
    return paged_attention(torch.stack(qs), torch.stack(ks), torch.stack(vs), k_cache, v_cache, meta)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 23), min_size=1, max_size=5), st.sampled_from([1, 4, 8]),
       st.sampled_from([torch.float32, torch.bfloat16]), st.integers(0, 2**16))
def test_batched_decode_equals_each_alone_over_unwritten_nan_slots(lens, block_size, dtype, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    blocks_per = [(n + block_size - 1) // block_size for n in lens]
    num_blocks = sum(blocks_per) + 2
    k_cache = torch.full((num_blocks, block_size, HKV, D), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    # blocks handed out in reverse, interleaved order: tables are not contiguous runs
    ids = list(range(num_blocks))[::-1]
    tables = []
    for nb in blocks_per:
        tables.append(ids[:nb])
        ids = ids[nb:]
    # every position before each sequence's new token written, as its earlier steps did
    for t, n in zip(tables, lens):
        for p in range(n - 1):
            k_cache[t[p // block_size], p % block_size] = torch.randn(HKV, D, generator=gen).to(dtype)
            v_cache[t[p // block_size], p % block_size] = torch.randn(HKV, D, generator=gen).to(dtype)
    qs = [torch.randn(HKV * G, D, generator=gen).to(dtype) for _ in lens]
    ks = [torch.randn(HKV, D, generator=gen).to(dtype) for _ in lens]
    vs = [torch.randn(HKV, D, generator=gen).to(dtype) for _ in lens]
    alone = [_decode([qs[i]], [ks[i]], [vs[i]], [tables[i]], [lens[i]], k_cache.clone(), v_cache.clone(), block_size)[0]
             for i in range(len(lens))]
    together = _decode(qs, ks, vs, tables, lens, k_cache, v_cache, block_size)
    assert torch.isfinite(together.float()).all()
    for i, a in enumerate(alone):
        # the reference: plain softmax attention over the sequence's own positions
        kk = torch.stack([k_cache[tables[i][p // block_size], p % block_size] for p in range(lens[i])]).float()
        vv = torch.stack([v_cache[tables[i][p // block_size], p % block_size] for p in range(lens[i])]).float()
        q = qs[i].float().view(HKV, G, D)
        w = torch.softmax(torch.einsum("hgd,lhd->hgl", q, kk) / D ** 0.5, dim=-1)
        ref = torch.einsum("hgl,lhd->hgd", w, vv).reshape(HKV * G, D)
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(together[i].float(), ref, rtol=tol, atol=tol)
        torch.testing.assert_close(together[i].float(), a.float(), rtol=tol, atol=tol)

"""The native RMSNorm and batch-1 decode attention (engine/models/qkernel.py over
rust/janus-core/src/cpuops.rs) against torch's own ops on the same inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.engine.models import qkernel
from janusd.engine.models.attention import build_attn_batch, paged_attention

pytestmark = pytest.mark.skipif(not qkernel.available(), reason="this build of janusd._native lacks the cpu kernels")


@given(rows=st.integers(1, 5), cols=st.sampled_from([8, 64, 576]), seed=st.integers(0, 2**16), add=st.booleans())
@settings(max_examples=30, deadline=None)
def test_rms_norm_with_residual_equals_torch(rows: int, cols: int, seed: int, add: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, cols, generator=g) * 3
    r = torch.randn(rows, cols, generator=g) if add else None
    w = torch.randn(cols, generator=g)
    want_h = h + r if r is not None else h.clone()
    want = F.rms_norm(want_h, (cols,), w, 1e-5)
    got = qkernel.add_rms_norm(h, r, w, 1e-5)
    assert torch.equal(h, want_h)  # the residual went into h in place
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rms_norm_refuses_what_it_cannot_take() -> None:
    h = torch.randn(2, 8)
    with pytest.raises(ValueError):
        qkernel.add_rms_norm(h, h, torch.ones(8), 1e-5)  # the residual is h itself
    with pytest.raises(ValueError):
        qkernel.add_rms_norm(h.t(), None, torch.ones(2), 1e-5)  # not contiguous


@given(ctx=st.integers(1, 40), seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_decode_attention_equals_the_sdpa_path_on_a_strided_kv_region(ctx: int, seed: int) -> None:
    """One sequence, blocks of 4 in a region whose blocks hold two layers (stride 2x a
    block): the native path (paged_attention takes it) against the SDPA path (forced by a
    batch of two identical sequences)."""
    g = torch.Generator().manual_seed(seed)
    bs, hkv, hq, d, nblk = 4, 2, 6, 16, 12
    region = torch.randn(nblk, 2, 2, bs, hkv, d, generator=g)  # [block, layer, k/v, ...]
    kc, vc = region[:, 1, 0], region[:, 1, 1]
    table = torch.randperm(nblk, generator=g)[: -(-ctx // bs)].tolist()
    q, k, v = (torch.randn(1, h, d, generator=g) for h in (hq, hkv, hkv))
    assert qkernel.decode_attention_fits(q, kc, vc) and not kc.is_contiguous()
    kc2, vc2 = kc.clone(), vc.clone()
    one = build_attn_batch([(table, ctx)], [], bs, q.device)
    got = paged_attention(q, k, v, kc, vc, one)
    two = build_attn_batch([(table, ctx), (table, ctx)], [], bs, q.device)
    want = paged_attention(q.expand(2, -1, -1), k.expand(2, -1, -1), v.expand(2, -1, -1), kc2, vc2, two)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)  # the same KV written
    assert torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-6)

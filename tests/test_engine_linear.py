"""engine/models/linear.py: oneDNN for the forward's multi-row products on cpu, with the
same results as F.linear (to float32 rounding) and the same greedy generations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_fixtures import write_hf_checkpoint
from janusd.config import EngineConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.models import linear as lin
from janusd.engine.runner import SamplingParams

pytestmark = pytest.mark.skipif(not lin.onednn_available(), reason="torch built without oneDNN")


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 40), n_in=st.integers(1, 96), n_out=st.integers(1, 96), bias=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_matches_f_linear_to_float32_rounding(rows: int, n_in: int, n_out: int, bias: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=g)
    w = torch.randn(n_out, n_in, generator=g)
    b = torch.randn(n_out, generator=g) if bias else None
    got, want = lin.linear(x, w, b), F.linear(x, w, b)
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * n_in ** 0.5)
    if rows == 1:  # one row stays on F.linear: bit for bit
        assert torch.equal(got, want)


def test_weights_are_read_where_they_are_each_call() -> None:
    """No copy of the weights is kept between calls: a weight segment's bytes change when
    a model is restored into pages another model used."""
    x = torch.randn(9, 32)
    w = torch.randn(48, 32)
    first = lin.linear(x, w)
    w.mul_(-2.0)
    torch.testing.assert_close(lin.linear(x, w), -2.0 * first, rtol=1e-5, atol=1e-5)


def test_non_float32_and_non_cpu_inputs_use_f_linear() -> None:
    x = torch.randn(9, 16, dtype=torch.bfloat16)
    w = torch.randn(8, 16, dtype=torch.bfloat16)
    assert torch.equal(lin.linear(x, w), F.linear(x, w))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_greedy_generations_identical_to_f_linear(arch: str, tmp_path, monkeypatch) -> None:
    ck, _ = write_hf_checkpoint(tmp_path / arch, arch, seed=5)
    de = DeviceEngine(kind="cpu", memory_bytes=32 << 20, page_size=64 << 10)
    me = de.load_model(ModelConfig(name="m", checkpoint=str(ck), kv_cache_mib=1, max_model_len=256),
                       EngineConfig(block_size=4, max_num_batched_tokens=512, max_num_seqs=8))
    prompts = {f"p{i}": [(11 * i + 5 * j) % 480 + 20 for j in range(n)] for i, n in enumerate([2, 9, 17, 33])}
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)

    def run() -> dict[str, list[int]]:
        outs = me.generate(prompts, params)
        return {rid: [t for o in os for t in o.token_ids] for rid, os in outs.items()}

    with_onednn = run()
    monkeypatch.setattr(lin, "_ONEDNN", None)
    assert run() == with_onednn


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 9), n_out=st.integers(1, 2600), n_in=st.integers(1, 80), seed=st.integers(0, 2**31 - 1))
def test_float16_weight_products_within_their_rounding(rows: int, n_out: int, n_in: int, seed: int) -> None:
    """A packed plan's float16 LM head (half_weight_linear): up to HALF_ROWS rows the float16
    product rounds x and the output to float16 (2^-11 relative each, sums in float32); from
    there the weight is upcast by blocks of UPCAST_ROWS (n_out up to 2600 crosses two block
    edges and a short tail) and multiplied in float32: the float32 product of the float16
    weights to float32 rounding."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=g)
    w = (torch.randn(n_out, n_in, generator=g) * 0.05).half()
    got = lin.linear(x, w)
    ref = x.double() @ w.double().t()
    mag = x.abs().double() @ w.abs().double().t()
    assert got.shape == (rows, n_out) and got.dtype == torch.float32
    if rows <= lin.HALF_ROWS:
        bound = 2 * (2**-11 * mag + 2**-11 * ref.abs()) + 1e-7  # float16's subnormals: 6e-8 apart
    else:
        bound = 2**-22 * n_in * mag
    assert ((got.double() - ref).abs() <= bound).all()

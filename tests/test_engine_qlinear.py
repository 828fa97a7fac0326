"""GGUF Q4_0/Q4_1 linears kept packed (engine/models/qlinear.py): the block decoding, the
kernel against a float reference, greedy outputs against the dequantized float32 model of
the same file, and the packed bytes through a Warm copy, an overlapped restore and a
host image."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize

from gguf_fixtures import demo_vocab, write_gguf
from janusd.config import EngineConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine, weight_plan
from janusd.engine.loader import ModelArch, expected_tensor_shapes, open_checkpoint
from janusd.engine.models import qlinear
from janusd.engine.models.qlinear import Q4Linear, decode_blocks, dequantize_reference, pack
from janusd.engine.restore import Copier
from janusd.engine.types import SamplingParams
from janusd.engine.worker_fork import layout_signature

Q = gguf.GGMLQuantizationType
pytestmark = pytest.mark.skipif(not qlinear.q4_available(), reason="torch lacks the packed int4 cpu kernels")
torch.set_num_threads(1)
PROMPTS = {"a": [5, 6, 7, 8, 9], "b": [11, 3, 40, 2, 7, 7, 100], "c": [200]}


def _quantized(rng: np.random.Generator, n: int, k: int, qtype: Q) -> np.ndarray:
    return quantize((rng.standard_normal((n, k)) * 0.05 + rng.uniform(-0.02, 0.02)).astype(np.float32), qtype)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1])
def test_blocks_decode_to_what_gguf_dequantizes(qtype: Q) -> None:
    raw = _quantized(np.random.default_rng(1), 48, 96, qtype)
    q, d, m = decode_blocks(raw, qtype.name.lower())
    assert q.shape == (48, 96) and q.max() <= 15 and (m is None) == (qtype == Q.Q4_0)
    assert torch.equal(dequantize_reference(q, d, m), torch.from_numpy(dequantize(raw, qtype)))


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1])
def test_kernel_against_float_reference(qtype: Q) -> None:
    rng = np.random.default_rng(2)
    q, d, m = decode_blocks(_quantized(rng, 64, 128, qtype), qtype.name.lower())
    w = dequantize_reference(q, d, m)
    packed, sz = pack(q, d, m)
    x = torch.from_numpy(rng.standard_normal((5, 128)).astype(np.float32))
    ref = x.double() @ w.double().t()
    s, z = sz[..., 0].t().repeat_interleave(32, 1), sz[..., 1].t().repeat_interleave(32, 1)
    mag = x.abs().double() @ ((torch.from_numpy(q.astype(np.float32)) - 8).abs() * s.abs() + z.abs()).double().t()
    # float32 scales: the file's weights up to float32 rounding of m + 8d, summed in another
    # order: within a few float32 ulps (2^-24) of the sum of the terms' magnitudes
    exact = Q4Linear(packed, sz.clone())(x)
    assert ((exact.double() - ref).abs() <= 2**-24 * 16 * mag).all()
    # bfloat16 (the kernel's fast path): x, the scales and the zeros rounded to 8 significant
    # bits (relative 2^-9 each), products summed in float32, the output rounded (2^-9): each
    # term x*((q-8)s + z) is off by at most ~3 * 2^-9 of |x|(|q-8||s| + |z|), the sum by that
    # sum, the output by 2^-9 of itself. Asserted with 2x slack.
    fast = Q4Linear(packed, sz.to(torch.bfloat16))(x)
    bound = 2 * (3 * 2**-9 * mag + 2**-9 * ref.abs())
    assert fast.dtype == torch.float32 and ((fast.double() - ref).abs() <= bound).all()
    assert not torch.equal(fast, exact)  # the bound is not vacuous: bf16 does round


def test_packing_is_row_independent_so_fused_matrices_pack_by_part() -> None:
    rng = np.random.default_rng(3)
    q, d, m = decode_blocks(_quantized(rng, 96, 64, Q.Q4_1), "q4_1")
    whole, sz = pack(q, d, m)
    top, sz_top = pack(q[:32], d[:32], m[:32])
    rest, sz_rest = pack(q[32:], d[32:], m[32:])
    assert torch.equal(torch.cat([top, rest]), whole) and torch.equal(torch.cat([sz_top, sz_rest], 1), sz)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return demo_vocab(tmp_path_factory.mktemp("v"))


def _tiny_gguf(path: Path, vocab: dict, arch: str, qtype: Q) -> Path:
    a = ModelArch(architecture=arch, vocab_size=len(vocab["tokens"]), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=arch == "qwen2")
    rng = np.random.default_rng(4)
    # a larger scale than an init's: logits that differ enough for greedy decoding to mean something
    weights = {n: (rng.standard_normal(s) * (0.02 if len(s) == 1 else 0.15)).astype(np.float32)
               for n, s in expected_tensor_shapes(a).items()}
    for n in weights:
        if n.endswith("layernorm.weight") or n == "model.norm.weight":
            weights[n] = np.ones_like(weights[n])
    write_gguf(path, a, weights, qtype, vocab)
    return path


def _greedy(de: DeviceEngine, name: str, n: int = 16) -> dict[str, list[int]]:
    out = de.models[name].generate(dict(PROMPTS), SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    return {r: [t for o in outs for t in o.token_ids] for r, outs in out.items()}


def _load(de: DeviceEngine, name: str, path: Path, dtype: str) -> None:
    de.load_model(ModelConfig(name=name, checkpoint=str(path), dtype=dtype, kv_cache_mib=4, max_model_len=256),
                  EngineConfig())


@pytest.mark.parametrize(("arch", "qtype"), [("llama", Q.Q4_0), ("llama", Q.Q4_1), ("qwen2", Q.Q4_1)])
def test_greedy_of_packed_equals_dequantized_float32(tmp_path: Path, vocab: dict, arch: str, qtype: Q,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's float32 path (the file's weights exactly) gives the reference's tokens;
    the bfloat16 path `auto` runs stays within its rounding of the reference's logits."""
    path = _tiny_gguf(tmp_path / "q.gguf", vocab, arch, qtype)
    de = DeviceEngine(memory_bytes=32 << 20)
    _load(de, "ref", path, "float32")
    ref = _greedy(de, "ref")
    assert len({tuple(v) for v in ref.values()}) == len(PROMPTS)
    monkeypatch.setattr(qlinear, "SCALE_DTYPE", torch.float32)
    monkeypatch.setattr(qlinear, "HEAD_DTYPE", torch.float32)
    _load(de, "exact", path, "auto")
    assert de.models["exact"].weight_bytes < de.models["ref"].weight_bytes  # type: ignore[attr-defined]
    assert isinstance(de.models["exact"].model.layers[0].qkv_w, Q4Linear)
    assert _greedy(de, "exact") == ref
    monkeypatch.undo()
    _load(de, "fast", path, "auto")
    assert de.models["fast"].model.layers[0].gate_up_w.scales.dtype == torch.bfloat16
    assert de.models["fast"].model.lm_head.dtype == torch.float16  # the file's quantized head, in half
    ids = torch.tensor(PROMPTS["b"])
    rows = [_last_logits(de, n, ids) for n in ("ref", "fast")]
    assert (rows[0] - rows[1]).abs().max() <= 0.05 * rows[0].abs().max()
    de.pool.close()


def _last_logits(de: DeviceEngine, name: str, ids: torch.Tensor) -> torch.Tensor:
    from janusd.engine.models.attention import build_attn_batch

    m = de.models[name].model
    meta = build_attn_batch([], [([], 0, len(ids))], 16, ids.device, use_cache=False)
    return m.logits(m.forward(ids, torch.arange(len(ids)), meta, None)[-1:])[0]


def test_packed_bytes_survive_warm_restore_and_host_image(tmp_path: Path, vocab: dict) -> None:
    from janusd.engine.host_image import open_image, write_image

    path = _tiny_gguf(tmp_path / "q.gguf", vocab, "llama", Q.Q4_1)
    de = DeviceEngine(memory_bytes=32 << 20)
    _load(de, "m", path, "auto")
    before = _greedy(de, "m")
    plan = de.models["m"].placement.plan
    assert plan.quant and any(s.dtype == torch.uint8 for s in plan.slots.values())
    host, _ = de.release(de.detach("m"), Copier(1), keep_host=True)
    de.register(de.restore_model(host, Copier(streams=2, chunk_bytes=16 << 10), {}))
    assert _greedy(de, "m") == before
    host, _ = de.release(de.detach("m"), Copier(1), keep_host=True)
    de.register(de.restore_model(host, Copier(streams=2, chunk_bytes=16 << 10), {}, overlap=True))
    assert _greedy(de, "m") == before  # the forward waited for each layer's packed bytes
    ck = open_checkpoint(path)
    root = tmp_path / "image"
    assert write_image(root, ck, plan, layout_signature(plan), "auto", host.buf)
    img = open_image(root, background=False)
    assert layout_signature(weight_plan(img, "auto", "cpu")) == img.meta.layout == layout_signature(plan)
    assert layout_signature(weight_plan(img, "float32", "cpu")) != img.meta.layout
    de.pool.close()


@pytest.mark.slow
def test_smollm2_packed_float32_kernel_equals_dequantized(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real Q4_1 file: the packing (scales, zeros, row order) is the file's weights."""
    spec = "builtin:smollm2-135m-instruct"
    ck = open_checkpoint(spec)
    de = DeviceEngine(memory_bytes=1024 << 20)
    prompt = ck.tokenizer.encode("The capital of France is")
    out = {}
    for name, dtype in (("ref", "float32"), ("exact", "auto")):
        if name == "exact":
            monkeypatch.setattr(qlinear, "SCALE_DTYPE", torch.float32)
            monkeypatch.setattr(qlinear, "HEAD_DTYPE", torch.float32)
        me = de.load_model(ModelConfig(name=name, checkpoint=spec, dtype=dtype, kv_cache_mib=8, max_model_len=128),
                           EngineConfig(), checkpoint=ck)
        outs = me.generate({"r": prompt}, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))["r"]
        out[name] = [t for o in outs for t in o.token_ids]
        de.unload_model(name)
    assert out["exact"] == out["ref"]
    de.pool.close()

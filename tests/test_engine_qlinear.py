"""GGUF Q4_0/Q4_1 linears kept packed and Q8_0 heads kept as blocks (engine/models/qlinear.py,
q8.py, qkernel.py): the block decoding, the kernels against a float reference, greedy
outputs against the dequantized float32 model of the same file, and the packed bytes
through a Warm copy, an overlapped restore and a host image."""

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
from janusd.engine.models import q8, qkernel, qlinear
from janusd.engine.models.q8 import Q8Matrix
from janusd.engine.models.qlinear import Q4Linear, decode_blocks, dequantize_reference, pack
from janusd.engine.restore import Copier
from janusd.engine.types import SamplingParams
from janusd.engine.worker_fork import layout_signature

Q = gguf.GGMLQuantizationType
pytestmark = pytest.mark.skipif(not qlinear.q4_available(), reason="this build of janusd._native lacks the quant kernels")
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


def _bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float32 sums of the same terms in another order: within a few ulps (2^-24) of the sum
    of the terms' magnitudes (each term rounds once, the sums ~log2(K) times)."""
    return 2**-24 * 16 * (x.abs().double() @ w.abs().double().t())


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1])
@pytest.mark.parametrize("rows", [1, 3, 40])  # the kernel (<= MATVEC_ROWS) and dequantized blocks
def test_products_equal_the_dequantized_float_product(qtype: Q, rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    q, d, m = decode_blocks(_quantized(rng, 72, 160, qtype), qtype.name.lower())  # 5 blocks: an odd tail
    w = dequantize_reference(q, d, m)
    lin = Q4Linear(*pack(q, d, m))
    assert torch.equal(lin.dequantize(), w)  # the packing is the file's weights, exactly
    monkeypatch.setattr(qlinear, "DEQUANT_ROWS", 32)  # several dequantized blocks of rows
    x = torch.from_numpy(rng.standard_normal((rows, 160)).astype(np.float32))
    got = lin(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 72)
    assert ((got.double() - x.double() @ w.double().t()).abs() <= _bound(x, w)).all()
    assert torch.equal(lin(x[:1]), got[:1]) or rows > qlinear.MATVEC_ROWS  # rows are independent


def test_q8_blocks_rows_and_products_are_the_files() -> None:
    rng = np.random.default_rng(5)
    raw = _quantized(rng, 40, 96, Q.Q8_0)
    ref = torch.from_numpy(dequantize(raw, Q.Q8_0))
    mat = Q8Matrix(*(torch.from_numpy(a) for a in q8.decode_blocks(raw)))
    assert torch.equal(mat.dequantize(), ref) and mat.nbytes == raw.nbytes
    ids = torch.tensor([3, 0, 39, 3])
    assert torch.equal(mat.rows(ids), ref[ids])
    for n in (1, 2, 7):
        x = torch.from_numpy(rng.standard_normal((n, 96)).astype(np.float32))
        assert ((mat(x).double() - x.double() @ ref.double().t()).abs() <= _bound(x, ref)).all()


def test_threads_split_rows_alike_also_in_a_forked_child() -> None:
    """The kernel's thread pool (rust quant/pool.rs) gives the 1-thread result, and a child
    forked after the pool started (its workers are the parent's only) still computes."""
    import os

    rng = np.random.default_rng(6)
    q, d, m = decode_blocks(_quantized(rng, 200, 96, Q.Q4_1), "q4_1")
    packed, sz = pack(q, d, m)
    x = torch.from_numpy(rng.standard_normal((2, 96)).astype(np.float32))
    one = qkernel.matmul("q4", x, packed, sz, 1)
    assert torch.equal(qkernel.matmul("q4", x, packed, sz, 3), one)
    pid = os.fork()
    if pid == 0:
        os._exit(0 if torch.equal(qkernel.matmul("q4", x, packed, sz, 3), one) else 1)
    assert os.waitpid(pid, 0)[1] == 0


def test_kernel_refuses_what_does_not_fit() -> None:
    qs, sc = torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 1, 2, dtype=torch.float16)
    assert qkernel.matmul("q4", torch.ones(1, 32), qs, sc).shape == (1, 4)
    with pytest.raises(ValueError, match="x must be float32"):
        qkernel.matmul("q4", torch.ones(1, 31), qs, sc)
    with pytest.raises(ValueError, match="q4 weights"):
        qkernel.matmul("q4", torch.ones(1, 32), qs, sc.float())
    with pytest.raises(ValueError, match="q4 weights"):
        qkernel.matmul("q4", torch.ones(1, 64), torch.zeros(4, 32, dtype=torch.uint8)[:, ::2], sc)
    with pytest.raises(ValueError, match="rows"):
        qkernel.dequantize("q4", qs, sc, 3, 2)


def test_packing_is_row_independent_so_fused_matrices_pack_by_part() -> None:
    rng = np.random.default_rng(3)
    q, d, m = decode_blocks(_quantized(rng, 96, 64, Q.Q4_1), "q4_1")
    whole, sz = pack(q, d, m)
    top, sz_top = pack(q[:32], d[:32], m[:32])
    rest, sz_rest = pack(q[32:], d[32:], m[32:])
    assert torch.equal(torch.cat([top, rest]), whole) and torch.equal(torch.cat([sz_top, sz_rest]), sz)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return demo_vocab(tmp_path_factory.mktemp("v"))


def _tiny_gguf(path: Path, vocab: dict, arch: str, qtype: Q, head: Q | None = None) -> Path:
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
    heads = {n: head for n in ("model.embed_tokens.weight", "lm_head.weight") if head}
    write_gguf(path, a, weights, qtype, vocab, qtypes=heads)
    return path


def _greedy(de: DeviceEngine, name: str, n: int = 16) -> dict[str, list[int]]:
    out = de.models[name].generate(dict(PROMPTS), SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    return {r: [t for o in outs for t in o.token_ids] for r, outs in out.items()}


def _load(de: DeviceEngine, name: str, path: Path, dtype: str) -> None:
    de.load_model(ModelConfig(name=name, checkpoint=str(path), dtype=dtype, kv_cache_mib=4, max_model_len=256),
                  EngineConfig())


@pytest.mark.parametrize(("arch", "qtype", "head"), [("llama", Q.Q4_0, None), ("llama", Q.Q4_1, Q.Q8_0),
                                                    ("qwen2", Q.Q4_1, Q.Q8_0), ("llama", Q.Q8_0, Q.Q8_0),
                                                    ("qwen2", Q.Q8_0, Q.Q8_0)])
def test_greedy_of_packed_equals_dequantized_float32(tmp_path: Path, vocab: dict, arch: str, qtype: Q,
                                                     head: Q | None) -> None:
    """`auto` (Q4 linears packed, Q8_0 linears and a Q8_0 head kept as blocks; llama's
    q/k rows un-permuted by whole blocks) gives the dequantized float32 model's tokens, and
    its logits within float32 summation-order noise of them."""
    path = _tiny_gguf(tmp_path / "q.gguf", vocab, arch, qtype, head)
    de = DeviceEngine(memory_bytes=32 << 20)
    _load(de, "ref", path, "float32")
    ref = _greedy(de, "ref")
    assert len({tuple(v) for v in ref.values()}) == len(PROMPTS)
    _load(de, "q", path, "auto")
    model = de.models["q"].model
    assert de.models["q"].weight_bytes < de.models["ref"].weight_bytes  # type: ignore[attr-defined]
    kind = Q8Matrix if qtype == Q.Q8_0 else Q4Linear
    assert isinstance(model.layers[0].qkv_w, kind) and isinstance(model.layers[0].gate_up_w, kind)
    assert isinstance(model.layers[0].o_w, kind) and isinstance(model.layers[0].down_w, kind)
    assert isinstance(model.lm_head, Q8Matrix) == isinstance(model.embed, Q8Matrix) == (head == Q.Q8_0)
    assert _greedy(de, "q") == ref
    ids = torch.tensor(PROMPTS["b"])
    rows = [_last_logits(de, n, ids) for n in ("ref", "q")]
    tol = 1e-4 if head else 0.05  # a float16 head (the file's Q4 embedding) rounds the logits
    assert (rows[0] - rows[1]).abs().max() <= tol * rows[0].abs().max()
    de.pool.close()


def _last_logits(de: DeviceEngine, name: str, ids: torch.Tensor) -> torch.Tensor:
    from janusd.engine.models.attention import build_attn_batch

    m = de.models[name].model
    meta = build_attn_batch([], [([], 0, len(ids))], 16, ids.device, use_cache=False)
    return m.logits(m.forward(ids, torch.arange(len(ids)), meta, None)[-1:])[0]


def test_packed_bytes_survive_warm_restore_and_host_image(tmp_path: Path, vocab: dict) -> None:
    from janusd.engine.host_image import open_image, write_image

    path = _tiny_gguf(tmp_path / "q.gguf", vocab, "llama", Q.Q4_1, Q.Q8_0)
    de = DeviceEngine(memory_bytes=32 << 20)
    _load(de, "m", path, "auto")
    before = _greedy(de, "m")
    plan = de.models["m"].placement.plan
    assert plan.quant and plan.q8 and any(s.dtype == torch.uint8 for s in plan.slots.values())
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
def test_smollm2_packed_equals_dequantized() -> None:
    """The real Q4_1 file (Q8_0 head): the packing (scales, zeros, row order) is the file's
    weights, and the kernels' greedy tokens are the float32 model's."""
    spec = "builtin:smollm2-135m-instruct"
    ck = open_checkpoint(spec)
    de = DeviceEngine(memory_bytes=1024 << 20)
    prompt = ck.tokenizer.encode("The capital of France is")
    out = {}
    for name, dtype in (("ref", "float32"), ("exact", "auto")):
        me = de.load_model(ModelConfig(name=name, checkpoint=spec, dtype=dtype, kv_cache_mib=8, max_model_len=128),
                           EngineConfig(), checkpoint=ck)
        outs = me.generate({"r": prompt}, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))["r"]
        out[name] = [t for o in outs for t in o.token_ids]
        de.unload_model(name)
    assert out["exact"] == out["ref"]
    de.pool.close()

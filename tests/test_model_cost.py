"""engine/model_cost.py: the spec the oracle and the profiler charge is the weights as the
engine keeps them. A quantized GGUF served with `auto` on cpu costs its blocks' bytes (what
each decode step reads), not four bytes per parameter; anything served as floats keeps the
float count, and its stored identity is unchanged."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES

from gguf_fixtures import demo_vocab, write_gguf
from janusd.engine.device_engine import weight_plan
from janusd.engine.loader import ModelArch, expected_tensor_shapes, open_checkpoint
from janusd.engine.model_cost import served_spec
from janusd.engine.models import qlinear
from janusd.hw.devices import device_spec
from janusd.oracle.prior import RooflinePrior

Q = gguf.GGMLQuantizationType
pytestmark = pytest.mark.skipif(not qlinear.q4_available(), reason="this build of janusd._native lacks the quant kernels")


@pytest.fixture(scope="module")
def q4_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A tiny Q4_1 llama with a Q8_0 embedding (SmolLM2's file's mix) and the bytes its
    tensors take in the file, counted from gguf's block sizes."""
    tmp = tmp_path_factory.mktemp("m")
    vocab = demo_vocab(tmp)
    a = ModelArch(architecture="llama", vocab_size=len(vocab["tokens"]), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                  rope_theta=1e4, tie_word_embeddings=True)
    rng = np.random.default_rng(0)
    weights = {n: (rng.standard_normal(s) * 0.1).astype(np.float32) for n, s in expected_tensor_shapes(a).items()}
    qtypes = {"model.embed_tokens.weight": Q.Q8_0}
    write_gguf(tmp / "m.gguf", a, weights, Q.Q4_1, vocab, qtypes=qtypes)
    file_bytes = 0
    for n, w in weights.items():
        q = qtypes.get(n, Q.Q4_1) if w.ndim == 2 else Q.F32
        block, size = GGML_QUANT_SIZES[q]
        file_bytes += w.size // block * size
    return tmp / "m.gguf", file_bytes


def test_auto_on_cpu_costs_the_kept_blocks(q4_file: tuple[Path, int], tmp_path: Path) -> None:
    path, file_bytes = q4_file
    ck = open_checkpoint(str(path), tmp_path)
    packed = served_spec(ck, "auto", "cpu")
    floats = served_spec(ck, "float32", "cpu")
    assert packed.weight_bytes == weight_plan(ck, "auto", "cpu").total_bytes
    # the plan keeps the file's blocks: its bytes are the file's, to the 64-byte slot alignment
    assert file_bytes <= packed.weight_bytes <= file_bytes + 64 * len(ck.tensor_specs())
    assert floats.weight_bytes == floats.params * 4 and packed.params == floats.params
    assert packed.weight_bytes < floats.weight_bytes / 4
    assert packed.decode_step_bytes(1, 100) - floats.decode_step_bytes(1, 100) == packed.weight_bytes - floats.weight_bytes
    assert packed.identity()["weight_bytes"] == packed.weight_bytes


def test_floats_and_accelerators_keep_the_float_count(q4_file: tuple[Path, int], tmp_path: Path) -> None:
    ck = open_checkpoint(str(q4_file[0]), tmp_path)
    floats = served_spec(ck, "float32", "cpu")
    assert served_spec(ck, "auto", "accelerator") == floats  # the kernels are cpu-only: floats there
    assert "stored_bytes" not in floats.identity()  # a float model's stored identity is what it was
    assert served_spec(ck, "bfloat16", "cpu").weight_bytes == floats.params * 2


def test_the_prior_charges_a_decode_step_the_kept_bytes(q4_file: tuple[Path, int], tmp_path: Path) -> None:
    """On a memory-bound device the prior's batch-1 step falls with the bytes it reads."""
    ck = open_checkpoint(str(q4_file[0]), tmp_path)
    dev = device_spec("h100")
    packed, floats = (RooflinePrior(served_spec(ck, d, "cpu"), dev, 2.0, 0.1) for d in ("auto", "float32"))
    assert packed.decode_step_s(1, 64) < floats.decode_step_s(1, 64)

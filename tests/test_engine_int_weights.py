"""`dtype = "int8"` / `"int4"` on an HF float checkpoint (engine/models/quantize_float.py):
the weights are quantized at load into Q8_0 / Q4_1 blocks and multiplied by the cpu
kernels. The reference is the float32 model of the same dequantized weights, written as
its own checkpoint by gguf's own quantize/dequantize (not our block decoding): greedy
outputs must equal it token for token."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import pytest
import torch
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file, save_file

from engine_fixtures import write_hf_checkpoint
from janusd.config import ConfigError, EngineConfig, ModelConfig, parse_config
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.loader import open_checkpoint
from janusd.engine.model_cost import served_spec
from janusd.engine.models import qlinear
from janusd.engine.models.q8 import Q8Matrix
from janusd.engine.models.qlinear import Q4Linear
from janusd.engine.types import SamplingParams

Q = gguf.GGMLQuantizationType
pytestmark = pytest.mark.skipif(not qlinear.q4_available(), reason="this build of janusd._native lacks the quant kernels")
PROMPTS = {"a": [5, 6, 7, 8, 9], "b": [11, 3, 40, 2, 7, 7, 100], "c": [200]}
HEADS = ("model.embed_tokens.weight", "lm_head.weight")
FORMATS = {"int8": Q.Q8_0, "int4": Q.Q4_1}


def _reference(src: Path, out: Path, dtype: str) -> Path:
    """A copy of `src` whose 2-D weights are gguf's dequantized blocks (heads Q8_0)."""
    shutil.copytree(src, out)
    files = sorted(out.glob("*.safetensors"))
    for f in files:
        tensors = load_file(f)
        for name, t in tensors.items():
            if t.dim() == 2:
                q = Q.Q8_0 if name in HEADS else FORMATS[dtype]
                w = t.float().numpy()
                tensors[name] = torch.from_numpy(dequantize(quantize(w, q), q).reshape(w.shape).copy()).to(t.dtype)
        save_file(tensors, f, metadata={"format": "pt"})
    return out


def _greedy(de: DeviceEngine, name: str) -> dict[str, list[int]]:
    out = de.models[name].generate(dict(PROMPTS), SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    return {r: [t for o in outs for t in o.token_ids] for r, outs in out.items()}


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_equals_the_float_model_of_the_same_blocks(tmp_path: Path, arch: str, dtype: str) -> None:
    src, hf = write_hf_checkpoint(tmp_path / "f", arch, seed=3, intermediate_size=128)
    with torch.no_grad():  # larger weights than an init's: logits far enough apart for greedy to mean something
        for p in hf.parameters():
            p.mul_(5.0)
    hf.save_pretrained(src, safe_serialization=True)
    ref = _reference(src, tmp_path / "ref", dtype)
    de = DeviceEngine(memory_bytes=64 << 20)
    for name, ck, dt in (("ref", ref, "float32"), ("q", src, dtype), ("float", src, "float32")):
        de.load_model(ModelConfig(name=name, checkpoint=str(ck), dtype=dt, kv_cache_mib=4, max_model_len=256),
                      EngineConfig())
    want = _greedy(de, "ref")
    assert len({tuple(v) for v in want.values()}) == len(PROMPTS)
    layer = de.models["q"].model.layers[0]
    kind = Q8Matrix if dtype == "int8" else Q4Linear
    assert all(isinstance(w, kind) for w in (layer.qkv_w, layer.o_w, layer.gate_up_w, layer.down_w))
    assert isinstance(de.models["q"].model.lm_head, Q8Matrix)
    assert _greedy(de, "q") == want
    if dtype == "int4":  # 4-bit blocks move these seeds' tokens: the reference is not the float model itself
        assert _greedy(de, "float") != want
    floats = de.models["float"].weight_bytes  # type: ignore[attr-defined]
    assert de.models["q"].weight_bytes < floats * (0.30 if dtype == "int8" else 0.22)  # type: ignore[attr-defined]
    ck = open_checkpoint(str(src))
    assert served_spec(ck, dtype, "cpu").weight_bytes == de.models["q"].placement.plan.total_bytes
    de.pool.close()


def test_int_dtypes_are_refused_off_cpu_and_with_tp() -> None:
    model = '[[models]]\nname = "m"\ncheckpoint = "demo:llama-tiny"\ndtype = "int8"\n'
    with pytest.raises(ConfigError, match="cpu kernels"):
        parse_config('[devices]\nkind = "cuda"\ncount = 1\n' + model)
    with pytest.raises(ConfigError, match="tp = 2"):
        parse_config('[devices]\ncount = 2\n' + model + "tp = 2\ndevices = [0]\n")
    assert parse_config(model).models[0].dtype == "int8"
    with pytest.raises(ConfigError, match="dtype"):
        parse_config(model.replace("int8", "int3"))

"""A batch-1 decode step in one native call (engine/models/native_step.py, janus_core::decode):
the same greedy tokens as the dequantized float32 model and as the Python forward of the
same packed weights, logits within float32 noise of the Python forward's, the Python
forward for every step it does not fit, and clear errors for addresses that do not fit."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch

from janusd.engine.device_engine import DeviceEngine
from janusd.engine.models import native_step, qlinear
from janusd.engine.types import SamplingParams
from test_engine_qlinear import PROMPTS, _load, _tiny_gguf, vocab  # noqa: F401 (vocab: the module fixture)

Q = gguf.GGMLQuantizationType
pytestmark = pytest.mark.skipif(not (qlinear.q4_available() and native_step.enabled()),
                                reason="this build of janusd._native lacks the native decode step")


def _count_native(model: object) -> list[int]:
    """Wraps the model's NativeDecode.run: [steps it ran natively, steps it declined]."""
    nat = model.native  # type: ignore[attr-defined]
    seen = [0, 0]
    run = nat.run

    def counted(*a: object) -> object:
        out = run(*a)
        seen[out is None] += 1
        return out

    nat.run = counted
    return seen


def _alone(de: DeviceEngine, name: str, n: int = 12, logits: list | None = None) -> dict[str, list[int]]:
    """Greedy tokens of each prompt decoded alone (batch 1: the native step's case)."""
    me = de.models[name]
    if logits is not None:
        me.logit_sink = lambda rid, row: logits.append(row.clone())
    out = {}
    for rid, p in PROMPTS.items():
        outs = me.generate({rid: p}, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))[rid]
        out[rid] = [t for o in outs for t in o.token_ids]
    return out


@pytest.mark.parametrize(("arch", "qtype", "head"), [("llama", Q.Q4_0, None), ("qwen2", Q.Q4_1, Q.Q8_0)])
def test_native_step_equals_the_float32_model_and_the_python_forward(tmp_path: Path, vocab: dict, arch: str, qtype: Q,
                                                                    head: Q | None) -> None:
    path = _tiny_gguf(tmp_path / "q.gguf", vocab, arch, qtype, head)
    de = DeviceEngine(memory_bytes=32 << 20)
    _load(de, "ref", path, "float32")
    _load(de, "q", path, "auto")
    assert de.models["ref"].model.native is None  # float32 matrices: the Python forward
    model = de.models["q"].model
    assert model.native is not None and model.native.plan.num_layers == 2
    seen = _count_native(model)
    nat_logits: list[torch.Tensor] = []
    got = _alone(de, "q", logits=nat_logits)
    assert seen == [len(PROMPTS) * 11, len(PROMPTS)]  # every decode step natively; the prefills not
    assert got == _alone(de, "ref")
    nat = model.native
    model.native = None
    py_logits: list[torch.Tensor] = []
    assert _alone(de, "q", logits=py_logits) == got
    assert len(py_logits) == len(nat_logits)
    # the same ops but SiLU's exp: a few float32 ulps; a float16 head (the file's Q4
    # embedding, linear.half_weight_linear) rounds its input and logits to float16
    tol = 1e-5 if head else 2**-9
    for a, b in zip(nat_logits, py_logits):
        assert (a - b).abs().max() <= tol * b.abs().max()
    model.native = nat
    de.pool.close()


def test_batches_take_the_python_forward_and_bad_addresses_are_errors(
        tmp_path: Path, vocab: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _tiny_gguf(tmp_path / "q.gguf", vocab, "llama", Q.Q4_1, Q.Q8_0)
    de = DeviceEngine(memory_bytes=32 << 20)
    _load(de, "q", path, "auto")
    me = de.models["q"]
    seen = _count_native(me.model)
    me.generate(dict(PROMPTS), SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert seen[1] > 0  # steps of several sequences declined
    plan = me.model.native.plan
    with pytest.raises(ValueError, match="null address"):
        native_step._PLAN(64, 4, 2, 16, 128, 1e-5, [0] * 15)
    with pytest.raises(ValueError, match="layers of 15"):
        native_step._PLAN(64, 4, 2, 16, 128, 1e-5, [1] * 14)
    h = torch.zeros(64)
    rope = me.model.rope
    kv = [t.data_ptr() for pair in me._kv_layers for t in pair]
    k0 = me._kv_layers[0][0]
    args = (h.data_ptr(), rope.cos.data_ptr(), rope.sin_rot.data_ptr())
    geo = (k0.shape[1], k0.stride(0), k0.shape[0], 1)
    with pytest.raises(ValueError, match="cache addresses"):
        plan.step(*args, kv[:2], torch.tensor([0]).data_ptr(), 1, 1, *geo)
    far = torch.tensor([k0.shape[0] + 5])
    with pytest.raises(ValueError, match="bad shapes"):
        plan.step(*args, kv, far.data_ptr(), 1, 1, *geo)
    monkeypatch.setenv("JANUS_NATIVE_STEP", "0")
    assert native_step.NativeDecode.bind(me.model) is None
    de.pool.close()


_CHILD = """
import json, sys
import torch
from janusd.config import EngineConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.types import SamplingParams
torch.set_num_threads(1)
de = DeviceEngine(memory_bytes=32 << 20)
me = de.load_model(ModelConfig(name="q", checkpoint=sys.argv[1], dtype="auto", kv_cache_mib=4, max_model_len=256),
                   EngineConfig())
assert me.model.native is not None
out = {}
for rid, p in json.loads(sys.argv[2]).items():
    outs = me.generate({rid: p}, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[rid]
    out[rid] = [t for o in outs for t in o.token_ids]
print(json.dumps(out))
"""


def test_the_scalar_kernels_give_the_simd_steps_tokens(tmp_path: Path, vocab: dict) -> None:
    """JANUS_QUANT_SCALAR=1 (read once per process: a child) runs the portable loops a cpu
    without AVX2 gets; its native steps give the same greedy tokens."""
    import json
    import os
    import subprocess
    import sys

    path = _tiny_gguf(tmp_path / "q.gguf", vocab, "llama", Q.Q4_1, Q.Q8_0)
    de = DeviceEngine(memory_bytes=32 << 20)
    _load(de, "q", path, "auto")
    want = _alone(de, "q")
    de.pool.close()
    env = dict(os.environ, JANUS_QUANT_SCALAR="1")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), json.dumps(PROMPTS)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == want

"""The engine against `transformers` as the reference implementation.

Random tiny checkpoints of each supported architecture are written by transformers'
own save_pretrained, loaded through open_checkpoint into xTensor memory, and run with
small KV blocks (4 tokens) and a small token budget (chunked prefill), so prompts and
decodes cross block boundaries. Every sampled row's logits must match the HF forward
over the same tokens within 1e-4 (float32), and 32 greedy tokens must be identical.
"""

from __future__ import annotations

import pytest
import torch

from engine_fixtures import write_hf_checkpoint
from janusd.config import EngineConfig, ModelConfig
from janusd.engine.device_engine import DeviceEngine
from janusd.engine.runner import SamplingParams

CASES = {
    "llama": ("llama", {}),
    "llama3-rope-tied": ("llama", {"tie_word_embeddings": True, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}}),
    "mistral-window": ("mistral", {"sliding_window": 8}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
}


@pytest.fixture(scope="module")
def device() -> DeviceEngine:
    return DeviceEngine(kind="cpu", memory_bytes=64 << 20, page_size=2 << 20)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_greedy_match_transformers(case: str, device: DeviceEngine, tmp_path) -> None:
    arch, over = CASES[case]
    ck, hf = write_hf_checkpoint(tmp_path / case, arch, seed=len(case), **over)
    me = device.load_model(ModelConfig(name=case, checkpoint=str(ck), kv_cache_mib=4, max_model_len=128),
                           EngineConfig(block_size=4, max_num_batched_tokens=5, max_num_seqs=4))
    try:
        assert me.arch.architecture == arch
        # every weight is a view into the pool's global range (one segment), the fused
        # q/k/v matrix included; tied embeddings are one tensor
        lo, hi = device.pool.global_base, device.pool.global_base + device.pool.num_pages * device.pool.page_size
        layer = me.model.layers[1]
        for t in (me.model.embed, me.model.norm, layer.qkv_w, layer.gate_up_w, layer.down_w):
            assert lo <= t.data_ptr() < hi and t.data_ptr() % 64 == 0
        assert (me.model.lm_head.data_ptr() == me.model.embed.data_ptr()) == bool(over.get("tie_word_embeddings"))
        seen: list[torch.Tensor] = []
        me.logit_sink = lambda rid, row: seen.append(row.clone())
        prompt = [(7 * i + 3) % 500 + 5 for i in range(11)]  # 11 tokens: 3 blocks of 4, 3 chunks of 5
        outs = me.generate({"r": prompt}, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
        ours = [t for o in outs["r"] for t in o.token_ids]
        assert len(ours) == 32 and len(seen) == 32
        full = torch.tensor([prompt + ours])
        with torch.no_grad():
            ref_logits = hf(full).logits[0, len(prompt) - 1 : -1].float()
            ref_tokens = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                                     pad_token_id=0)[0, len(prompt):].tolist()
        err = (torch.stack(seen) - ref_logits).abs().max().item()
        assert err < 1e-4, f"{case}: max logit error {err}"
        assert ours == ref_tokens
    finally:
        device.unload_model(case)


def test_prefill_without_chunks_matches_transformers(device: DeviceEngine, tmp_path) -> None:
    """A 40-token prompt in one step (no earlier context): the SDPA causal path."""
    ck, hf = write_hf_checkpoint(tmp_path / "q2", "qwen2", seed=3)
    me = device.load_model(ModelConfig(name="whole", checkpoint=str(ck), kv_cache_mib=4, max_model_len=128),
                           EngineConfig(block_size=8, max_num_batched_tokens=256))
    try:
        seen: list[torch.Tensor] = []
        me.logit_sink = lambda rid, row: seen.append(row.clone())
        prompt = list(range(40, 80))
        outs = me.generate({"r": prompt}, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        ours = [t for o in outs["r"] for t in o.token_ids]
        with torch.no_grad():
            ref = hf(torch.tensor([prompt + ours])).logits[0, len(prompt) - 1 : -1]
        assert (torch.stack(seen) - ref).abs().max().item() < 1e-4
    finally:
        device.unload_model("whole")


@pytest.mark.parametrize("case", ["llama3-rope-tied", "qwen3"])
def test_bfloat16_logits_as_close_as_transformers_own_bfloat16(case: str, device: DeviceEngine, tmp_path) -> None:
    """bfloat16 cannot match to 1e-4. Teacher-forced over the same tokens, our bf16 logits
    must be within 3 bf16 steps of transformers' bf16 logits, and no further from the
    float32 reference than twice transformers' own bf16 error (+1 bf16 step)."""
    arch, over = CASES[case]
    ck, hf = write_hf_checkpoint(tmp_path / case, arch, seed=5, **over)
    me = device.load_model(ModelConfig(name=case, checkpoint=str(ck), kv_cache_mib=4, max_model_len=128,
                                       dtype="bfloat16"),
                           EngineConfig(block_size=4, max_num_batched_tokens=5, max_num_seqs=4))
    try:
        assert me.model.embed.dtype == torch.bfloat16 and me.kv.dtype == torch.bfloat16
        seen: list[torch.Tensor] = []
        me.logit_sink = lambda rid, row: seen.append(row.clone())
        prompt = [(7 * i + 3) % 500 + 5 for i in range(11)]
        outs = me.generate({"r": prompt}, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
        full = torch.tensor([prompt + [t for o in outs["r"] for t in o.token_ids]])
        with torch.no_grad():
            ref32 = hf(full).logits[0, len(prompt) - 1 : -1].float()
            ref16 = hf.to(torch.bfloat16)(full).logits[0, len(prompt) - 1 : -1].float()
        ours = torch.stack(seen)
        step = 2.0 ** -7 * ref32.abs().max().item()  # one bf16 step at the logits' scale
        assert (ours - ref16).abs().max().item() <= 3 * step
        assert (ours - ref32).abs().max().item() <= 2 * (ref16 - ref32).abs().max().item() + step
    finally:
        device.unload_model(case)

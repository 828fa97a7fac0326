"""Writing GGUF files the way llama.cpp's converter does, for the GGUF tests (not a test file)."""

from __future__ import annotations

import gguf
import numpy as np

HF_TO_GGUF = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    """llama.cpp's tensor name for an HF parameter name."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, n, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{n}.{HF_TO_GGUF[module]}.{kind}"


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to llama q/k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_arch(w: gguf.GGUFWriter, a) -> None:
    """The model hyper-parameters of a ModelArch as GGUF metadata."""
    w.add_block_count(a.num_hidden_layers)
    w.add_context_length(a.max_position_embeddings)
    w.add_embedding_length(a.hidden_size)
    w.add_feed_forward_length(a.intermediate_size)
    w.add_head_count(a.num_attention_heads)
    w.add_head_count_kv(a.num_key_value_heads)
    w.add_layer_norm_rms_eps(a.rms_norm_eps)
    w.add_rope_freq_base(a.rope_theta)

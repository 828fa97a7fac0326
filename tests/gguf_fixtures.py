"""Writing GGUF files the way llama.cpp's converter does, for the GGUF tests (not a test file)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize, quantize

from janusd.engine.checkpoint.demo import make_demo
from janusd.engine.loader import ModelArch

Q = gguf.GGMLQuantizationType

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


def demo_vocab(tmp: Path) -> dict:
    d = make_demo(tmp / "vocab-src", "llama", "tiny")
    data = json.loads((d / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]
    specials = {t["content"] for t in data["added_tokens"]}
    return {"dir": d, "tokens": tokens, "merges": merges,
            "types": [3 if t in specials else 1 for t in tokens]}


def write_gguf(path: Path, a: ModelArch, tensors: dict[str, np.ndarray], qtype: Q, vocab: dict,
               extra: dict[str, np.ndarray] | None = None, qtypes: dict[str, Q] | None = None) -> dict[str, np.ndarray]:
    """Write a GGUF like llama.cpp would; return, per HF name, what an exact reader must produce.
    `extra` tensors are written under their GGUF names as they are (e.g. rope_freqs.weight);
    `qtypes` overrides `qtype` per HF name (e.g. a Q8_0 embedding, as SmolLM2's file has)."""
    w = gguf.GGUFWriter(str(path), a.architecture)
    add_arch(w, a)
    w.add_vocab_size(a.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab["tokens"])
    w.add_token_merges(vocab["merges"])
    w.add_token_types(vocab["types"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
    w.add_float32("general.sampling.temp", 0.25)
    expected: dict[str, np.ndarray] = {}
    for name, x in tensors.items():
        stored = x
        if a.architecture == "llama" and name.endswith("q_proj.weight"):
            stored = llamacpp_permute(x, a.num_attention_heads)
        elif a.architecture == "llama" and name.endswith("k_proj.weight"):
            stored = llamacpp_permute(x, a.num_key_value_heads)
        q = (qtypes or {}).get(name, qtype) if x.ndim == 2 else Q.F32
        if q == Q.F32:
            w.add_tensor(gguf_name(name), stored)
            expected[name] = x
        else:
            packed = quantize(stored, q)
            w.add_tensor(gguf_name(name), packed, raw_dtype=q)
            back = dequantize(packed, q).reshape(x.shape)
            if stored is not x:  # undo the permutation on the dequantised values, independently
                heads = a.num_attention_heads if name.endswith("q_proj.weight") else a.num_key_value_heads
                back = back.reshape(heads, back.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(x.shape)
            expected[name] = back
    for gname, x in (extra or {}).items():
        w.add_tensor(gname, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected

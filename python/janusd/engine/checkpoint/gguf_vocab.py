"""A GGUF file's embedded vocabulary -> a ``tokenizers.Tokenizer`` (GPT-2 style byte-level BPE;
SentencePiece vocabularies are handed to gguf_spm.py).

llama.cpp stores the BPE vocab, the merges and token types, and names the
pre-tokenizer (``tokenizer.ggml.pre``) rather than storing it. Each name stands for a
fixed split regex in llama.cpp; we rebuild the same pre-tokenizer here for the names we
know, and refuse others rather than tokenizing subtly wrong.
"""

from __future__ import annotations

from typing import Any

from janusd.engine.checkpoint.base import CheckpointError
from janusd.engine.checkpoint.gguf_spm import spm_tokenizer_from_gguf
from janusd.engine.tokenizer import Tokenizer

# GPT-4o-style splits used by llama 3 and qwen 2 (numbers in groups of 1..3 vs single digits)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def _pre_tokenizer(pre: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("default", "gpt-2", "gpt2"):
        return byte_level
    if pre == "smollm":  # llama.cpp: "\p{N}" then the GPT-2 regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    for names, pattern in ((("llama-bpe", "llama3"), _LLAMA3_SPLIT), (("qwen2",), _QWEN2_SPLIT)):
        if pre in names:
            return pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
    raise CheckpointError(f"unsupported GGUF pre-tokenizer {pre!r} (supported: default, gpt-2, smollm, llama-bpe, qwen2)")


def tokenizer_from_gguf(meta: dict[str, Any], where: str) -> Tokenizer:
    """Build the Tokenizer from GGUF metadata (already decoded to Python values)."""
    from tokenizers import AddedToken, decoders, models, processors
    from tokenizers import Tokenizer as Backend

    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama":  # SentencePiece BPE (Llama 2, Mistral, TinyLlama ...)
        return spm_tokenizer_from_gguf(meta, where)
    if kind != "gpt2":
        raise CheckpointError(f"{where}: unsupported GGUF tokenizer model {kind!r} "
                              "(supported: gpt2 byte-level BPE, llama SentencePiece BPE)")
    tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
    merges_raw: list[str] = meta.get("tokenizer.ggml.merges") or []
    if not tokens or not merges_raw:
        raise CheckpointError(f"{where}: GGUF has no embedded vocabulary (tokenizer.ggml.tokens / merges)")
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for m in merges_raw:
        a, sep, b = m.partition(" ")
        if not sep:
            raise CheckpointError(f"{where}: malformed merge {m!r} in tokenizer.ggml.merges")
        merges.append((a, b))
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    try:
        pre_tok = _pre_tokenizer(pre)
    except CheckpointError as e:
        raise CheckpointError(f"{where}: {e}") from None
    backend = Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=pre in ("llama-bpe", "llama3")))
    backend.pre_tokenizer = pre_tok
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == TOKEN_TYPE_CONTROL]
    )
    backend.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == TOKEN_TYPE_USER_DEFINED]
    )

    def token(key: str) -> str | None:
        i = meta.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    extra_eos = [
        meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if isinstance(meta.get(k), int)
    ]
    special = {
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
    }
    return Tokenizer(
        backend,
        bos_token=bos,
        eos_token=eos,
        extra_eos_token_ids=extra_eos,
        chat_template=meta.get("tokenizer.chat_template"),
        special_tokens_map=special,
    )

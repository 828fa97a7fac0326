"""A GGUF SentencePiece vocabulary (``tokenizer.ggml.model = "llama"``) -> ``tokenizers.Tokenizer``.

Llama 2, Mistral, TinyLlama and many others ship a SentencePiece BPE model. llama.cpp
stores it as pieces (spaces spelled U+2581), one score per piece, token types and
special ids, but no merges: its tokenizer (``llm_tokenizer_spm``) starts from single
characters and repeatedly joins the adjacent pair whose concatenation is a piece with the
highest score (leftmost first on ties), then spells any character that is not a piece as
``<0xXX>`` byte tokens. We build the same thing as a ``tokenizers`` BPE, the way Hugging
Face's LlamaConverter does: every split ``(left, right)`` of a piece whose two halves are
pieces is a merge, ranked by the joined piece's score, best first. A BPE applying
lowest-rank merges first then makes the same choices as the greedy score search
(differences only arise when distinct pieces carry exactly equal scores, or a character
outside the vocabulary would join into a piece; neither happens in a SentencePiece-trained
vocabulary, where every character of a piece is itself a piece and scores are distinct).

Text handling follows llama.cpp (and HF's "legacy" Llama tokenizer, which agrees): special
and user-defined tokens are cut out of the text first; every remaining fragment gets one
'▁' prepended (when ``add_space_prefix``, default on) and its spaces turned into '▁'. So a
fragment after ``<s>`` or ``[INST]`` starts with '▁' too, as llama.cpp does.
"""

from __future__ import annotations

from typing import Any

from janusd.engine.checkpoint.base import CheckpointError
from janusd.engine.tokenizer import Tokenizer

SPIECE_SPACE = "\u2581"
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Every (left, right) with left+right, left and right all pieces; best joined score first.

    Ties are ordered like HF's ``generate_merges``: longer left half, then longer right half,
    then the joined piece's position in the vocabulary, then the halves' ids.
    """
    ids: dict[str, int] = {}
    for i, t in enumerate(tokens):
        ids[t] = i  # a repeated piece resolves to its last id, as in llama.cpp's token_to_id
    scored = {t: float(s) for t, s in zip(tokens, scores)}  # order of first appearance, last score
    candidates: list[tuple[float, int, int, int, tuple[str, str]]] = []
    for order, (piece, score) in enumerate(scored.items()):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                candidates.append((-score, -len(left), -len(right), order, (left, right)))
    # within one piece, halves by id; across pieces the tuple order above (Python's sort is stable)
    candidates.sort(key=lambda c: (c[0], c[1], c[2], c[3], ids[c[4][0]], ids[c[4][1]]))
    return [c[4] for c in candidates]


def _meta_list(meta: dict[str, Any], key: str, n: int, where: str, default: Any = None) -> list[Any]:
    values = meta.get(key)
    if values is None:
        if default is None:
            raise CheckpointError(f"{where}: SentencePiece GGUF vocabulary has no '{key}'")
        return [default] * n
    if len(values) != n:
        raise CheckpointError(f"{where}: '{key}' has {len(values)} entries for {n} tokens")
    return list(values)


def spm_tokenizer_from_gguf(meta: dict[str, Any], where: str) -> Tokenizer:
    """Build the Tokenizer for a ``tokenizer.ggml.model == "llama"`` vocabulary."""
    from tokenizers import AddedToken, decoders, models, normalizers, processors
    from tokenizers import Tokenizer as Backend

    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise CheckpointError(f"{where}: GGUF has no embedded vocabulary (tokenizer.ggml.tokens)")
    scores = _meta_list(meta, "tokenizer.ggml.scores", len(tokens), where)
    types = _meta_list(meta, "tokenizer.ggml.token_type", len(tokens), where, default=TOKEN_TYPE_NORMAL)
    for s in scores:
        if not isinstance(s, int | float) or s != s:
            raise CheckpointError(f"{where}: tokenizer.ggml.scores holds a non-number {s!r}")

    def token(key: str) -> str | None:
        i = meta.get(key)
        if i is None:
            return None
        if not isinstance(i, int) or not 0 <= i < len(tokens):
            raise CheckpointError(f"{where}: {key} = {i!r} is not a token id (vocabulary of {len(tokens)})")
        return tokens[i]

    unk = token("tokenizer.ggml.unknown_token_id")
    if unk is None:
        unk = next((t for t, k in zip(tokens, types) if k == TOKEN_TYPE_UNKNOWN), None)
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=merges_from_scores(tokens, scores), unk_token=unk,
                     fuse_unk=True, byte_fallback=True)
    backend = Backend(bpe)
    space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend(SPIECE_SPACE)] if space_prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPIECE_SPACE)])
    pieces = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if space_prefix:
        pieces.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(pieces)
    # llama.cpp cuts control, unknown and user-defined tokens out of the text whole; the
    # first two are special (skipped when decoding), user-defined ones are ordinary text
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, k in zip(tokens, types) if k in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN)])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, k in zip(tokens, types) if k == TOKEN_TYPE_USER_DEFINED])

    bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
    # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        head = f"{bos} " if add_bos else ""
        tail = f" {eos}" if add_eos else ""
        used = {t: vocab[t] for t in ((bos,) if add_bos else ()) + ((eos,) if add_eos else ()) if t is not None}
        backend.post_processor = processors.TemplateProcessing(
            single=f"{head}$A{tail}", pair=f"{head}$A{tail} {head}$B{tail}", special_tokens=list(used.items()))
    extra_eos = [meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
                 if isinstance(meta.get(k), int)]
    special = {"bos_token": bos, "eos_token": eos, "unk_token": unk, "pad_token": token("tokenizer.ggml.padding_token_id")}
    return Tokenizer(backend, bos_token=bos, eos_token=eos, extra_eos_token_ids=extra_eos,
                     chat_template=meta.get("tokenizer.chat_template"), special_tokens_map=special)

"""GGUF SentencePiece vocabularies (tokenizer.ggml.model = "llama": Llama 2, Mistral, TinyLlama).

A SentencePiece-style BPE is trained with `tokenizers` on the demo corpus and written into a
GGUF the way llama.cpp's converter writes one (pieces with '▁', scores = -merge rank, token
types with 256 <0xXX> byte tokens, control and user-defined tokens, bos/eos/unk ids, no
merges). The tokenizer we rebuild from that file is checked against three references:
  1. the trained tokenizer itself, with the merges the trainer learned (not re-derived);
  2. a direct Python transcription of llama.cpp's llm_tokenizer_spm (greedy best-score
     bigram joining, byte fallback, special-token partition, space prefix after specials);
  3. transformers' own GGUF tokenizer builder (LlamaTokenizer from vocab + derived merges,
     no sentencepiece package), on text that holds no special tokens.
"""

from __future__ import annotations

import heapq
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gguf_fixtures import add_arch, gguf_name
from janusd.engine.checkpoint.demo import CORPUS
from janusd.engine.checkpoint.gguf_spm import merges_from_scores
from janusd.engine.loader import CheckpointError, ModelArch, expected_tensor_shapes, open_checkpoint

SP = "\u2581"
CONTROL = ["[INST]", "[/INST]"]  # Mistral v3-style control tokens
USER_DEFINED = ["<think>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                 "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")

TEXTS = [
    "Once upon a time, there was a little robot.", "hello", "Hello World", " leading space", "  two leading",
    "trailing space ", "trailing two  ", "many     inner    spaces", "\n", "line one\nline two\n\nline four",
    "\ttab\tseparated", "digits 0123456789 and 3.14159", "Prices: $4.99 and 1,250 points!", "a-b_c/d\\e|f",
    "(parens) [brackets] {braces} <angles>", "café crème brûlée", "naïve façade", "日本語のテキスト",
    "emoji 🙂 and 🚀🚀", "mixed: Ωμέγα, кириллица, עברית", "🙂", "x", " ", "   ", "a  b   c    d",
    "ALLCAPS and MiXeD cAsE", "it's don't we'll they're", "end with newline\n", "\n\nstarts with newlines",
    "the the the the the", "unicode\u00a0nbsp and \u2581 literal lower-one-eighth block", "?!?!...;;::",
    "<s>hello</s>", "[INST] What is 2+2? [/INST] 4</s>", "<think>hmm</think>", "a[INST]b", "[INST][/INST]",
]


def _train() -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """(pieces in SentencePiece order, the trainer's merges, single-character alphabet)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    base = Backend(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    base.train_from_iterator(CORPUS.read_text(encoding="utf-8").splitlines(), trainer=trainer)
    model = json.loads(base.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    alphabet = sorted((t for t in model["vocab"] if len(t) == 1), key=model["vocab"].get)
    merged: list[str] = []
    for a, b in merges:
        if a + b not in merged:
            merged.append(a + b)
    return merged, merges, alphabet


@pytest.fixture(scope="module")
def spm() -> dict:
    """The vocabulary as llama.cpp's SentencePiece converter lays it out in a GGUF."""
    merged, merges, alphabet = _train()
    tokens = ["<unk>", "<s>", "</s>", *CONTROL, *(f"<0x{b:02X}>" for b in range(256))]
    types = [2, 3, 3, *[3] * len(CONTROL), *[6] * 256]
    scores = [0.0] * len(tokens)
    for i, piece in enumerate([*merged, *alphabet]):  # SentencePiece BPE: score = -(order learned)
        tokens.append(piece)
        types.append(1)
        scores.append(-float(i))
    for t in USER_DEFINED:
        tokens.append(t)
        types.append(4)
        scores.append(0.0)
    tokens.append("[PAD0]")  # llama.cpp pads to the model's vocab size with unused tokens
    types.append(5)
    scores.append(-1000.0)
    return {"tokens": tokens, "types": types, "scores": scores, "trained_merges": merges}


def write_spm_gguf(path: Path, spm: dict, arch: ModelArch | None = None, *, add_bos: bool | None = True,
                   space_prefix: bool | None = None) -> None:
    """A GGUF with the SentencePiece vocabulary (and tiny random llama weights when arch is given)."""
    w = gguf.GGUFWriter(str(path), "llama")
    if arch is not None:
        add_arch(w, arch)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(spm["tokens"])
    w.add_token_scores(spm["scores"])
    w.add_token_types(spm["types"])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_add_eos_token(False)
    if space_prefix is not None:
        w.add_add_space_prefix(space_prefix)
    w.add_chat_template(CHAT_TEMPLATE)
    if arch is not None:
        rng = np.random.default_rng(5)
        for name, shape in expected_tensor_shapes(arch).items():
            x = (rng.standard_normal(shape) * 0.02).astype(np.float32) if len(shape) == 2 else np.ones(shape, np.float32)
            w.add_tensor(gguf_name(name), x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llamacpp_spm_encode(text: str, spm: dict, add_bos: bool, space_prefix: bool = True) -> list[int]:
    """llama.cpp's SentencePiece tokenization (llama-vocab.cpp), transcribed to Python."""
    tokens, scores, types = spm["tokens"], spm["scores"], spm["types"]
    vocab = {t: i for i, t in enumerate(tokens)}
    # tokenizer_st_partition: special tokens (control, unknown, user-defined), longest first, cut out
    frags: list[str | int] = [text]
    for tok in sorted((t for t, k in zip(tokens, types) if k in (2, 3, 4)), key=len, reverse=True):
        out: list[str | int] = []
        for f in frags:
            if isinstance(f, int):
                out.append(f)
                continue
            parts = f.split(tok)
            for j, p in enumerate(parts):
                if j:
                    out.append(vocab[tok])
                if p:
                    out.append(p)
        frags = out
    ids = [1] if add_bos else []
    prev_special = True
    for f in frags:
        if isinstance(f, int):
            ids.append(f)
            prev_special = True
            continue
        if space_prefix and prev_special:
            f = " " + f
        prev_special = False
        ids += _spm_session(f.replace(" ", SP), vocab, scores)
    return ids


def _spm_session(text: str, vocab: dict[str, int], scores: list[float]) -> list[int]:
    """llm_tokenizer_spm_session::tokenize: join the best-scoring adjacent pair until none is a piece."""
    sym = list(text)
    nxt = list(range(1, len(sym))) + [-1]
    prv = list(range(-1, len(sym) - 1))
    queue: list[tuple[float, int, int, str]] = []

    def bigram(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        joined = sym[left] + sym[right]
        if joined in vocab:
            heapq.heappush(queue, (-scores[vocab[joined]], left, right, joined))

    for i in range(1, len(sym)):
        bigram(i - 1, i)
    while queue:
        _, left, right, joined = heapq.heappop(queue)
        if not sym[left] or not sym[right] or sym[left] + sym[right] != joined or nxt[left] != right:
            continue  # outdated: one side was joined elsewhere meanwhile
        sym[left], sym[right] = joined, ""
        nxt[left] = nxt[right]
        if nxt[right] != -1:
            prv[nxt[right]] = left
        bigram(prv[left], left)
        bigram(left, nxt[left])
    ids: list[int] = []
    i = 0 if sym else -1
    while i != -1:
        piece = sym[i]
        if piece in vocab:
            ids.append(vocab[piece])
        else:  # byte fallback
            ids += [vocab[f"<0x{b:02X}>"] for b in piece.encode("utf-8")]
        i = nxt[i]
    return ids


def trained_reference(spm: dict):
    """The trained tokenizer, with the trainer's own merges, in the Llama (legacy) text layout."""
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as Backend

    vocab = {t: i for i, t in enumerate(spm["tokens"])}
    tok = Backend(models.BPE(vocab=vocab, merges=spm["trained_merges"], unk_token="<unk>", byte_fallback=True,
                             fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    tok.decoder = decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ["<unk>", "<s>", "</s>", *CONTROL]])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in USER_DEFINED])
    return tok


@pytest.fixture(scope="module")
def gguf_path(spm: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spm") / "vocab.gguf"
    write_spm_gguf(path, spm)
    return path


@pytest.fixture(scope="module")
def ours(gguf_path: Path):
    from janusd.engine.checkpoint.gguf_file import _read_metadata
    from janusd.engine.checkpoint.gguf_vocab import tokenizer_from_gguf

    return tokenizer_from_gguf(_read_metadata(gguf.GGUFReader(str(gguf_path), "r")), str(gguf_path))


def test_vocabulary_is_sentencepiece_shaped(spm: dict) -> None:
    tokens = spm["tokens"]
    assert len(tokens) == len(set(tokens)) > 600 and tokens.index("<0x0A>") == 3 + len(CONTROL) + 10
    assert any(t.startswith(SP) and len(t) > 3 for t in tokens)
    assert "🙂" not in tokens and "😀" not in tokens  # emoji must go through byte fallback


def test_encode_matches_trained_tokenizer_and_llamacpp(ours, spm: dict) -> None:
    ref = trained_reference(spm)
    byte_fallbacks = 0
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False).ids, text
        assert ids == llamacpp_spm_encode(text, spm, add_bos=False), text
        assert ours.encode(text, add_special_tokens=True) == [1, *ids] == llamacpp_spm_encode(text, spm, True)
        byte_fallbacks += sum(1 for i in ids if spm["types"][i] == 6)
    assert byte_fallbacks >= 20  # emoji and CJK really went through <0xXX> tokens
    assert ours.encode("") == [] and ours.encode("", add_special_tokens=True) == [1]
    corpus = CORPUS.read_text(encoding="utf-8")  # 24 kB as one fragment: every merge order decision
    assert ours.encode(corpus) == llamacpp_spm_encode(corpus, spm, add_bos=False)


def test_decode_round_trips(ours, spm: dict) -> None:
    ref = trained_reference(spm)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False)
        # a literal '▁' decodes as ' '; text after an added token got its own '▁' (as in llama.cpp)
        if not any(s in text for s in ("<s>", "</s>", *CONTROL, *USER_DEFINED, SP)):
            # SentencePiece drops exactly the one space it added in front
            assert ours.decode(ids, skip_special_tokens=False) == text, text
    # streamed one token at a time, byte-fallback characters are held back until whole
    from janusd.engine.tokenizer import IncrementalDetokenizer

    ids = ours.encode("emoji 🙂 and 日本 ok")
    det = IncrementalDetokenizer(ours)
    deltas = [det.add(i) for i in ids] + [det.flush()]
    assert "".join(deltas) == "emoji 🙂 and 日本 ok" and not any("\ufffd" in d for d in deltas)
    ids = ours.encode("[INST] hi [/INST] ok</s>")
    # control tokens are skipped; the '▁' llama.cpp puts before each fragment after them stays
    assert ours.decode(ids) == " hi   ok"
    assert ours.decode(ids, skip_special_tokens=False) == "[INST]  hi [/INST]  ok</s>"


def test_special_tokens_are_whole_and_facts(ours, spm: dict) -> None:
    t = spm["tokens"]
    ids = ours.encode("[INST] What is 2+2? [/INST]")
    assert ids[0] == t.index("[INST]") and ids[-1] == t.index("[/INST]")
    assert t[ids[1]].startswith(SP)  # llama.cpp prepends the space again after a special token
    assert ours.encode("<think>x") [0] == t.index("<think>")
    assert ours.encode("</s>") == [2] and ours.encode("<s>") == [1]
    assert ours.bos_token_id == 1 and ours.eos_token_ids == [2] and ours.vocab_size == len(t)
    assert ours.special_token_ids == frozenset({0, 1, 2, 3, 4})
    assert t.index("<think>") not in ours.special_token_ids
    prompt = ours.apply_chat_template([{"role": "user", "content": "Hi there"}])
    assert prompt == "<s>[INST] Hi there [/INST]"
    assert ours.encode(prompt) == llamacpp_spm_encode(prompt, spm, add_bos=False)


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from([*"the cat sat on a mat, Once upon THE\n\t 0123 é🙂日!", "[INST]", "<s>", "<think>"]),
                    max_size=40).map("".join))
def test_random_text_matches_llamacpp_greedy(ours, spm: dict, text: str) -> None:
    assert ours.encode(text, add_special_tokens=True) == llamacpp_spm_encode(text, spm, add_bos=True)


def test_flags_add_bos_and_space_prefix(spm: dict, tmp_path: Path) -> None:
    write_spm_gguf(tmp_path / "nobos.gguf", spm, add_bos=False, space_prefix=False)
    write_spm_gguf(tmp_path / "default.gguf", spm, add_bos=None)  # no flag: llama.cpp adds BOS
    from janusd.engine.checkpoint.gguf_file import _read_metadata
    from janusd.engine.checkpoint.gguf_vocab import tokenizer_from_gguf

    def load(name: str):
        return tokenizer_from_gguf(_read_metadata(gguf.GGUFReader(str(tmp_path / name), "r")), name)

    plain, default = load("nobos.gguf"), load("default.gguf")
    for text in ("hello world", " two  spaces", "x\ny"):
        assert plain.encode(text, add_special_tokens=True) == llamacpp_spm_encode(text, spm, False, space_prefix=False)
        assert plain.decode(plain.encode(text)) == text
        assert default.encode(text, add_special_tokens=True)[0] == 1
    assert spm["tokens"][plain.encode("hello")[0]][0] != SP


def test_merge_order_follows_scores_like_hf() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc", "cab"]
    scores = [0.0, 0.0, 0.0, -3.0, -1.0, -2.0, -2.0]
    assert merges_from_scores(tokens, scores) == [("b", "c"), ("ab", "c"), ("a", "bc"), ("c", "ab"), ("a", "b")]
    from transformers.tokenization_utils_base import generate_merges

    assert merges_from_scores(tokens, scores) == generate_merges({t: i for i, t in enumerate(tokens)},
                                                                 dict(zip(tokens, scores)))


def test_matches_transformers_gguf_builder(ours, gguf_path: Path) -> None:
    """transformers builds a LlamaTokenizer from the same file with no sentencepiece package.
    It uses Metaspace(prepend_scheme='first'), which adds no '▁' to text that already starts
    with a space and none after a special token; elsewhere the ids are the same. (llama.cpp
    and SentencePiece itself add the '▁' in both cases, as we do.)"""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    arch, tok_dict, _ = get_gguf_tokenizer(str(gguf_path))
    hf, _ = convert_gguf_tokenizer(arch, tok_dict)
    plain = [t for t in TEXTS if not any(s in t for s in ("<s>", "</s>", *CONTROL, *USER_DEFINED))
             and not t.startswith((" ", SP))]
    assert len(plain) >= 28
    for text in plain:
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False).ids, text
        ids = ours.encode(text)
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    # the documented difference: one '▁' fewer in front of text that starts with a space
    assert ours.encode(" x")[0] == hf.token_to_id(SP) and ours.encode(" x")[1:] == hf.encode(" x").ids


def test_bad_spm_metadata_is_a_clear_error(spm: dict, tmp_path: Path) -> None:
    from janusd.engine.checkpoint.gguf_spm import spm_tokenizer_from_gguf

    base = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": spm["tokens"],
            "tokenizer.ggml.scores": spm["scores"], "tokenizer.ggml.token_type": spm["types"]}
    with pytest.raises(CheckpointError, match="f.gguf: .*no 'tokenizer.ggml.scores'"):
        spm_tokenizer_from_gguf({k: v for k, v in base.items() if k != "tokenizer.ggml.scores"}, "f.gguf")
    with pytest.raises(CheckpointError, match="'tokenizer.ggml.token_type' has 3 entries"):
        spm_tokenizer_from_gguf({**base, "tokenizer.ggml.token_type": [1, 1, 1]}, "f.gguf")
    with pytest.raises(CheckpointError, match="bos_token_id = 99999 is not a token id"):
        spm_tokenizer_from_gguf({**base, "tokenizer.ggml.bos_token_id": 99999}, "f.gguf")
    with pytest.raises(CheckpointError, match="unsupported GGUF tokenizer model 'rwkv'"):
        from janusd.engine.checkpoint.gguf_vocab import tokenizer_from_gguf

        tokenizer_from_gguf({**base, "tokenizer.ggml.model": "rwkv"}, "f.gguf")


def test_spm_gguf_model_generates_through_janus_cli(spm: dict, tmp_path: Path) -> None:
    arch = ModelArch(architecture="llama", vocab_size=len(spm["tokens"]), hidden_size=64, intermediate_size=96,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=256)
    path = tmp_path / "tiny-spm.gguf"
    write_spm_gguf(path, spm, arch)
    ck = open_checkpoint(path)
    assert ck.format == "gguf" and ck.arch.vocab_size == len(spm["tokens"]) and ck.eos_token_ids == [2]
    prompt = "Once upon a time"
    env = dict(os.environ, JANUSD_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-m", "janusd.cli", "generate", "--model", str(path), "--prompt", prompt,
                          "--max-tokens", "12", "--threads", "1", "--json"],
                         capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["prompt_tokens"] == len(llamacpp_spm_encode(prompt, spm, add_bos=True))
    assert result["completion_tokens"] == len(result["token_ids"]) >= 1
    assert result["text"] == ck.tokenizer.decode(result["token_ids"]) and result["text"]

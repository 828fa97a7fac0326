"""Tokenizer facade, incremental detokenization and chat-template rendering."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.engine.chat_template import ChatTemplateError
from janusd.engine.checkpoint.demo import CORPUS, make_demo
from janusd.engine.loader import open_checkpoint
from janusd.engine.tokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, Tokenizer


@pytest.fixture(scope="module")
def demo_tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return open_checkpoint(make_demo(tmp_path_factory.mktemp("d") / "ck", "qwen3", "tiny")).tokenizer


@pytest.fixture(scope="module")
def sp_tok() -> Tokenizer:
    """A Llama-2/Mistral style tokenizer: Metaspace + byte fallback, whose decoding of a token
    depends on its neighbours (leading-space stripping, <0xHH> bytes)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    base = Backend(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    base.train_from_iterator(CORPUS.read_text(encoding="utf-8").splitlines(), trainer=trainer)
    vocab = base.get_vocab()
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    import json

    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in json.loads(base.to_str())["model"]["merges"]]
    tok = Backend(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    return Tokenizer(tok, bos_token="<s>", eos_token="</s>")


def stream(tok: Tokenizer, ids: list[int], tail: list[int] | None = None) -> list[str]:
    det = IncrementalDetokenizer(tok, prompt_ids_tail=tail)
    deltas = [det.add(i) for i in ids]
    deltas.append(det.flush())
    return deltas


TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters=REPLACEMENT_CHAR),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(text=TEXT)
def test_byte_level_stream_is_whole_characters_and_lossless(demo_tok: Tokenizer, text: str) -> None:
    ids = demo_tok.encode(text)
    deltas = stream(demo_tok, ids)
    assert all(REPLACEMENT_CHAR not in d for d in deltas)
    assert "".join(deltas) == demo_tok.decode(ids)
    assert demo_tok.decode(ids, skip_special_tokens=False) == text  # byte-level BPE is lossless


@settings(max_examples=150, deadline=None)
@given(prompt=TEXT, text=TEXT)
def test_sentencepiece_stream_with_prompt_context(sp_tok: Tokenizer, prompt: str, text: str) -> None:
    tail = sp_tok.encode(prompt)[-5:]
    ids = sp_tok.encode(text)
    deltas = stream(sp_tok, ids, tail)
    assert all(REPLACEMENT_CHAR not in d for d in deltas)
    # what the stream adds is exactly what the generated ids add to the decoded context
    assert "".join(deltas) == sp_tok.decode(tail + ids)[len(sp_tok.decode(tail)) :]
    assert "".join(stream(sp_tok, ids)) == sp_tok.decode(ids)


def test_multibyte_character_split_across_tokens_is_held_back(demo_tok: Tokenizer) -> None:
    ids = demo_tok.encode("ok 🙂!")
    pieces = [demo_tok.decode([i]) for i in ids]
    assert sum(REPLACEMENT_CHAR in p for p in pieces) >= 2  # the emoji's 4 bytes span several tokens
    deltas = stream(demo_tok, ids)
    assert "" in deltas and "".join(deltas) == "ok 🙂!"
    assert any(d.endswith("🙂") or d.startswith("🙂") or "🙂" in d for d in deltas)


def test_special_tokens_are_skipped_in_stream(demo_tok: Tokenizer) -> None:
    ids = demo_tok.encode("Hello<|im_end|>")
    assert ids[-1] == 2
    assert stream(demo_tok, ids)[-2:] == ["", ""]
    det = IncrementalDetokenizer(demo_tok, skip_special_tokens=False)
    assert "".join(det.add(i) for i in ids) == "Hello<|im_end|>"


def test_sentencepiece_leading_space_depends_on_context(sp_tok: Tokenizer) -> None:
    word = sp_tok.encode("the")
    # alone, the decoder strips the word's leading space; after a prompt it must keep it
    assert "".join(stream(sp_tok, word)) == "the"
    assert "".join(stream(sp_tok, word, sp_tok.encode("Once upon a time"))) == " the"


def test_encode_decode_basics(demo_tok: Tokenizer) -> None:
    assert demo_tok.encode("") == []
    assert demo_tok.decode(demo_tok.encode("a\n\nb  c")) == "a\n\nb  c"
    with pytest.raises(TypeError):
        demo_tok.encode(b"bytes")  # type: ignore[arg-type]


def _tok_with(template) -> Tokenizer:
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    return Tokenizer(Backend(models.BPE()), bos_token="<s>", eos_token="</s>", chat_template=template)


TRICKY = """{%- set ns = namespace(sys=none) -%}
{%- for m in messages %}
  {%- if m['role'] == 'system' %}{% set ns.sys = m['content'] %}{% continue %}{% endif %}
  {%- if loop.index0 > 6 %}{% break %}{% endif %}
{{ bos_token }}[{{ m['role'] | upper }}] {{ m['content'] | trim }}
  {% if not loop.last %}---{% endif %}
{%- endfor %}
{%- if tools %}
TOOLS: {{ tools | tojson }}
{%- endif %}
{%- if ns.sys %} SYS={{ ns.sys | tojson(indent=2) }}{% endif %}
{%- if add_generation_prompt %}
[ASSISTANT]{% endif %}{{ eos_token }}"""


def test_template_renders_like_transformers() -> None:
    import transformers  # a test extra: missing must fail, not skip
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    ours = _tok_with(TRICKY)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=Backend(models.BPE()), chat_template=TRICKY,
                                              bos_token="<s>", eos_token="</s>")
    msgs = [{"role": "system", "content": "Sé bref — 日本"}, {"role": "user", "content": "  Hi  "},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Weather?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Météo"}}]
    for gen in (True, False):
        for kwargs in ({}, {"tools": tools}):
            want = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kwargs)
            assert ours.apply_chat_template(msgs, add_generation_prompt=gen, **kwargs) == want
    assert '"Météo"' in ours.apply_chat_template(msgs, tools=tools)  # tojson keeps non-ASCII


def test_template_errors() -> None:
    t = _tok_with("{% if messages|length == 0 %}{{ raise_exception('need at least one message') }}{% endif %}ok")
    assert t.apply_chat_template([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="need at least one message"):
        t.apply_chat_template([])
    with pytest.raises(ChatTemplateError, match="invalid chat template"):
        _tok_with("{% for %}").apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="no chat template"):
        _tok_with(None).apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="no 'default'"):
        _tok_with({"tool_use": "x"}).apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="list of dicts"):
        _tok_with("x").apply_chat_template("hello")  # type: ignore[arg-type]
    # the sandbox: templates from downloaded files cannot reach Python internals or mutate inputs
    with pytest.raises(ChatTemplateError):
        _tok_with("{{ messages.__class__.__mro__ }}").apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError):
        _tok_with("{{ messages.append(1) }}").apply_chat_template([{"role": "user", "content": "x"}])


def test_tokenizer_facts_from_demo(demo_tok: Tokenizer, tmp_path: Path) -> None:
    assert demo_tok.vocab_size == 512
    assert demo_tok.bos_token_id == 0 and demo_tok.eos_token_ids == [2, 0]
    assert demo_tok.special_token_ids == frozenset({0, 1, 2})
    assert demo_tok.encode("hi", add_special_tokens=True) == demo_tok.encode("hi")  # no BOS for ChatML models


def test_template_runtime_errors_and_overriding_variables() -> None:
    # A template doing arithmetic on a client's content raises TypeError inside Jinja: that is
    # bad input (a 400), not a server crash, so it must surface as ChatTemplateError.
    t = _tok_with("{{ messages[0]['content'] + 1 }}")
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        t.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        _tok_with("{{ 1 // 0 }}").apply_chat_template([{"role": "user", "content": "x"}])
    # transformers lets caller variables override the special-token strings
    # (template_kwargs = {**special_tokens_map, **kwargs}); it must not be a TypeError.
    t = _tok_with("{{ bos_token }}|{{ messages[0]['content'] }}")
    assert t.apply_chat_template([{"role": "user", "content": "x"}], bos_token="<B>") == "<B>|x"

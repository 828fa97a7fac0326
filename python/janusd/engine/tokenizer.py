"""Tokenizer (a `tokenizers.Tokenizer` plus special-token facts) and streaming detokenization.

The HF ``tokenizers`` Rust library does the encoding and decoding for every format:
HF dirs give it tokenizer.json directly, GGUF files are turned into one
(checkpoint/gguf_vocab.py). This class adds what a server needs around it: BOS/EOS
ids, the chat template, and an incremental detokenizer that never emits half a
UTF-8 character.
"""

from __future__ import annotations

from typing import Any

from janusd.engine.chat_template import ChatTemplateError, render_chat, select_template

REPLACEMENT_CHAR = "\ufffd"


class Tokenizer:
    """Encode/decode plus the special tokens and chat template that came with a checkpoint."""

    def __init__(
        self,
        backend: Any,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        extra_eos_token_ids: list[int] | None = None,
        chat_template: str | dict[str, str] | None = None,
        special_tokens_map: dict[str, str | None] | None = None,
    ) -> None:
        self._tok = backend
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id: int | None = backend.token_to_id(bos_token) if bos_token else None
        eos: list[int] = []
        if eos_token and backend.token_to_id(eos_token) is not None:
            eos.append(backend.token_to_id(eos_token))
        for i in extra_eos_token_ids or []:
            if i not in eos:
                eos.append(i)
        self.eos_token_ids: list[int] = eos
        self.special_token_ids: frozenset[int] = frozenset(
            i for i, t in backend.get_added_tokens_decoder().items() if t.special
        )
        self.chat_template = chat_template
        self._special_tokens_map = dict(special_tokens_map or {})
        self._special_tokens_map.setdefault("bos_token", bos_token)
        self._special_tokens_map.setdefault("eos_token", eos_token)

    @property
    def backend(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """Render a conversation to the prompt text (not ids: encode it with add_special_tokens=False)."""
        source = select_template(self.chat_template, has_tools=bool(extra.get("tools")))
        if source is None:
            raise ChatTemplateError("this checkpoint has no chat template")
        return render_chat(source, messages, add_generation_prompt, self._special_tokens_map, **extra)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas that are always whole characters.

    Decoding one token at a time breaks byte-level BPE (a character's UTF-8 bytes can
    span tokens) and SentencePiece spacing (a token's leading space depends on what
    precedes it). So we keep two offsets into the id list: ``prefix`` (start of a short
    context window) and ``read`` (end of what has been emitted). Each step decodes the
    window with and without the new tokens and emits the difference, unless it ends in
    U+FFFD, i.e. an incomplete character, which is held back until the next token
    completes it. ``prompt_ids_tail`` (the last few prompt ids) is the initial context.
    """

    def __init__(self, tok: Tokenizer, prompt_ids_tail: list[int] | None = None, skip_special_tokens: bool = True):
        self._tok = tok
        self._skip = skip_special_tokens
        self._ids: list[int] = list(prompt_ids_tail or [])[-6:]
        self._prefix = 0
        self._read = len(self._ids)

    def add(self, token_id: int) -> str:
        """Append one token; return the newly completed text (possibly empty)."""
        self._ids.append(int(token_id))
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        new_text = self._tok.decode(self._ids[self._prefix :], self._skip)
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = new_text[len(prefix_text) :]
        # keep a small context window: the last emitted chunk becomes the new prefix
        self._prefix = self._read
        self._read = len(self._ids)
        return delta

    def flush(self) -> str:
        """Return whatever is still held back (at the end of a stream; may contain U+FFFD)."""
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        new_text = self._tok.decode(self._ids[self._prefix :], self._skip)
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""

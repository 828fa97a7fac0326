"""Prompts to token ids on the worker, for the daemon (which never imports a tokenizer).

Answered on the worker's reader thread, never queued behind a step: tokenizers release
the GIL, so a prompt is tokenized while the main thread is inside a step.
"""

from __future__ import annotations

from typing import Any

from janusd.wire import worker_msgs as wm


def tokenize_prompt(tokenizer: Any, prompt: str | None, messages: list[wm.ChatMessage] | None) -> list[int]:
    """Chat messages go through the checkpoint's chat template (whose text already holds
    any BOS), a plain prompt is encoded with the tokenizer's special tokens."""
    if messages is not None:
        text = tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True
        )
        return list(tokenizer.encode(text, add_special_tokens=False))
    if prompt is None:
        raise ValueError("neither a prompt nor messages were given")
    return list(tokenizer.encode(prompt, add_special_tokens=True))


def tokenize(models: dict[str, Any], msg: wm.Tokenize) -> wm.Tokenized | wm.ErrorReply:
    me = models.get(msg.model)
    if me is None:
        return wm.ErrorReply(msg.seq, f"model {msg.model!r} is not loaded on this worker", "bad_request")
    try:
        return wm.Tokenized(msg.seq, tokenize_prompt(me.tokenizer, msg.prompt, msg.messages))
    except Exception as e:  # a template or tokenizer error is the client's input
        return wm.ErrorReply(msg.seq, f"cannot tokenize the prompt: {e}", "bad_request")

"""Prompts to token ids on the worker, for the daemon (which never imports a tokenizer),
and which failures are the client's.

Answered on the worker's reader thread, never queued behind a step: tokenizers release
the GIL, so a prompt is tokenized while the main thread is inside a step.

A template or tokenizer that rejects what the client sent is a 400: the client can fix
it. Anything else raised while tokenizing is a bug, here or in the checkpoint's
tokenizer: it is answered as an internal error, logged with its traceback and counted
(Stats.errors["tokenize"]), never passed off as the client's mistake.
"""

from __future__ import annotations

from typing import Any

from jinja2 import TemplateError

from janusd.engine.worker_log import Caught
from janusd.wire import worker_msgs as wm

# The client's input errors. ValueError covers ChatTemplateError (engine/chat_template.py:
# the template refused the messages with raise_exception, failed on their content, or the
# checkpoint has no template for chat messages), UnicodeError (text the tokenizer cannot
# take, such as a lone surrogate) and neither a prompt nor messages; TemplateError is
# Jinja's own, should a template raise one past render_chat.
INPUT_ERRORS: tuple[type[Exception], ...] = (ValueError, TemplateError)


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


def tokenize(models: dict[str, Any], msg: wm.Tokenize, caught: Caught) -> wm.Tokenized | wm.RequestFailed:
    me = models.get(msg.model)
    if me is None:  # a state move raced the message: the core tokenizes it elsewhere
        return wm.RequestFailed(msg.req_id, f"model {msg.model!r} is not loaded on this worker", "unavailable")
    try:
        return wm.Tokenized(msg.req_id, tokenize_prompt(me.tokenizer, msg.prompt, msg.messages))
    except INPUT_ERRORS as e:
        return wm.RequestFailed(msg.req_id, f"cannot tokenize the prompt: {e}", "bad_request")
    except Exception as e:
        caught("tokenize", f"tokenizing a prompt for {msg.model} failed (not the client's input)")
        return wm.RequestFailed(msg.req_id, f"internal error while tokenizing the prompt for {msg.model!r} "
                                f"(see the worker log): {type(e).__name__}", "internal")

"""Chat templates rendered the way HF transformers renders them.

A checkpoint's chat template is a Jinja2 program written against transformers'
environment, so we reproduce that environment: a sandbox (templates come from
downloaded files), trim_blocks + lstrip_blocks, the loopcontrols extension, a
``tojson`` that keeps non-ASCII text, and the globals ``raise_exception`` and
``strftime_now``. Special-token strings (bos_token, eos_token, ...) are template
variables, as in transformers.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template is invalid, or it rejected the messages (raise_exception)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def _compile(source: str) -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except TemplateError as e:
        raise ChatTemplateError(f"invalid chat template: {e}") from e


def select_template(template: str | dict[str, str] | None, has_tools: bool = False) -> str | None:
    """Pick the template source: a plain string, or from named templates ('tool_use' when tools are given)."""
    if template is None or isinstance(template, str):
        return template
    if has_tools and "tool_use" in template:
        return template["tool_use"]
    if "default" in template:
        return template["default"]
    raise ChatTemplateError(f"no 'default' among the named chat templates {sorted(template)}")


def render_chat(
    source: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    special_tokens: dict[str, str | None],
    **extra: Any,
) -> str:
    """Render ``messages`` with the template ``source``; ``extra`` becomes template variables (tools, ...)."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ChatTemplateError("messages must be a list of dicts with 'role' and 'content'")
    template = _compile(source)
    # As transformers does: caller variables override the special-token strings (passing
    # both as keywords would be a TypeError when a name is in both).
    context = {**special_tokens, **extra, "messages": messages, "add_generation_prompt": add_generation_prompt}
    try:
        return template.render(**context)
    except ChatTemplateError:
        raise
    except Exception as e:  # noqa: BLE001 - a template is an untrusted program run on client input:
        # besides TemplateError it raises TypeError, ZeroDivisionError, ... on odd content,
        # and each is a rejected request, never a crash of the server.
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from e

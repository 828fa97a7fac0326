"""OpenAI-compatible request bodies as msgspec Structs, and their checks.

msgspec decodes and validates in one pass (types and ranges via Meta); a failure
becomes an ApiError(400) whose `param` is the JSON path msgspec reports, so clients get
OpenAI-style errors: {"error": {"message", "type", "param", "code"}}. Fields clients
send that we ignore harmlessly (user, store, metadata, service_tier, n = 1, tools = [],
response_format {"type": "text"}, ...) are accepted; features we do not implement (n > 1,
penalties, logprobs, echo, tools, functions, tool_choice, JSON mode / structured output
via response_format) are refused with a 400 naming the field rather than silently
ignored. A top-level field this server does not know is refused too (param = the field),
unless the operator sets `server.allow_unknown_fields = true`, which ignores such fields
(the named, unimplemented ones above stay refused either way).

Extension: `slo: {ttft_ms, tpot_ms}` overrides the model's SLO for one request.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from janusd.wire.worker_msgs import ChatMessage, SamplingSpec

PosFloat = Annotated[float, Meta(gt=0, le=3.6e6)]
# token ids travel as msgpack ints to the worker; anything past int32 is no vocabulary's id
# (and past 2**64 cannot even be encoded), so refuse it here with a 400
MAX_TOKEN_ID = 2**31 - 1
TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]
MAX_STOPS = 32
MAX_STOP_CHARS = 1024


class ApiError(Exception):
    """An error a client caused or must hear about; rendered as an OpenAI error body."""

    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
        code: str | None = None, headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class SLO(Struct, forbid_unknown_fields=True):
    ttft_ms: PosFloat | None = None
    tpot_ms: PosFloat | None = None


class StreamOptions(Struct):
    include_usage: bool = False


class ResponseFormat(Struct):
    # only {"type": "text"} (the default: plain text) is served; json_object and json_schema
    # (JSON mode, structured output) would need constrained decoding, which is not built
    type: str


class _Common(Struct, kw_only=True):
    model: Annotated[str, Meta(min_length=1, max_length=256)]
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    n: Annotated[int, Meta(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    # bounded: the worker checks every stop string after every token of the request, so 10^5
    # of them would slow the whole device (all its models) for as long as the request runs
    stop: Annotated[str, Meta(max_length=MAX_STOP_CHARS)] | Annotated[
        list[Annotated[str, Meta(min_length=1, max_length=MAX_STOP_CHARS)]], Meta(max_length=MAX_STOPS)] | None = None
    stop_token_ids: list[TokenId] | None = None
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    presence_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Meta(ge=-2, le=2)] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Meta(ge=0)] = 0
    user: str | None = None
    slo: SLO | None = None
    logit_bias: dict[str, float] | None = None
    # named so they are refused with a clear 400 (_unimplemented) also when the operator lets
    # unknown fields through; the harmless values (tools = [], tool_choice "none"/"auto"
    # with no tools, response_format text) are accepted
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[Any]
    max_tokens: Annotated[int, Meta(ge=1)] | None = 16
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Meta(ge=1)] | None = None


class ContentPart(Struct):
    type: Literal["text"]
    text: str


class Message(Struct):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatRequest(_Common, kw_only=True):
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # sent by OpenAI clients and SDKs; they change nothing about the text generated
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    modalities: list[str] | None = None


# the decoders used unless server.allow_unknown_fields: an unknown top-level field is an error
class _StrictCompletionRequest(CompletionRequest, kw_only=True, forbid_unknown_fields=True):
    pass


class _StrictChatRequest(ChatRequest, kw_only=True, forbid_unknown_fields=True):
    pass


class Parsed(Struct, kw_only=True):
    """A checked request, ready to tokenize and queue."""

    model: str
    chat: bool
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    sampling: SamplingSpec
    max_tokens_given: bool
    stream: bool
    include_usage: bool
    ttft_ms: float | None = None
    tpot_ms: float | None = None


def _validation_error(e: msgspec.ValidationError) -> ApiError:
    msg = str(e)
    param = None
    if " - at `$" in msg:
        msg, where = msg.split(" - at `$", 1)
        param = where.rstrip("`").lstrip(".") or None
    if msg.startswith("Object contains unknown field `"):
        key = msg.split("`")[1]
        hint = "" if param else " (an operator can set server.allow_unknown_fields = true to ignore such fields)"
        param = f"{param}.{key}" if param else key
        return ApiError(400, f"{param}: unknown field, not implemented by this server{hint}", param=param,
                        code="unknown_field")
    return ApiError(400, f"{param}: {msg}" if param else msg, param=param)


_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def _decode(body: bytes, typ: type[Any]) -> Any:
    dec = _DECODERS.get(typ)
    if dec is None:
        dec = _DECODERS[typ] = msgspec.json.Decoder(typ)
    try:
        return dec.decode(body)
    except msgspec.ValidationError as e:
        raise _validation_error(e) from None
    except msgspec.DecodeError as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None


def _refuse(param: str, what: str) -> ApiError:
    return ApiError(400, f"{param}: {what} is not supported by this server", param=param, code="unsupported")


def _unimplemented(r: _Common) -> None:
    """Refuse the named features this server does not implement (never silently ignored)."""
    if r.tools:
        raise _refuse("tools", "tool calling")
    if r.functions:
        raise _refuse("functions", "function calling")
    # "none" (and "auto" with no tools, as tools were refused above) ask for plain text
    if r.tool_choice is not None and r.tool_choice not in ("none", "auto"):
        raise _refuse("tool_choice", "tool calling (tool_choice other than \"none\" or \"auto\")")
    if r.function_call is not None and r.function_call not in ("none", "auto"):
        raise _refuse("function_call", "function calling (function_call other than \"none\" or \"auto\")")
    if r.response_format is not None and r.response_format.type != "text":
        raise ApiError(400, f"response_format: type {r.response_format.type!r} is not supported by this server "
                       "(JSON mode and structured output are not implemented; only \"text\" is)",
                       param="response_format", code="unsupported")


def _common(r: _Common, max_tokens: int | None) -> tuple[SamplingSpec, bool]:
    _unimplemented(r)
    if r.n != 1:
        raise _refuse("n", "n > 1")
    if r.logit_bias:
        raise _refuse("logit_bias", "logit_bias")
    if r.presence_penalty or r.frequency_penalty:
        raise _refuse("presence_penalty" if r.presence_penalty else "frequency_penalty", "a non-zero penalty")
    stop = [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
    if isinstance(r.stop, str) and not r.stop:
        raise ApiError(400, "stop: stop strings must be non-empty", param="stop")
    top_k = r.top_k if r.top_k is not None and r.top_k > 0 else 0
    if max_tokens is not None and r.min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens: must be <= max_tokens ({max_tokens})", param="min_tokens")
    spec = SamplingSpec(
        max_tokens=max_tokens or 1,
        temperature=1.0 if r.temperature is None else r.temperature,
        top_k=top_k,
        top_p=1.0 if r.top_p is None else r.top_p,
        seed=r.seed,
        stop=stop,
        stop_token_ids=list(r.stop_token_ids or []),
        ignore_eos=r.ignore_eos,
        min_tokens=r.min_tokens,
    )
    return spec, max_tokens is not None


def _slo(r: _Common) -> tuple[float | None, float | None]:
    return (r.slo.ttft_ms, r.slo.tpot_ms) if r.slo is not None else (None, None)


def parse_completion(body: bytes, allow_unknown_fields: bool = False) -> Parsed:
    r: CompletionRequest = _decode(body, CompletionRequest if allow_unknown_fields else _StrictCompletionRequest)
    if r.logprobs is not None:
        raise _refuse("logprobs", "logprobs")
    if r.echo:
        raise _refuse("echo", "echo")
    if r.suffix:
        raise _refuse("suffix", "suffix")
    if r.best_of is not None and r.best_of > 1:
        raise _refuse("best_of", "best_of > 1")
    prompt: str | None = None
    ids: list[int] | None = None
    if isinstance(r.prompt, str):
        prompt = r.prompt
    elif len(r.prompt) == 1 and isinstance(r.prompt[0], str):
        prompt = r.prompt[0]
    elif r.prompt and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID
                                  for t in r.prompt):
        ids = list(r.prompt)
    else:
        raise ApiError(400, f"prompt: must be a string, a list of one string, or a non-empty list of token ids "
                       f"(integers in [0, {MAX_TOKEN_ID}])",
                       param="prompt")
    if prompt is not None and not prompt:
        raise ApiError(400, "prompt: must not be empty", param="prompt")
    spec, given = _common(r, r.max_tokens)
    ttft, tpot = _slo(r)
    return Parsed(
        model=r.model, chat=False, prompt=prompt, prompt_ids=ids, sampling=spec, max_tokens_given=given,
        stream=r.stream, include_usage=bool(r.stream_options and r.stream_options.include_usage),
        ttft_ms=ttft, tpot_ms=tpot,
    )


def parse_chat(body: bytes, allow_unknown_fields: bool = False) -> Parsed:
    r: ChatRequest = _decode(body, ChatRequest if allow_unknown_fields else _StrictChatRequest)
    if r.logprobs:
        raise _refuse("logprobs", "logprobs")
    if r.top_logprobs:
        raise _refuse("top_logprobs", "top_logprobs")
    if r.modalities is not None and set(r.modalities) - {"text"}:
        raise _refuse("modalities", "output other than text")
    msgs = []
    for i, m in enumerate(r.messages):
        if isinstance(m.content, list):
            text = "".join(p.text for p in m.content)
        elif m.content is None:
            raise ApiError(400, f"messages[{i}].content: is required", param=f"messages[{i}].content")
        else:
            text = m.content
        msgs.append(ChatMessage("system" if m.role == "developer" else m.role, text))
    mt = r.max_completion_tokens if r.max_completion_tokens is not None else r.max_tokens
    spec, given = _common(r, mt)
    ttft, tpot = _slo(r)
    return Parsed(
        model=r.model, chat=True, messages=msgs, sampling=spec, max_tokens_given=given, stream=r.stream,
        include_usage=bool(r.stream_options and r.stream_options.include_usage), ttft_ms=ttft, tpot_ms=tpot,
    )

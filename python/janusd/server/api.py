"""The OpenAI-compatible HTTP API (aiohttp): completions, chat, models, health, metrics.

Handlers only translate: JSON body -> Parsed (openai_types.py) -> Daemon.admit() ->
events -> JSON or SSE. Every error a client can cause leaves as an OpenAI error body
with its status (400/401/404/408/413/429/503); nothing a client sends reaches a traceback.
A streaming request that fails before its first token gets a plain HTTP error; one
that fails later gets an SSE `error` event and then `data: [DONE]`. A client that goes
away (the handler is cancelled, or a write fails) has its request aborted on the worker,
which frees its KV blocks.

Slow clients are bounded (server.header_timeout_s, body_timeout_s, keepalive_timeout_s):
aiohttp has a keep-alive timeout but no limit on the time to send a request head, so
_TimedRequestHandler adds one; the body is read with a deadline before admission (408),
so a slow client holds a connection for a bounded time and never a queue place or a worker.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from janusd.config import JanusConfig
from janusd.core import Failure, Refused, Request
from janusd.log import log as _log
from janusd.server.daemon_clock import wall_clock
from janusd.server.openai_types import ApiError, Parsed, parse_chat, parse_completion
from janusd.wire.worker_msgs import TokenDelta


class Frontend(Protocol):
    """What the HTTP API needs of the daemon (server/daemon.py implements it)."""

    started_wall: float

    @property
    def cfg(self) -> JanusConfig: ...
    def admit(self, p: Parsed, request_id: str = "") -> tuple[Request, asyncio.Queue[Any]]: ...
    def cancel(self, req: Request) -> None: ...
    def health(self) -> dict[str, Any]: ...
    def models_view(self) -> list[dict[str, Any]]: ...
    def metrics_text(self) -> bytes: ...


DAEMON: web.AppKey[Frontend] = web.AppKey("daemon")
REQUEST_ID_HEADER = "X-Request-Id"
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
_json = msgspec.json.Encoder()


def _error_response(e: ApiError) -> web.Response:
    r = web.Response(status=e.status, body=_json.encode(e.body()), content_type="application/json",
                     headers=e.headers)
    if e.status == 408:
        r.force_close()  # Connection: close: a client too slow to send its body is not kept
    return r


def request_id(request: web.Request) -> str:
    """The id a request is traced by in the log and the response's X-Request-Id: the
    client's own X-Request-Id when it is a plain token (so a caller can join its logs with
    ours), else a fresh random one. Set once per HTTP request by the middleware."""
    rid = request.get("request_id")
    if rid is None:
        given = request.headers.get(REQUEST_ID_HEADER, "")
        rid = given if _CLIENT_ID.fullmatch(given) else secrets.token_hex(12)
        request["request_id"] = rid
    return rid


@web.middleware
async def errors_and_auth(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    resp = await _errors_and_auth(request, handler)
    if not resp.prepared:  # a stream set it before its head went out
        resp.headers[REQUEST_ID_HEADER] = request_id(request)
    return resp


async def _errors_and_auth(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    daemon = request.app[DAEMON]
    try:
        if request.path.startswith("/v1/") and daemon.cfg.server.api_keys:
            auth = request.headers.get("Authorization", "")
            key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            if not any(secrets.compare_digest(key, k) for k in daemon.cfg.server.api_keys):
                raise ApiError(401, "missing or invalid API key (send 'Authorization: Bearer KEY')",
                               "authentication_error", code="invalid_api_key")
        return await handler(request)
    except ApiError as e:
        return _error_response(e)
    except Refused as r:
        _log.debug("request %s refused: %d %s", request_id(request), r.failure.status, r.failure.message)
        return _error_response(_failure_error(r.failure))
    except web.HTTPRequestEntityTooLarge:
        return _error_response(ApiError(
            413, f"request body exceeds {daemon.cfg.server.max_body_bytes} bytes", code="request_too_large"))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _error_response(ApiError(e.status, e.reason, "invalid_request_error"))
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        _log.exception("request %s: internal error", request_id(request))
        return _error_response(ApiError(500, "internal server error (logged by the daemon)", "server_error"))


def _usage(req: Request) -> dict[str, int]:
    p, c = len(req.prompt_ids), req.num_output_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _finish_reason(r: str | None) -> str | None:
    return "stop" if r == "abort" else r


class _Shape:
    """The OpenAI response shapes of one request (completion or chat)."""

    def __init__(self, parsed: Parsed, request_id: str) -> None:
        self.chat = parsed.chat
        self.model = parsed.model
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + request_id
        self.created = int(wall_clock())

    def chunk(self, text: str | None, finish: str | None, role: bool = False,
              token_ids: list[int] | None = None) -> dict[str, Any]:
        """One SSE chunk. `token_ids` (an extension, as vLLM's) lists the tokens behind the
        text, so per-token SLO accounting stays exact when a chunk holds several tokens or
        none of their text yet (held back for UTF-8 or a possible stop string, or an EOS
        token, which has none). As OpenAI's, a chat delta carries `content` only when there
        is some (or "" on the first, role chunk): a chunk without text has the delta {}."""
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text or (role and text is not None):
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        if token_ids:
            choice["token_ids"] = token_ids
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [],
                "usage": usage}

    def full(self, text: str, finish: str | None, usage: dict[str, int]) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice],
                "usage": usage}


def _failure_error(f: Failure) -> ApiError:
    headers = {"Retry-After": str(max(1, round(f.retry_after_s)))} if f.retry_after_s is not None else None
    return ApiError(f.status, f.message, f.type, param=f.param, code=f.code, headers=headers)


async def _read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body within timeout_s of the handler's start (the head is parsed), else 408;
    the connection is then closed (after aiohttp's lingering read of up to 10 s, which lets
    the client see the 408 rather than a reset)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise ApiError(408, f"request body not received within {timeout_s:g} s", code="request_timeout") from None


async def _generate(request: web.Request, parse: Callable[[bytes, bool], Parsed]) -> web.StreamResponse:
    daemon = request.app[DAEMON]
    # read before admission: a slow body holds only its connection, never a queue place
    body = await _read_body(request, daemon.cfg.server.body_timeout_s)
    parsed = parse(body, daemon.cfg.server.allow_unknown_fields)
    rid = request_id(request)
    req, events = daemon.admit(parsed, rid)
    shape = _Shape(parsed, rid)
    try:
        first = await events.get()
        if isinstance(first, Failure):
            raise _failure_error(first)
        if parsed.stream:
            return await _stream(request, req, events, parsed, shape, first)
        text = [first.text]
        ev: Any = first
        while not ev.finished:
            ev = await events.get()
            if isinstance(ev, Failure):
                raise _failure_error(ev)
            text.append(ev.text)
        return web.Response(body=_json.encode(shape.full("".join(text), _finish_reason(ev.finish_reason),
                                                         _usage(req))), content_type="application/json")
    finally:
        if not req.done:
            daemon.cancel(req)


async def _stream(request: web.Request, req: Request, events: asyncio.Queue[Any], parsed: Parsed,
                  shape: _Shape, first: TokenDelta) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       REQUEST_ID_HEADER: request_id(request)})
    await resp.prepare(request)

    async def send(obj: Any) -> None:
        await resp.write(b"data: " + _json.encode(obj) + b"\n\n")

    try:
        if shape.chat:
            await send(shape.chunk("", None, role=True))
        ev: Any = first
        while True:
            if isinstance(ev, Failure):
                await send(_failure_error(ev).body())
                break
            if ev.finished:
                # text of the last tokens (if any) first, then OpenAI's final chunk: no text (chat:
                # delta {}), the finish_reason, and the ids of a last delta without text (the EOS
                # token), so no chunk carries only an empty content and every id is still sent
                ids = ev.token_ids
                if ev.text:
                    await send(shape.chunk(ev.text, None, token_ids=ids))
                    ids = []
                await send(shape.chunk(None, _finish_reason(ev.finish_reason), token_ids=ids))
                if parsed.include_usage:
                    await send(shape.usage_chunk(_usage(req)))
                break
            if ev.text or ev.token_ids:
                await send(shape.chunk(ev.text, None, token_ids=ev.token_ids))
            ev = await events.get()
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError):
        pass  # client gone: the caller's finally aborts the request
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_completion)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_chat)


async def list_models(request: web.Request) -> web.Response:
    daemon = request.app[DAEMON]
    data = [{"object": "model", "created": int(daemon.started_wall), "owned_by": "janusd", **m}
            for m in daemon.models_view()]
    return web.json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    daemon = request.app[DAEMON]
    h = daemon.health()
    # 200 while serving (also "degraded": a worker is restarting, other models serve),
    # 503 while starting or draining, so a load balancer stops sending new work
    return web.json_response(h, status=200 if h["state"] == "running" else 503)


async def metrics(request: web.Request) -> web.Response:
    daemon = request.app[DAEMON]
    return web.Response(body=daemon.metrics_text(), headers={"Content-Type": "text/plain; version=0.0.4"})


def make_app(daemon: Frontend) -> web.Application:
    app = web.Application(client_max_size=daemon.cfg.server.max_body_bytes, middlewares=[errors_and_auth])
    app[DAEMON] = daemon
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


def _timeout_response(message: str) -> bytes:
    body = _json.encode(ApiError(408, message, code="request_timeout").body())
    return (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


class _TimedRequestHandler(RequestHandler):
    """aiohttp's connection protocol plus a request-head deadline (aiohttp has none).

    The timer runs from the accept, and on a kept-alive connection from the first byte of
    the next request (that is, bytes arriving while the handler waits between requests);
    it stops when aiohttp's parser completes a head (its request count moves). When it
    fires, the connection is closed: with a 408 if part of a head came, silently if
    nothing came (an unsolicited 408 could be read as the answer to a later request). An
    idle kept-alive connection is aiohttp's keepalive_timeout's; a body, _read_body's.
    A head pipelined behind a request in progress is bounded by keepalive_timeout.
    """

    __slots__ = ("_head_timeout_s", "_head_timer", "_heads_at_arm", "_head_started")

    def __init__(self, manager: web.Server, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._head_timeout_s = header_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None
        self._heads_at_arm = 0
        self._head_started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # between requests (the handler awaits the next head) or inside a timed head
        waiting = self._head_timer is not None or (self._waiter is not None and not self._waiter.done())
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads:
            self._stop_head_timer()  # a head is complete (or a parse error, answered with 400)
        elif waiting and data:
            self._head_started = True
            if self._head_timer is None:
                self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._heads_at_arm = self._request_count
        self._head_timer = self._loop.call_later(self._head_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._head_started = False

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._request_count != self._heads_at_arm or self.transport is None:
            return
        if self._head_started:
            self.transport.write(_timeout_response(
                f"request head not received within {self._head_timeout_s:g} s"))
        self.force_close()  # transport.close(): the 408 is flushed first


class _TimedServer(web.Server):
    """aiohttp's Server, making _TimedRequestHandler connections."""

    def __init__(self, *args: Any, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s

    def __call__(self) -> RequestHandler:
        return _TimedRequestHandler(self, loop=self._loop, header_timeout_s=self.header_timeout_s, **self._kwargs)


class _Runner(web.AppRunner):
    """AppRunner whose Server is a _TimedServer (the same arguments, one more)."""

    def __init__(self, app: web.Application, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._header_timeout_s = header_timeout_s

    async def _make_server(self) -> web.Server:
        s = await super()._make_server()
        return _TimedServer(s.request_handler, request_factory=s.request_factory,
                            handler_cancellation=s.handler_cancellation, loop=s._loop,
                            header_timeout_s=self._header_timeout_s, **s._kwargs)


async def start_http(daemon: Frontend, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start listening; returns the runner and the bound port (useful with port 0)."""
    sv = daemon.cfg.server
    runner = _Runner(make_app(daemon), handler_cancellation=True, access_log=None,
                     header_timeout_s=sv.header_timeout_s, keepalive_timeout=sv.keepalive_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, backlog=sv.listen_backlog)
    await site.start()
    addrs = runner.addresses  # the real port when asked for 0
    bound = int(addrs[0][1]) if addrs else port
    return runner, bound

"""An OpenAI-compatible HTTP endpoint in front of a run's :class:`~gyre_core.rollout.router.Router`:
agents written against the OpenAI API are trained without a change.

Routes (``aiohttp``, served in the caller's asyncio loop, beside the router):

* ``GET /v1/models`` — the policy, by the name the endpoint was given;
* ``POST /v1/chat/completions`` — messages, ``tools``, ``stream``, ``max_tokens`` /
  ``max_completion_tokens``, ``logprobs``; replies carry ``tool_calls`` parsed from the
  model's ``<tool_call>`` blocks (:mod:`~gyre_core.rollout.chat`);
* ``POST /v1/completions`` — a text prompt or a list of token ids.

Each agent session gets its own key (:meth:`Endpoint.open`), sent as
``Authorization: Bearer KEY``, or its own base URL ``{url}/s/KEY/v1`` that needs no key.
Every call goes through the router under the session's id (so it keeps its engine, and
migrates with its tokens when that engine's unit leaves rollout) and is recorded by the
session's :class:`~gyre_core.rollout.chat_session.ChatSession` exactly as the engine
produced it: prompt and completion token ids, log-probs, policy versions.

Sampling is the run's: the session's temperature and seed apply to every call (a request's
``temperature`` and ``top_p`` are checked but not used), so that the recorded log-probs are
those of the policy the trainer corrects for; ``max_tokens`` may only lower the session's
cap. A streamed reply arrives as one content chunk (the engine returns a call whole), then
the finish chunk and ``[DONE]``.

Errors are JSON ``{"error": {"message", "type", "param", "code"}}``: 400 for a bad request
(naming the field; a prompt that leaves the model no position to generate in, given
``max_positions``, is a 400 with ``"code": "context_length_exceeded"`` naming ``messages``
or ``prompt`` and both lengths), 401 for an unknown key, 404/405 for an unknown route or method, 409 for a session
that was closed, 429 once a session's call or token budget is spent
(``"type": "budget_exhausted"``), 503 when no engine is live, 500 (logged) for anything
else; never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gyre_core.rollout.chat import ChatError, ChatFormat, ToolCall, check_messages, check_tools
from gyre_core.rollout.chat_session import ChatSession, Prompt
from gyre_core.rollout.engine import Completion, SamplingParams
from gyre_core.rollout.router import NoEngineError, Router

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
log = logging.getLogger(__name__)


class HTTPError(Exception):
    def __init__(
        self, status: int, message: str, kind: str, param: str | None = None, code: str = ""
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.code = code or None


@dataclass(slots=True)
class EndpointSession:
    key: str
    base_url: str  # an OpenAI client's base_url for this session (no key needed)
    chat: ChatSession
    router: Router
    max_tokens: int  # per call
    temperature: float
    seed: int
    max_calls: int = 0  # calls the session may make (0: no limit)
    token_budget: int = 0  # tokens it may generate (0: no limit)
    stop_reason: str | None = None  # the budget a refused call ran into
    on_call: Callable[[ChatSession], None] | None = None  # after each recorded call
    engine_error: str = ""  # the last call the engine could not serve (a 500 or 503)


def _error(
    status: int, message: str, kind: str, param: str | None = None, code: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except HTTPError as e:
        return _error(e.status, e.message, e.kind, e.param, e.code)
    except ChatError as e:
        return _error(400, str(e), "invalid_request_error", e.param)
    except NoEngineError as e:
        return _error(503, f"no engine can serve the call: {e}", "service_unavailable")
    except web.HTTPException as e:  # aiohttp's own 404 / 405 / 413
        return _error(e.status, e.reason, "invalid_request_error")
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as e:  # a bug or an engine failure: JSON, logged, never a traceback
        log.exception("endpoint: %s %s failed", request.method, request.path)
        return _error(500, f"internal error ({type(e).__name__})", "server_error")


class Endpoint:
    def __init__(
        self,
        tokenizer: Any,
        *,
        model: str = "gyre-policy",
        host: str = "127.0.0.1",
        port: int = 0,
        fmt: ChatFormat | None = None,
        max_positions: int = 0,
    ) -> None:
        self.model, self.host, self.port = model, host, port
        self.max_positions = max_positions  # the model's positions (0: no limit known)
        self.fmt = fmt if fmt is not None else ChatFormat(tokenizer)
        self.sessions: dict[str, EndpointSession] = {}
        self._closed: dict[str, str] = {}  # key -> session id, of sessions closed
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Listen (port 0: any free one); returns the endpoint's root URL."""
        app = web.Application(middlewares=[_json_errors], client_max_size=64 * 2**20)
        for root in ("/v1", "/s/{key}/v1"):
            app.router.add_get(f"{root}/models", self._models)
            app.router.add_post(f"{root}/chat/completions", self._chat)
            app.router.add_post(f"{root}/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open(
        self,
        session_id: str,
        router: Router,
        *,
        max_tokens: int,
        temperature: float,
        seed: int,
        max_calls: int = 0,
        token_budget: int = 0,
        on_call: Callable[[ChatSession], None] | None = None,
    ) -> EndpointSession:
        """A new agent session on ``router``: its key, base URL and recorder; ``on_call``
        runs after each of its calls is recorded."""
        key = secrets.token_urlsafe(18)
        s = EndpointSession(
            key, f"{self.url}/s/{key}/v1", ChatSession(session_id, self.fmt), router,
            max_tokens, temperature, seed, max_calls, token_budget, on_call=on_call,
        )  # fmt: skip
        self.sessions[key] = s
        return s

    def close_session(self, key: str) -> ChatSession:
        """No more calls for this session (they get 409); its recorded calls."""
        s = self.sessions.pop(key)
        self._closed[key] = s.chat.session_id
        return s.chat

    # ------------------------------------------------------------------ requests

    def _session(self, request: web.Request) -> EndpointSession:
        key = request.match_info.get("key")
        if key is None:
            auth = request.headers.get("Authorization", "")
            key = auth[7:].strip() if auth.startswith("Bearer ") else ""
        s = self.sessions.get(key)
        if s is None and key in self._closed:
            raise HTTPError(409, f"session {self._closed[key]} is closed", "invalid_request_error")
        if s is None:
            raise HTTPError(401, "unknown session key", "authentication_error")
        return s

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError as e:
            raise HTTPError(400, f"body: not JSON ({e})", "invalid_request_error", "body") from None
        if not isinstance(body, dict):
            raise HTTPError(400, "body: expected a JSON object", "invalid_request_error", "body")
        if not isinstance(body.get("model"), str):
            raise ChatError("model", "expected a string")
        if body.get("n", 1) != 1:
            raise ChatError("n", "only n = 1 is supported")
        for name, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
            v = body.get(name)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi
            ):
                raise ChatError(name, f"expected a number in [{lo}, {hi}], got {v!r}")
        if not isinstance(body.get("stream", False), bool):
            raise ChatError("stream", "expected true or false")
        return body

    @staticmethod
    def _cap(s: EndpointSession, body: dict[str, Any]) -> int:
        """The call's token cap: the session's, lowered by the request's and by what is
        left of the session's token budget; a 429 once a budget is spent."""
        cap = s.max_tokens
        spent = None
        if s.max_calls and s.chat.issued >= s.max_calls:
            spent = ("max_turns", f"{s.max_calls} calls")
        elif s.token_budget and s.chat.generated >= s.token_budget:
            spent = ("token_budget", f"{s.token_budget} generated tokens")
        if spent is not None:
            s.stop_reason = spent[0]
            raise HTTPError(429, f"the session's budget is spent: {spent[1]}", "budget_exhausted")
        if s.token_budget:
            cap = min(cap, s.token_budget - s.chat.generated)
        for name in ("max_completion_tokens", "max_tokens"):
            v = body.get(name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ChatError(name, f"expected an integer >= 1, got {v!r}")
            cap = min(cap, v)
        return cap

    def _fit(self, prompt: Prompt, cap: int, param: str) -> int:
        """The call's cap within the model's positions; a 400 naming ``param`` for a prompt
        that leaves none to generate in (OpenAI's context_length_exceeded)."""
        if not self.max_positions:
            return cap
        if len(prompt.ids) >= self.max_positions:
            raise HTTPError(
                400,
                f"{param}: this model's maximum context length is {self.max_positions} tokens; "
                f"the {param} are {len(prompt.ids)} tokens, leaving none to generate",
                "invalid_request_error",
                param,
                "context_length_exceeded",
            )
        return min(cap, self.max_positions - len(prompt.ids))

    async def _call(self, s: EndpointSession, cap: int, prompt: Prompt) -> tuple[str, Completion]:
        """Route one call under the session's id; the call's id and the engine's output.
        An engine that cannot serve it is noted in ``s.engine_error``."""
        call_id, n = s.chat.reserve()
        params = SamplingParams(
            max_tokens=cap,
            temperature=s.temperature,
            stop_token_ids=self.fmt.stop_ids(),
            seed=(s.seed * 1_000_003 + n) % 2**63,
        )
        try:
            out = await s.router.generate(
                s.chat.session_id, prompt.ids, params, request_id=f"{s.chat.session_id}/{call_id}"
            )
        except Exception as e:  # not CancelledError: the agent went away, the engine is fine
            s.engine_error = f"{type(e).__name__}: {e}"
            raise
        return call_id, out

    @staticmethod
    def _record(
        s: EndpointSession, call_id: str, prompt: Prompt, out: Completion
    ) -> tuple[str, tuple[ToolCall, ...]]:
        reply = s.chat.record(call_id, prompt, out)
        if s.on_call is not None:
            s.on_call(s.chat)
        return reply

    async def _models(self, request: web.Request) -> web.Response:
        self._session(request)
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "gyre"}],
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        s = self._session(request)
        body = await self._body(request)
        messages = self.fmt.with_tools(
            check_messages(body.get("messages")), check_tools(body.get("tools"))
        )
        cap = self._cap(s, body)
        prompt = s.chat.prompt(messages)
        cap = self._fit(prompt, cap, "messages")
        call_id, out = await self._call(s, cap, prompt)
        content, calls = self._record(s, call_id, prompt, out)
        finish = "tool_calls" if calls else ("length" if out.finish_reason == "length" else "stop")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content or (None if calls else ""),
        }
        if calls:
            message["tool_calls"] = [_tool_call(c) for c in calls]
        usage = _usage(prompt, out)
        rid = f"chatcmpl-{s.chat.session_id}-{call_id}".replace("/", "-")
        logprobs = self._logprobs(out) if body.get("logprobs") else None
        gyre = {"call_id": call_id, "token_ids": out.token_ids, "versions": out.versions}
        if body.get("stream"):
            return await self._stream(request, rid, message, finish, logprobs, usage, body, gyre)
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}
        return web.json_response(
            {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": self.model,
             "choices": [choice], "usage": usage, "gyre": gyre}
        )  # fmt: skip

    async def _stream(
        self, request: web.Request, rid: str, message: dict[str, Any], finish: str,
        logprobs: dict[str, Any] | None, usage: dict[str, int], body: dict[str, Any], gyre: dict[str, Any],
    ) -> web.StreamResponse:  # fmt: skip
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        head = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
        }

        async def send(delta: dict[str, Any], reason: str | None = None, **more: Any) -> None:
            chunk = {
                **head,
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason, **more}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        await send({"role": "assistant", "content": ""})
        if message.get("content"):
            await send({"content": message["content"]}, logprobs=logprobs)
        for i, call in enumerate(message.get("tool_calls", [])):
            await send({"tool_calls": [{"index": i, **call}]})
        await send({}, finish)
        if isinstance(body.get("stream_options"), dict) and body["stream_options"].get(
            "include_usage"
        ):
            await resp.write(
                f"data: {json.dumps({**head, 'choices': [], 'usage': usage, 'gyre': gyre})}\n\n".encode()
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _completions(self, request: web.Request) -> web.Response:
        s = self._session(request)
        body = await self._body(request)
        if body.get("stream"):
            raise ChatError("stream", "streaming is served for chat completions only")
        raw = body.get("prompt")
        if isinstance(raw, str) and raw:
            ids = self.fmt.codec.encode(raw)
        elif (
            isinstance(raw, list)
            and raw
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in raw)
        ):
            ids = list(raw)
        else:
            raise ChatError("prompt", "expected a non-empty string or list of token ids")
        cap = self._cap(s, body)
        prompt = s.chat.text_prompt(ids)
        cap = self._fit(prompt, cap, "prompt")
        call_id, out = await self._call(s, cap, prompt)
        text, _ = self._record(s, call_id, prompt, out)
        finish = "length" if out.finish_reason == "length" else "stop"
        choice = {"index": 0, "text": text, "finish_reason": finish,
                  "logprobs": self._logprobs(out)["content"] if body.get("logprobs") else None}  # fmt: skip
        return web.json_response(
            {"id": f"cmpl-{s.chat.session_id}-{call_id}".replace("/", "-"), "object": "text_completion",
             "created": int(time.time()), "model": self.model, "choices": [choice],
             "usage": _usage(prompt, out),
             "gyre": {"call_id": call_id, "token_ids": out.token_ids, "versions": out.versions}}
        )  # fmt: skip

    def _logprobs(self, out: Completion) -> dict[str, Any]:
        content = []
        for tok, lp in zip(out.token_ids, out.logprobs, strict=True):
            text = self.fmt.codec.decode([tok])
            content.append(
                {"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []}
            )
        return {"content": content}


def _tool_call(c: ToolCall) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def _usage(prompt: Prompt, out: Completion) -> dict[str, int]:
    n = len(out.token_ids)
    return {
        "prompt_tokens": len(prompt.ids),
        "completion_tokens": n,
        "total_tokens": len(prompt.ids) + n,
    }


__all__ = ["Endpoint", "EndpointSession"]

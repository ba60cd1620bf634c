"""OpenAI-compatible completions and chat completions, unary and streamed (server-sent events).

Output length is the request's ``max_tokens`` (``max_completion_tokens`` for chat; 32 when absent, TensorRT-LLM's
SamplingParams default); ``finish_reason`` is ``length``. ``usage`` is always in unary responses and, when
``stream_options.include_usage`` is set, in a last chunk with no choices, as OpenAI specifies.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web

from ..request import RequestRejected
from .server import DEFAULT_MAX_TOKENS, ClientGone, Handle, SimServer, error_response
from .text import chat_ids, filler, prompt_ids

BODY_READ_TIMEOUT_S = 30.0  # a client that sends its headers but trickles the body is cut off


class OpenAIRoutes:
    def __init__(self, server: SimServer) -> None:
        self.server = server
        self._tpb = server.settings.engine.tokens_per_block

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
            prompt = prompt[0]
        try:
            ids = prompt_ids(prompt)
        except ValueError as exc:
            return error_response(str(exc))
        return await self._generate(request, body, ids, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        if isinstance(body, web.Response):
            return body
        try:
            ids = chat_ids(body.get("messages"))
        except ValueError as exc:
            return error_response(str(exc))
        return await self._generate(request, body, ids, chat=True)

    async def _generate(self, request: web.Request, body: dict, ids: list[int], chat: bool) -> web.StreamResponse:
        # Every field is checked before the request reaches the engine: a bad one is a 400 naming it,
        # never a 500 and never a request left running for nobody.
        max_tokens = body.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return error_response(f"max_tokens must be a positive integer, got {_short(max_tokens)}")
        if body.get("n", 1) != 1 or body.get("best_of", 1) not in (None, 1):
            return error_response("kvsim serves n=1 only")
        stream = body.get("stream", False)
        if stream is not None and not isinstance(stream, bool):
            return error_response(f"stream must be a boolean, got {_short(stream)}")
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            return error_response(f"stream_options must be an object, got {_short(options)}")
        include_usage = (options or {}).get("include_usage", False)
        if include_usage is not None and not isinstance(include_usage, bool):
            return error_response(f"stream_options.include_usage must be a boolean, got {_short(include_usage)}")
        model = body.get("model")
        if model is not None and not isinstance(model, str):  # any name is accepted, as trtllm-serve does
            return error_response(f"model must be a string, got {_short(model)}")
        try:
            handle = self.server.submit(ids, max_tokens)
        except RequestRejected as exc:
            return error_response(str(exc))
        model = model or self.server.settings.model_id
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        try:
            if stream:
                return await self._stream(request, handle, rid, model, chat, bool(include_usage))
            return await self._unary(request, handle, rid, model, chat)
        except (ClientGone, ConnectionError):
            return web.Response(status=499)  # nginx's "client closed request"; nobody reads it
        finally:
            if not handle.done:  # the client left (or the server is shutting down): free its blocks now
                self.server.abort(handle)

    async def _unary(self, request: web.Request, handle: Handle, rid: str, model: str,
                     chat: bool) -> web.StreamResponse:
        while not handle.done:
            await self.server.wait(request, handle)
        text = filler(0, handle.record.output_tokens)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            choice["text"] = text
        return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                  "created": int(time.time()), "model": model, "choices": [choice],
                                  "usage": _usage(handle, self._tpb)})

    async def _stream(self, request: web.Request, handle: Handle, rid: str, model: str, chat: bool,
                      include_usage: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        async def send(choices: list[dict], usage: dict | None = None) -> None:
            chunk: dict[str, Any] = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}
            if usage is not None:
                chunk["usage"] = usage
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        def choice(text: str | None, finish: str | None, role: bool = False) -> dict:
            c: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
            if chat:
                delta: dict[str, Any] = {}
                if role:
                    delta["role"] = "assistant"
                if text is not None:
                    delta["content"] = text
                c["delta"] = delta
            else:
                c["text"] = text or ""
            return c

        if chat:
            await send([choice("", None, role=True)])
        sent = 0
        while True:
            await self.server.wait(request, handle)
            produced = handle.produced
            if produced > sent:
                last = handle.done and produced >= handle.record.output_tokens
                await send([choice(filler(sent, produced - sent), "length" if last and not chat else None)])
                sent = produced
            if handle.done:
                break
        if chat:
            await send([choice(None, "length")])
        if include_usage:
            await send([], _usage(handle, self._tpb))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _usage(handle: Handle, tokens_per_block: int) -> dict:
    r = handle.record
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.output_tokens,
            "total_tokens": r.prompt_tokens + r.output_tokens,
            "prompt_tokens_details": {"cached_tokens": r.reused_blocks * tokens_per_block}}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


async def _json_body(request: web.Request) -> dict | web.Response:
    try:
        raw = await asyncio.wait_for(request.read(), BODY_READ_TIMEOUT_S)
    except asyncio.TimeoutError:
        return error_response(f"request body not received within {BODY_READ_TIMEOUT_S:g} s", 408, "RequestTimeout")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return error_response("request body must be JSON")
    if not isinstance(body, dict):
        return error_response("request body must be a JSON object")
    return body

"""The OpenAI-compatible door's web layer: the FastAPI application that serves an OpenAIDoor
(openai_door.py: what each request means), its routes and every answer in OpenAI's shape, errors
included. FastAPI is imported only when a worker serves the door (`pip install 'rlcore[http]'`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import openai_responses, openai_tokens
from .door_metrics import DoorMetrics
from .openai_door import OpenAIDoor
from .openai_errors import DoorError, invalid
from .openai_responses_stream import ResponsesStream
from .openai_stream import LiveStream

log = logging.getLogger(__name__)


def _json(raw: bytes) -> Any:
    """The request's JSON body. Bytes that are not UTF-8 decode to lone surrogates, so that the
    schema's text rule refuses them naming the parameter that holds them."""
    try:
        return json.loads(raw.decode("utf-8", "surrogateescape"))
    except RecursionError:
        raise invalid("body", "nests deeper than the JSON parser allows") from None
    except json.JSONDecodeError as e:
        raise invalid("body", f"is not valid JSON (at character {e.pos})") from None


Answered = Callable[[int, Any, float | None], None]
"""Told once a request is answered: its status, its JSON answer (None for errors) and, streamed,
when its first text went out (seconds after the start)."""


async def _streamed(
    fn: Any, body: dict[str, Any], args: tuple[Any, ...], answered: Answered, kind: type[LiveStream]
) -> Any:
    """`fn`'s answer as OpenAI's events (`kind`'s: chat or completion chunks, or the Responses
    API's), sent as the engine generates it (openai_stream.py). An error before the answer begins
    is a JSON error as any; one after it, an error event."""
    live = kind(asyncio.get_running_loop())

    def run() -> Any:
        try:
            return fn(body, *args, live)
        finally:
            live.put(None)

    answer = asyncio.ensure_future(run_in_threadpool(run))
    first = await live.events.get()
    usage = bool((body.get("stream_options") or {}).get("include_usage"))
    if first is None:  # done before it began: refused (raised here), or answered whole
        result = await answer
        answered(200, result, None)
        return StreamingResponse(live.whole(result, usage), media_type="text/event-stream")

    async def events() -> AsyncIterator[str]:
        yield first
        while (event := await live.events.get()) is not None:
            yield event
        try:
            result = await answer
        except DoorError as e:
            answered(e.status, None, live.first_text_s)
            yield live.error(e)
            return
        except Exception:
            log.exception("OpenAI door: a streamed answer failed")
            answered(500, None, live.first_text_s)
            yield live.error(DoorError(500, "internal error (the worker's log has the details)", kind="server_error"))
            return
        rest = list(live.finish(result, usage))
        answered(200, result, live.first_text_s)  # before the last event: a client may ask /metrics at once
        for event in rest:
            yield event

    return StreamingResponse(events(), media_type="text/event-stream")


async def _handle(
    door: OpenAIDoor, metrics: DoorMetrics, request: Request, fn: Any, *args: Any, endpoint: str = "",
    streams: type[LiveStream] | None = None,
) -> Any:
    """`fn`'s answer to the request's body (JSON, or with stream: true its events, in `streams`'
    terms); None: the GET `args[0]()` answers, or the model list. A request to `endpoint` is
    counted in the metrics."""
    start = time.perf_counter()

    def answered(status: int, result: Any, first_text_s: float | None) -> None:
        if endpoint:
            metrics.answered(endpoint, status, time.perf_counter() - start, result)
        if first_text_s is not None:
            metrics.first_token.observe(first_text_s)

    status, result = 500, None
    try:
        door.check_token(request.headers.get("authorization"))
        if fn is None:
            return JSONResponse(args[0]() if args else door.models())
        body = _json(await request.body())
        if streams is not None and isinstance(body, dict) and body.get("stream") is True:
            status = 0  # the stream tells its own end
            return await _streamed(fn, body, args, answered, streams)
        result = await run_in_threadpool(fn, body, *args)
        status = 200
        return JSONResponse(result)
    except DoorError as e:
        status = e.status
        return JSONResponse(e.body(), status_code=e.status)
    except Exception:  # a bug: said in OpenAI's shape, never as a bare 500 text
        status = 500
        log.exception("OpenAI door: %s %s failed", request.method, request.url.path)
        error = DoorError(500, "internal error (the worker's log has the details)", kind="server_error")
        return JSONResponse(error.body(), status_code=500)
    finally:
        if status:
            answered(status, result, None)


def build_app(door: OpenAIDoor, manages_adapters: bool = True) -> FastAPI:
    """The FastAPI application serving the door: every answer, errors included (a wrong route or
    method, a body that is not JSON, anything unexpected), in OpenAI's shape."""
    app = FastAPI(title="rlcore rollout worker (OpenAI-compatible)", docs_url=None, redoc_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        what = {
            404: f"no route {request.url.path}",
            405: f"{request.method} is not served on {request.url.path}",
        }
        error = DoorError(e.status_code, what.get(e.status_code, str(e.detail)), kind="invalid_request_error")
        return JSONResponse(error.body(), status_code=e.status_code)

    metrics = DoorMetrics(door.servicer.batching)
    handle = partial(_handle, door, metrics)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        return await handle(request, None, lambda: {"status": "ok", "model": door.model_name})

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        return await handle(request, None)

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> JSONResponse:
        return await handle(request, None, lambda: door.model(model_id))

    @app.post("/v1/completions")
    async def completions(request: Request, x_episode_id: str | None = Header(None)) -> Any:
        return await handle(request, door.completions, x_episode_id, endpoint="completions", streams=LiveStream)

    @app.post("/v1/chat/completions")
    async def chat(request: Request, x_episode_id: str | None = Header(None)) -> Any:
        return await handle(request, door.chat, x_episode_id, endpoint="chat", streams=LiveStream)

    @app.post("/v1/responses")
    async def responses(request: Request, x_episode_id: str | None = Header(None)) -> Any:
        return await handle(
            request, partial(openai_responses.serve, door), x_episode_id, endpoint="responses", streams=ResponsesStream
        )

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        return await handle(request, partial(openai_tokens.tokenize, door), endpoint="tokenize")

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Any:
        return await handle(request, partial(openai_tokens.detokenize, door), endpoint="detokenize")

    @app.get("/metrics")
    async def prometheus(request: Request) -> Any:
        try:
            door.check_token(request.headers.get("authorization"))
        except DoorError as e:
            return JSONResponse(e.body(), status_code=e.status)
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    if manages_adapters:  # the worker's own door (not a workflow's loopback one)

        @app.post("/v1/load_lora_adapter")
        async def load_adapter(request: Request) -> Any:
            return await handle(request, door.load_adapter)

        @app.post("/v1/unload_lora_adapter")
        async def unload_adapter(request: Request) -> Any:
            return await handle(request, door.unload_adapter)

    return app

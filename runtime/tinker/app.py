"""The HTTP routes the official `tinker` SDK calls (`/api/v1/...`), over TinkerService.

Request bodies are checked by the SDK's own request models (`tinker.types`, pydantic, unknown
fields refused) and forward_backward's by its protobuf (`tinker.proto.tinker_public_pb2`); answers
take the shapes the SDK reads. Every route but /healthz needs the server's key in `X-API-Key`
(the SDK sends its api_key there; it must start with `tml-`). Errors the SDK raises as its own:
a bad request is a 400 (BadRequestError) or 422 naming the field, an unknown model, sampler,
checkpoint or future a 404 (NotFoundError), a wrong key a 401; a queued request that fails is a
`{"error", "category"}` answer to retrieve_future (RequestFailedError). None of these is a status
the SDK retries. Results are long-polled: retrieve_future waits up to POLL_S for the request to
finish before answering "try_again".
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .access import CALLER, tenant_of
from .errors import NotFound, UserError
from .service import TinkerService

log = logging.getLogger("rlcore.tinker")

POLL_S = 25.0
"""How long retrieve_future holds a request that is not finished (the SDK reads for 45 s)."""
CLIENT_CONFIG = {
    "parallel_fwdbwd_chunks": False,  # a model's requests arrive in seq_id order, one at a time
    "fwdbwd_max_chunk_len": 4096,
    "fwdbwd_max_chunk_bytes_count": 64_000_000,
    "sample_max_concurrent_requests": 64,  # each waits on one long poll
    "use_pyqwest_transport": False,
}
"""What /client/config tells the SDK (its other settings keep their defaults)."""
PROTO = "application/x-protobuf"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "category": "user"}, status_code=status)


def _validated(model: Any, body: Any) -> Any:
    """`body` as the SDK's request model; a UserError naming the first wrong field."""
    from pydantic import ValidationError

    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise UserError(
            f"{where}: {first.get('msg', 'invalid')} ({len(e.errors())} error(s) in the request)"
        ) from None


def build_app(service: TinkerService, keys: list[str], models: list[dict[str, Any]]) -> FastAPI:
    """The routes over `service`, for clients holding one of `keys` (each a tenant: access.py)."""
    app = FastAPI(title="rlcore tinker", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def checked(request: Request, call_next: Any) -> Any:
        if request.url.path != "/api/v1/healthz":
            tenant = tenant_of(request.headers.get("x-api-key", ""), keys)
            if tenant is None:
                return _error(
                    401, "X-API-Key: missing or wrong (give a key `rlcore tinker serve` was started with)"
                )
            CALLER.set(tenant)
        try:
            return await call_next(request)
        except UserError as e:
            return _error(400, service.public(str(e)))
        except NotFound as e:
            return _error(404, service.public(str(e)))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 404:
            return _error(404, f"{request.method} {request.url.path}: not served by rlcore's Tinker server")
        if e.status_code == 405:
            return _error(405, f"{request.method} {request.url.path}: method not allowed")
        return _error(e.status_code, str(e.detail))

    _service_routes(app, service, models)
    _training_routes(app, service)
    _sampling_routes(app, service)
    _future_routes(app, service)
    _rest_routes(app, service)
    return app


async def body(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        raise UserError("body: is not JSON") from None


def future(request_id: str, model_id: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"request_id": request_id, "model_id": model_id, **extra}


def _service_routes(app: FastAPI, service: TinkerService, models: list[dict[str, Any]]) -> None:
    """Health, the client's configuration, sessions and telemetry."""
    from tinker import types

    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config() -> dict[str, Any]:
        return CLIENT_CONFIG

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        return {"supported_models": models}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        _validated(types.CreateSessionRequest, await body(request))
        return {"session_id": service.create_session(), "type": "create_session"}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict[str, Any]:
        service.heartbeat(_validated(types.SessionHeartbeatRequest, await body(request)).session_id)
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str) -> dict[str, Any]:
        service.finish_session(session_id)
        return {}

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict[str, Any]:
        return {"status": "accepted"}


def _training_routes(app: FastAPI, service: TinkerService) -> None:
    """Models, forward/backward, optimizer steps, checkpoints."""
    from tinker import types
    from tinker.proto import tinker_public_pb2 as pb

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        r = _validated(types.CreateModelRequest, await body(request))
        spec = service.spec_of(r.base_model, r.lora_config)
        model_id = f"{r.session_id}:train:{r.model_seq_id}"
        return future(service.create_model(model_id, spec), model_id)

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        return service.info(_validated(types.GetInfoRequest, await body(request)).model_id)

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        if request.headers.get("content-encoding"):
            raise UserError("content-encoding: compressed bodies are not served (client/config says so)")
        try:
            r = pb.ForwardBackwardRequest.FromString(await request.body())
        except Exception:
            raise UserError("body: is not a tinker_public.ForwardBackwardRequest") from None
        return future(await run_in_threadpool(service.forward_backward, r), r.model_id)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        r = _validated(types.OptimStepRequest, await body(request))
        return future(service.optim_step(r.model_id, r.seq_id, r.optim_params), r.model_id)

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        r = _validated(types.SaveWeightsRequest, await body(request))
        return future(service.save_weights(r.model_id, r.seq_id, r.path, bool(r.overwrite)), r.model_id)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        r = _validated(types.SaveWeightsForSamplerRequest, await body(request))
        session = r.model_id.split(":train:")[0]
        request_id = service.save_for_sampler(
            r.model_id, r.seq_id, r.path, r.sampling_session_seq_id, session
        )
        return future(request_id, r.model_id)

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        r = _validated(types.LoadWeightsRequest, await body(request))
        if r.session_id is not None and r.model_seq_id is not None:
            model_id = f"{r.session_id}:train:{r.model_seq_id}"
            return future(service.load_weights(model_id, None, r.path, r.optimizer, create=True), model_id)
        if r.model_id is None:
            raise UserError(
                "model_id: required (or session_id with model_seq_id to create a model from the checkpoint)"
            )
        return future(
            service.load_weights(r.model_id, r.seq_id, r.path, r.optimizer, create=False), r.model_id
        )


def _sampling_routes(app: FastAPI, service: TinkerService) -> None:
    """Sampling sessions and samples."""
    from tinker import types

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        r = _validated(types.CreateSamplingSessionRequest, await body(request))
        sampler = service.create_sampler(r.session_id, r.sampling_session_seq_id, r.model_path, r.base_model)
        return {"sampling_session_id": sampler, "type": "create_sampling_session"}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str) -> dict[str, Any]:
        base_model, folder = service.sampler(sampler_id)
        return {"sampler_id": sampler_id, "base_model": base_model, "model_path": service.records.path_of(folder)}

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        r = _validated(types.SampleRequest, await body(request))
        request_id = await run_in_threadpool(service.sample, r)
        return future(
            request_id, None, sample_sequence_ids=[f"{request_id}-{i}" for i in range(r.num_samples)]
        )


def _future_routes(app: FastAPI, service: TinkerService) -> None:
    """Results, long-polled."""
    from tinker import types

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        r = _validated(types.FutureRetrieveRequest, await body(request))
        fut = service.future(r.request_id)
        try:
            result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), POLL_S)
        except asyncio.TimeoutError:
            return JSONResponse({"type": "try_again", "request_id": r.request_id, "queue_state": "active"})
        if result.error is not None:
            log.info("request %s failed: %s", r.request_id, result.error)
            return JSONResponse({"error": result.error, "category": result.category})
        if result.proto is not None:
            return Response(result.proto, media_type=PROTO)
        return JSONResponse(result.json)


def _rest_routes(app: FastAPI, service: TinkerService) -> None:
    """The RestClient's listings of training runs and checkpoints (records.py), weights info and
    checkpoint deletion. Every client of a server sees every run (one key per server)."""

    records = service.records  # listings walk folders for their sizes: on the thread pool

    @app.get("/api/v1/training_runs")
    async def training_runs(limit: int = 20, offset: int = 0) -> dict[str, Any]:
        return await run_in_threadpool(records.training_runs, limit, offset, CALLER.get())

    @app.get("/api/v1/training_runs/{model_id}")
    async def training_run(model_id: str) -> dict[str, Any]:
        return await run_in_threadpool(records.training_run, model_id, CALLER.get())

    @app.get("/api/v1/training_runs/{model_id}/checkpoints")
    async def checkpoints_of(model_id: str) -> dict[str, Any]:
        return await run_in_threadpool(records.checkpoints_of, model_id, CALLER.get())

    @app.delete("/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}")
    async def delete_checkpoint(model_id: str, checkpoint_id: str) -> Response:
        if checkpoint_id.count("/") > 1:  # the SDK's unpublish: DELETE .../checkpoints/<kind>/<name>/publish
            raise UserError(f"{checkpoint_id.split('/', 2)[2]}: not served (checkpoints are neither published nor "
                            "given TTLs here)")  # fmt: skip
        await run_in_threadpool(service.delete_checkpoint, model_id, checkpoint_id)
        return Response(status_code=204)

    @app.get("/api/v1/checkpoints")
    async def all_checkpoints(limit: int = 100, offset: int = 0) -> dict[str, Any]:
        return await run_in_threadpool(records.all_checkpoints, limit, offset, CALLER.get())

    @app.post("/api/v1/weights_info")
    async def weights_info(request: Request) -> dict[str, Any]:
        given = await body(request)
        path = given.get("tinker_path") if isinstance(given, dict) else None
        if not isinstance(path, str):
            raise UserError("tinker_path: required (a tinker:// checkpoint path)")
        return service.records.weights_info(service.checkpoint(path).tinker_path)

"""One way to build an rlcore gRPC server: token auth, optional TLS, explicit message limits,
standard health checking and reflection, and ServiceError -> status mapping."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from .address import bracket, reachable_host
from .errors import ServiceError
from .security import TLSFiles, TokenAuthInterceptor, server_credentials

log = logging.getLogger("rlcore.rpc")

MiB = 1 << 20


@dataclass
class Service:
    """A servicer and how to mount it: `add(servicer, server)` is the generated add_*_to_server."""

    name: str
    """Full service name, e.g. rlcore.v1.RolloutService (announced by health and reflection)."""
    servicer: Any
    add: Callable[[Any, grpc.Server], None]


@dataclass
class ServerOptions:
    token: str
    """Shared token every call but health must carry."""
    host: str = "127.0.0.1"
    port: int = 0
    """0: any free port (read it back from RpcServer.port)."""
    max_message_bytes: int = 64 * MiB
    tls: TLSFiles | None = None
    max_workers: int = 16
    """Threads serving calls concurrently."""

    @classmethod
    def from_control(cls, control: Any, token: str, port: int = 0) -> ServerOptions:
        """From a ControlConfig (rlcore.core.config.schema)."""
        return cls(
            token=token,
            host=control.host,
            port=port,
            max_message_bytes=control.max_message_mb * MiB,
            tls=TLSFiles.from_config(control.tls),
        )


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


class ErrorMappingInterceptor(grpc.ServerInterceptor):
    """ServiceError -> its status; any other exception -> INTERNAL with the exception's text (and
    the traceback in the server log). The server keeps serving either way."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=_guard_unary(handler.unary_unary, method))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=_guard_stream(handler.unary_stream, method))
        return handler


def _abort(context: grpc.ServicerContext, e: Exception, method: str) -> None:
    if isinstance(e, ServiceError):
        context.abort(e.code, str(e))
    log.exception("%s failed", method)
    context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")


def _guard_unary(behavior: Callable, method: str) -> Callable:
    def guarded(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return behavior(request, context)
        except Exception as e:
            _abort(context, e, method)

    return guarded


def _guard_stream(behavior: Callable, method: str) -> Callable:
    def guarded(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from behavior(request, context)
        except Exception as e:
            _abort(context, e, method)

    return guarded


class RpcServer:
    """A started gRPC server with health (every service SERVING) and reflection."""

    def __init__(self, options: ServerOptions, services: list[Service]):
        self.options = options
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=options.max_workers),
            interceptors=[TokenAuthInterceptor(options.token), ErrorMappingInterceptor()],
            options=channel_options(options.max_message_bytes),
        )
        for s in services:
            s.add(s.servicer, self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [s.name for s in services]
        reflection.enable_server_reflection(
            [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            self.server,
        )
        bind = f"{bracket(options.host)}:{options.port}"
        try:
            if options.tls is not None:
                self.port = self.server.add_secure_port(bind, server_credentials(options.tls))
            else:
                self.port = self.server.add_insecure_port(bind)
        except RuntimeError as e:  # grpcio raises on a failed bind (older versions returned 0)
            raise OSError(f"cannot listen on {bind}: port taken or host not local ({e})") from None
        if self.port == 0:
            raise OSError(f"cannot listen on {bind}: port taken or host not local")
        self.server.start()
        for name in ["", *names]:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    @property
    def address(self) -> str:
        """host:port clients dial (the machine's name when bound to every interface)."""
        return f"{bracket(reachable_host(self.options.host))}:{self.port}"

    def stop(self, grace: float = 2.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()

    def wait(self) -> None:
        self.server.wait_for_termination()

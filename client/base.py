"""What every rlcore client shares: channels (token, TLS, message limits), a deadline on every call,
retry with exponential backoff on UNAVAILABLE, and one exception type carrying status and message."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..core.rpc.security import TLSFiles, bearer, channel_credentials, read_token
from ..core.rpc.server import MiB, channel_options

MAX_BACKOFF_S = 5.0


class RpcError(Exception):
    """A call failed: `code` is the grpc.StatusCode, `details` the server's (or gRPC's) message."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str, peer: str = ""):
        """`peer`: who was called, e.g. 'rollout worker 10.0.0.5:50051' (the message starts with it)."""
        super().__init__(f"{peer + ': ' if peer else ''}{method}: {code.name}: {details}")
        self.method, self.code, self.details, self.peer = method, code, details, peer


@dataclass
class ClientOptions:
    token: str | None = None
    """The run's shared token (sent as `authorization: Bearer <token>`)."""
    timeout: float = 600.0
    """Default deadline of a call in seconds, retries included."""
    retry_attempts: int = 5
    """Attempts of a call failing with UNAVAILABLE."""
    retry_backoff: float = 0.2
    """First wait between attempts; doubles each time, at most 5 s."""
    max_message_bytes: int = 64 * MiB
    tls: TLSFiles | None = None

    @classmethod
    def from_control(cls, control: Any, timeout: float | None = None) -> ClientOptions:
        """From a ControlConfig: the token comes from the environment variable control.token_env."""
        return cls(
            token=read_token(control.token_env),
            timeout=timeout or control.rpc_timeout,
            retry_attempts=control.retry_attempts,
            retry_backoff=control.retry_backoff,
            max_message_bytes=control.max_message_mb * MiB,
            tls=TLSFiles.from_config(control.tls),
        )


def _channel_args(address: str, options: ClientOptions) -> tuple[str, list[tuple[str, Any]]]:
    args: list[tuple[str, Any]] = list(channel_options(options.max_message_bytes))
    if options.tls is not None and options.tls.server_name:
        args.append(("grpc.ssl_target_name_override", options.tls.server_name))
    return address, args


def make_channel(address: str, options: ClientOptions) -> grpc.Channel:
    target, args = _channel_args(address, options)
    if options.tls is not None:
        return grpc.secure_channel(target, channel_credentials(options.tls), options=args)
    return grpc.insecure_channel(target, options=args)


def make_aio_channel(address: str, options: ClientOptions) -> grpc.aio.Channel:
    target, args = _channel_args(address, options)
    if options.tls is not None:
        return grpc.aio.secure_channel(target, channel_credentials(options.tls), options=args)
    return grpc.aio.insecure_channel(target, options=args)


def _backoff(options: ClientOptions, attempt: int) -> float:
    return min(options.retry_backoff * 2**attempt, MAX_BACKOFF_S) * random.uniform(0.8, 1.2)


class BlockingClient:
    """Base of the blocking clients: `stub_class` is the generated stub of the service."""

    stub_class: Any = None
    role = "server"
    """What the service is to the run (it names the peer in errors: `<role> <address>`)."""

    def __init__(self, address: str, options: ClientOptions | None = None):
        self.address = address
        self.peer = f"{self.role} {address}"
        self.options = options or ClientOptions()
        self.channel = make_channel(address, self.options)
        self.stub = self.stub_class(self.channel)
        self._metadata = bearer(self.options.token) if self.options.token else ()

    def close(self) -> None:
        self.channel.close()

    def answers(self, timeout: float) -> bool:
        """Whether the server answers at all within `timeout` seconds (gRPC health; a busy server
        answers it too): what tells a server that is gone, or hung, from one that is slow."""
        try:
            health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as e:
            return e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, method: str, request: Any, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout or self.options.timeout)
        call = getattr(self.stub, method)
        for attempt in range(self.options.retry_attempts):
            try:
                return call(request, timeout=max(deadline - time.monotonic(), 0.001), metadata=self._metadata)
            except grpc.RpcError as e:
                wait = _backoff(self.options, attempt)
                last = attempt == self.options.retry_attempts - 1
                if e.code() != grpc.StatusCode.UNAVAILABLE or last or time.monotonic() + wait >= deadline:
                    raise RpcError(method, e.code(), e.details() or "", self.peer) from None
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _stream(self, method: str, request: Any, timeout: float | None = None) -> Iterator[Any]:
        """Server-streaming call; retried on UNAVAILABLE only before the first message arrived."""
        deadline = time.monotonic() + (timeout or self.options.timeout)
        call = getattr(self.stub, method)
        for attempt in range(self.options.retry_attempts):
            received = False
            try:
                for item in call(
                    request, timeout=max(deadline - time.monotonic(), 0.001), metadata=self._metadata
                ):
                    received = True
                    yield item
                return
            except grpc.RpcError as e:
                wait = _backoff(self.options, attempt)
                last = attempt == self.options.retry_attempts - 1
                if (
                    received
                    or e.code() != grpc.StatusCode.UNAVAILABLE
                    or last
                    or time.monotonic() + wait >= deadline
                ):
                    raise RpcError(method, e.code(), e.details() or "", self.peer) from None
                time.sleep(wait)


class AsyncClient:
    """Base of the asyncio clients (grpc.aio); same deadlines, retries and errors as BlockingClient."""

    stub_class: Any = None
    role = "server"
    """What the service is to the run (it names the peer in errors: `<role> <address>`)."""

    def __init__(self, address: str, options: ClientOptions | None = None):
        self.address = address
        self.peer = f"{self.role} {address}"
        self.options = options or ClientOptions()
        self.channel = make_aio_channel(address, self.options)
        self.stub = self.stub_class(self.channel)
        self._metadata = bearer(self.options.token) if self.options.token else ()

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, method: str, request: Any, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout or self.options.timeout)
        call = getattr(self.stub, method)
        for attempt in range(self.options.retry_attempts):
            try:
                return await call(
                    request, timeout=max(deadline - time.monotonic(), 0.001), metadata=self._metadata
                )
            except grpc.RpcError as e:
                code = e.code()
                wait = _backoff(self.options, attempt)
                last = attempt == self.options.retry_attempts - 1
                if code != grpc.StatusCode.UNAVAILABLE or last or time.monotonic() + wait >= deadline:
                    raise RpcError(method, code, e.details() or "", self.peer) from None
                await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def _stream(self, method: str, request: Any, timeout: float | None = None) -> AsyncIterator[Any]:
        deadline = time.monotonic() + (timeout or self.options.timeout)
        call = getattr(self.stub, method)
        for attempt in range(self.options.retry_attempts):
            received = False
            try:
                async for item in call(
                    request, timeout=max(deadline - time.monotonic(), 0.001), metadata=self._metadata
                ):
                    received = True
                    yield item
                return
            except grpc.RpcError as e:
                code = e.code()
                wait = _backoff(self.options, attempt)
                last = attempt == self.options.retry_attempts - 1
                if (
                    received
                    or code != grpc.StatusCode.UNAVAILABLE
                    or last
                    or time.monotonic() + wait >= deadline
                ):
                    raise RpcError(method, code, e.details() or "", self.peer) from None
                await asyncio.sleep(wait)

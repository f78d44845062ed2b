"""Who may call: the shared run token (call metadata) and TLS credentials, for servers and clients."""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from typing import Any

import grpc

METADATA_KEY = "authorization"
# Health checks answer without a token so load balancers and probes can use them.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)


def read_token(token_env: str, *, required: bool = True) -> str | None:
    """The shared token from the environment variable `token_env`."""
    token = os.environ.get(token_env)
    if required and not token:
        raise ValueError(
            f"the control-plane token is not set: export {token_env}=<secret> (the same value for every "
            f"process of the run), or name another variable with control.token_env"
        )
    return token or None


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return ((METADATA_KEY, f"Bearer {token}"),)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Refuse every call (but health) whose metadata lacks `authorization: Bearer <token>`."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        given = dict(handler_call_details.invocation_metadata or ()).get(METADATA_KEY, "")
        if hmac.compare_digest(str(given).encode(), self._expected):
            return handler
        reason = "missing" if not given else "wrong"
        return _deny(
            handler, f"{reason} token: send metadata 'authorization: Bearer <token>' (the run's token)"
        )


def _deny(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that answers UNAUTHENTICATED without running it."""

    def abort(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    def abort_stream(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover  (makes this a generator, as stream handlers must be)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort_stream, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort_stream, **kwargs)
    return grpc.unary_unary_rpc_method_handler(abort, **kwargs)


@dataclass
class TLSFiles:
    """PEM files; see rlcore.core.config.schema.TLSConfig for what each one does."""

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    require_client_cert: bool = False
    server_name: str | None = None

    @classmethod
    def from_config(cls, tls: Any) -> TLSFiles | None:
        if not tls.enabled:
            return None
        return cls(tls.cert_file, tls.key_file, tls.ca_file, tls.require_client_cert, tls.server_name)


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def server_credentials(tls: TLSFiles) -> grpc.ServerCredentials:
    if not (tls.cert_file and tls.key_file):
        raise ValueError("control.tls: a server needs cert_file and key_file")
    key, cert = _read(tls.key_file), _read(tls.cert_file)
    assert key is not None and cert is not None
    return grpc.ssl_server_credentials(
        [(key, cert)],
        root_certificates=_read(tls.ca_file) if tls.require_client_cert else None,
        require_client_auth=tls.require_client_cert,
    )


def channel_credentials(tls: TLSFiles) -> grpc.ChannelCredentials:
    """Verify the server against ca_file (system roots when unset); present cert/key for mutual TLS."""
    mutual = tls.require_client_cert and tls.cert_file and tls.key_file
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file),
        private_key=_read(tls.key_file) if mutual else None,
        certificate_chain=_read(tls.cert_file) if mutual else None,
    )

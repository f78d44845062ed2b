"""Errors a servicer raises to answer with a gRPC status; the server maps them (see server.py).

Servicers never call `context.abort` themselves: they raise one of these, so a bad request and a
bug are told apart in one place.
"""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    """Answer the call with `code` and the message."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(ServiceError):
    """The request is malformed; the message starts with the offending field path."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


class FailedPrecondition(ServiceError):
    """The request is well formed but the server is not in a state to run it (e.g. not configured)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class Unavailable(ServiceError):
    """The server cannot run it now (paused, shutting down); a retry later may succeed."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class DataLoss(ServiceError):
    """Data arrived damaged (e.g. a weight bucket failed its checksum)."""

    code = grpc.StatusCode.DATA_LOSS


def require(condition: bool, field: str, problem: str) -> None:
    """Raise InvalidArgument(field, problem) unless `condition` holds."""
    if not condition:
        raise InvalidArgument(field, problem)

"""ExperienceBufferService: the queue storage's groups (memory.py), one queue per buffer name, served
over gRPC by a launch's controller to the explorers and the trainer of any host."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import grpc

from ..client.buffer import groups_from_proto, groups_to_proto
from ..core.rpc.errors import DeadlineExceeded, FailedPrecondition, require
from ..core.rpc.server import Service
from ..proto.v1 import buffer_pb2, buffer_pb2_grpc
from . import memory_buffer
from .base import BufferError, BufferTimeout
from .memory import MemoryBuffer

SERVICE_NAME = "rlcore.v1.ExperienceBufferService"
MAX_WAIT_S = 3600.0


class BufferServicer(buffer_pb2_grpc.ExperienceBufferServiceServicer):
    def __init__(self, where: str = "the controller", configs: dict[str, Any] | None = None):
        """`configs`: experience buffer configs by name, for queues with more than the defaults
        (a replay buffer)."""
        self.where = where
        self.configs = dict(configs or {})
        self._queues: dict[str, MemoryBuffer] = {}
        self._lock = threading.Lock()

    def queue(self, name: str) -> MemoryBuffer:
        """The queue named `name` (created on first use); also how an in-process user reaches it."""
        with self._lock:
            if name not in self._queues:
                eb = self.configs.get(name)
                self._queues[name] = memory_buffer(eb, self.where) if eb else MemoryBuffer(name, where=self.where)
            return self._queues[name]

    def Put(self, request: buffer_pb2.PutExperiencesRequest, context: grpc.ServicerContext) -> Any:
        require(bool(request.buffer), "buffer", "must name the buffer")
        require(bool(request.writer), "writer", "must name the writer")
        groups = groups_from_proto(list(request.groups))
        require(all(groups), "groups", "every group needs at least one experience")
        available = self.queue(request.buffer).put_from(request.writer, groups)
        return buffer_pb2.PutExperiencesResponse(available=available)

    def Take(self, request: buffer_pb2.TakeExperiencesRequest, context: grpc.ServicerContext) -> Any:
        require(bool(request.buffer), "buffer", "must name the buffer")
        require(request.step >= 0, "step", f"must be >= 0; got {request.step}")
        require(request.num_groups > 0, "num_groups", f"must be > 0; got {request.num_groups}")
        require(
            0 <= request.timeout_s <= MAX_WAIT_S,
            "timeout_s",
            f"must be 0 to {MAX_WAIT_S:g}; got {request.timeout_s}",
        )
        try:
            taken = self.queue(request.buffer).take(request.step, request.num_groups, request.timeout_s)
        except BufferTimeout as e:
            raise DeadlineExceeded(str(e)) from None
        except BufferError as e:
            raise FailedPrecondition(str(e)) from None
        return buffer_pb2.TakeExperiencesResponse(
            groups=groups_to_proto(taken.groups), exhausted=taken.exhausted
        )

    def FinishWriter(self, request: buffer_pb2.FinishWriterRequest, context: grpc.ServicerContext) -> Any:
        require(bool(request.buffer), "buffer", "must name the buffer")
        require(bool(request.writer), "writer", "must name the writer")
        self.queue(request.buffer).finish_writer(request.writer)
        return buffer_pb2.FinishWriterResponse()

    def GetBufferStats(self, request: buffer_pb2.GetBufferStatsRequest, context: grpc.ServicerContext) -> Any:
        require(bool(request.buffer), "buffer", "must name the buffer")
        return buffer_pb2.BufferStats(**dataclasses.asdict(self.queue(request.buffer).stats()))


def buffer_service(servicer: BufferServicer) -> Service:
    return Service(SERVICE_NAME, servicer, buffer_pb2_grpc.add_ExperienceBufferServiceServicer_to_server)

"""The queue storage seen from an explorer or a trainer: the groups live in memory in the
controller that serves ExperienceBufferService (service.py) at `path` (host:port), reached over
gRPC from any host with the run's token."""

from __future__ import annotations

from typing import Any

from ..client.base import ClientOptions, RpcError
from ..client.buffer import BufferClient
from .base import BufferError, BufferStats, BufferTimeout, ExperienceBuffer, Group, Taken


class QueueBuffer(ExperienceBuffer):
    storage_type = "queue"

    def __init__(self, name: str, address: str, options: ClientOptions, writer: str | None = None):
        super().__init__(name, address, writer)
        self.client = BufferClient(address, options)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RpcError as e:
            if e.code.name == "DEADLINE_EXCEEDED" and what == "take":
                raise BufferTimeout(e.details) from None
            raise BufferError(f"{self.describe()}: {what} failed: {e}") from None

    def _put(self, groups: list[Group]) -> None:
        self._call("put", self.client.put, self.name, self.writer, groups)

    def finish(self) -> None:
        self._call("finish", self.client.finish_writer, self.name, self.writer)

    def take(self, step: int, num_groups: int, timeout_s: float) -> Taken:
        groups, exhausted = self._call("take", self.client.take, self.name, step, num_groups, timeout_s)
        return Taken(groups, exhausted)

    def stats(self) -> BufferStats:
        msg = self._call("stats", self.client.stats, self.name)
        return BufferStats(**{f: getattr(msg, f) for f in BufferStats.__dataclass_fields__})

    def close(self) -> None:
        self.client.close()

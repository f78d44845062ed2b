"""Client of an experience buffer's queue (ExperienceBufferService, served by a launch's controller):
put experience groups from anywhere, take them for training, count them."""

from __future__ import annotations

from ..core.rpc.convert import experience_from_proto, experience_to_proto
from ..core.types import Experience
from ..proto.v1 import buffer_pb2, buffer_pb2_grpc
from .base import BlockingClient


def groups_to_proto(groups: list[list[Experience]]) -> list[buffer_pb2.ExperienceGroup]:
    return [buffer_pb2.ExperienceGroup(experiences=[experience_to_proto(e) for e in g]) for g in groups]


def groups_from_proto(
    groups: list[buffer_pb2.ExperienceGroup], field: str = "groups"
) -> list[list[Experience]]:
    return [
        [experience_from_proto(e, f"{field}[{i}].experiences[{j}]") for j, e in enumerate(g.experiences)]
        for i, g in enumerate(groups)
    ]


class BufferClient(BlockingClient):
    stub_class = buffer_pb2_grpc.ExperienceBufferServiceStub
    role = "experience buffer"

    def put(
        self, buffer: str, writer: str, groups: list[list[Experience]], timeout: float | None = None
    ) -> int:
        """Append `groups`; how many groups are unread now."""
        request = buffer_pb2.PutExperiencesRequest(
            buffer=buffer, writer=writer, groups=groups_to_proto(groups)
        )
        return int(self._unary("Put", request, timeout).available)

    def take(
        self, buffer: str, step: int, num_groups: int, wait_s: float, timeout: float | None = None
    ) -> tuple[list[list[Experience]], bool]:
        """The groups of step `step` (waiting up to `wait_s` for them) and whether the buffer is exhausted."""
        request = buffer_pb2.TakeExperiencesRequest(
            buffer=buffer, step=step, num_groups=num_groups, timeout_s=wait_s
        )
        answer = self._unary("Take", request, timeout or wait_s + self.options.timeout)
        return groups_from_proto(list(answer.groups)), bool(answer.exhausted)

    def finish_writer(self, buffer: str, writer: str, timeout: float | None = None) -> None:
        self._unary("FinishWriter", buffer_pb2.FinishWriterRequest(buffer=buffer, writer=writer), timeout)

    def stats(self, buffer: str, timeout: float | None = None) -> buffer_pb2.BufferStats:
        return self._unary("GetBufferStats", buffer_pb2.GetBufferStatsRequest(buffer=buffer), timeout)

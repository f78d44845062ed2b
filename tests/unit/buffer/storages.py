"""Opening each storage for the buffer tests: memory, file, sql (SQLite) and queue (a real gRPC
server on loopback serving the memory store)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rlcore.buffer.base import ExperienceBuffer
from rlcore.core.types import Experience

STORAGES = ("memory", "file", "sql", "queue")
TOKEN = "buffer-test-token"


def group(task: str, n: int = 3, version: int = 0) -> list[Experience]:
    """A task's group: n experiences with distinct rewards, token ids, log-probs and a loss mask."""
    return [
        Experience(
            prompt_token_ids=[1, 2, 3],
            response_token_ids=[4, 5 + i, 6],
            logprobs=[-0.5, -0.25 * i, -1.0],
            reward=float(i),
            group_id=task,
            policy_version=version,
            finish_reason="length" if i else "stop",
            response_text=f"r{i}",
            reward_components={"exact_match": float(i)},
            loss_mask=[1, 0, 1],
            metrics={"turns": 2.0},
        )  # fmt: skip
        for i in range(n)
    ]


@contextmanager
def served_queue() -> Iterator[str]:
    """A real ExperienceBufferService on loopback (no token); its address."""
    from rlcore.buffer.service import BufferServicer, buffer_service
    from rlcore.core.rpc.server import RpcServer, ServerOptions

    server = RpcServer(
        ServerOptions(token=TOKEN, host="127.0.0.1", port=0), [buffer_service(BufferServicer())]
    )
    try:
        yield server.address
    finally:
        server.stop(grace=0.5)


def open_storage(kind: str, where: str, writer: str | None = None) -> ExperienceBuffer:
    """`where`: a folder (file), an SQLAlchemy URL (sql), an address (queue)."""
    if kind == "file":
        from rlcore.buffer.file import FileBuffer

        return FileBuffer("exps", where, writer)
    if kind == "sql":
        from rlcore.buffer.sql import SqlBuffer

        return SqlBuffer("exps", where, writer)
    if kind == "queue":
        from rlcore.buffer.queue import QueueBuffer
        from rlcore.client.base import ClientOptions

        return QueueBuffer("exps", where, ClientOptions(token=TOKEN, timeout=30.0), writer)
    raise ValueError(kind)

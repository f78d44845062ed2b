"""Auxiliary models (rollout/auxiliary.py) against a real OpenAI-compatible HTTP server on loopback,
called through the official `openai` client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlcore.rollout import auxiliary
from rlcore.rollout.auxiliary import AuxiliaryModel


class _Echo(BaseHTTPRequestHandler):
    """/v1/chat/completions: the reply is the last message's text, after a short wait (so that
    concurrent requests overlap)."""

    def do_POST(self) -> None:  # noqa: N802 (the handler's API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(0.05)
        reply = {
            "id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": body["messages"][-1]["content"]}}],
        }  # fmt: skip
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_chat_many_answers_in_order_over_one_client(echo_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []
    real = auxiliary.openai_client

    def counting(spec, who):  # type: ignore[no-untyped-def]
        made.append(spec)
        return real(spec, who)

    monkeypatch.setattr(auxiliary, "openai_client", counting)
    model = AuxiliaryModel({"name": "judge", "model_name": "m", "base_url": echo_url, "max_concurrency": 8})
    conversations = [[{"role": "user", "content": f"n{i}"}] for i in range(8)]
    assert model.chat_many(conversations, max_tokens=4) == [f"n{i}" for i in range(8)]
    assert len(made) == 1  # the 8 threads share the client made first

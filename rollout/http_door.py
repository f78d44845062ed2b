"""An HTTP door (an ASGI app: the OpenAI-compatible door, openai_door.py, or the Tinker API)
served by uvicorn in a thread of this process."""

from __future__ import annotations

import threading
import time
from typing import Any


class HttpDoor:
    """The OpenAI-compatible door (openai_door.py) served by uvicorn in a thread of this process."""

    def __init__(self, app: Any, host: str, port: int, model_name: str):
        import uvicorn

        self.model_name = model_name
        self.server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        )
        self.thread = threading.Thread(target=self.server.run, name="http-door", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"the HTTP door could not listen on {host}:{port}")
            time.sleep(0.05)
        bound = self.server.servers[0].sockets[0].getsockname()
        self.address = f"{host}:{bound[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

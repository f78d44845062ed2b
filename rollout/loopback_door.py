"""The OpenAI-compatible door a workflow's programs call the model through (the verifiers
workflow's environments): served on 127.0.0.1 over the workflow's engine by the process that runs
the workflow (a rollout worker, or the explorer in the trainer's process), handed to the workflow in
its WorkflowContext."""

from __future__ import annotations

import os
import secrets
import uuid
from typing import Any

from .workflows.base import WorkflowContext


def workflow_context() -> WorkflowContext:
    """What a process that runs workflows hands them: a loopback door over their engine."""
    return WorkflowContext(open_door=LoopbackDoor)


class LoopbackDoor:
    """An OpenAI-compatible door over `engine` on 127.0.0.1, for the programs of an environment:
    its own token (in an environment variable of this process, which verifiers' client reads), its
    episode recorder."""

    def __init__(self, engine: Any):
        from .http_door import HttpDoor
        from .openai_app import build_app  # FastAPI: imported only when a workflow opens one
        from .openai_door import OpenAIDoor
        from .server import RolloutServicer

        servicer = RolloutServicer(engine, engine_name="workflow", model_path="")
        self.model_name = "policy"
        self.key_env = f"RLCORE_VERIFIERS_DOOR_KEY_{uuid.uuid4().hex[:8].upper()}"
        os.environ[self.key_env] = secrets.token_hex(16)
        self.recorder = servicer.episodes
        door = OpenAIDoor(servicer, self.recorder, os.environ[self.key_env], self.model_name)
        # a workflow's programs generate, with the worker's adapters too, but load or unload none
        self.http = HttpDoor(build_app(door, manages_adapters=False), "127.0.0.1", 0, self.model_name)
        self.base_url = f"http://{self.http.address}/v1"

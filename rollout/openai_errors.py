"""The OpenAI-compatible door's errors: an HTTP status and OpenAI's JSON error shape
({"error": {"message", "type", "param", "code"}}), the parameter named where one is at fault."""

from __future__ import annotations

from typing import Any

from .openai_checks import shown


class DoorError(Exception):
    """An HTTP error in OpenAI's JSON shape."""

    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"
    ):
        super().__init__(_encodable(message))
        self.status, self.param, self.kind = status, param and _encodable(param), kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}}


def invalid(param: str, problem: str) -> DoorError:
    return DoorError(400, f"{param}: {problem}", param)


def _encodable(text: str) -> str:
    """`text` as UTF-8 can carry it (what cannot be, a lone surrogate, escaped): an error that
    echoes a request's value must never fail to be sent."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def not_served(model: str, served: list[str]) -> DoorError:
    names = ", ".join(f"'{name}'" for name in served)
    return DoorError(404, f"model {shown(model)} is not served here; this worker serves {names}", "model",
                     "not_found_error")  # fmt: skip

"""The request bodies of the OpenAI-compatible door as pydantic models: every parameter is either
served (typed and bounded here: a wrong type or an out-of-range number is a 400 naming it, never a
500), or one OpenAI defines that this door does not serve, refused unless it is given at its neutral
value, or unknown to the endpoint. Nothing is accepted and silently ignored.

`check(kind, body)` raises BodyError(param, message); the door turns it into OpenAI's error shape.
The door checks what depends on the worker itself (the model length, the vocabulary, the chat
template, caps on n and tokens).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

INT32 = 2**31 - 1
INT64 = 2**63 - 1


class BodyError(Exception):
    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool | None = None


class _Body(BaseModel):
    """What both endpoints serve: the sampling parameters both engines honour."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    model: str | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=INT32)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    n: int | None = Field(None, ge=1, le=INT32)
    seed: int | None = Field(None, ge=-INT64 - 1, le=INT64)
    max_tokens: int | None = Field(None, ge=1, le=INT32)
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None  # token ids and bias ranges: the worker checks them
    min_tokens: int | None = Field(None, ge=0, le=INT32)  # vLLM's
    ignore_eos: bool | None = None  # vLLM's
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT32)]] | None = None  # vLLM's
    user: str | None = None
    episode_id: str | None = Field(None, min_length=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=1)


class ChatBody(_Body):
    messages: list[Any] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=INT32)  # the door says which it serves


UNSERVED: dict[str, dict[str, Any]] = {
    "completions": {
        "best_of": 1, "echo": False, "suffix": None,
    },
    "chat": {
        "response_format": {"type": "text"}, "parallel_tool_calls": True,
        "functions": None, "function_call": None, "audio": None, "modalities": ["text"],
        "prediction": None, "reasoning_effort": None, "service_tier": None, "store": False,
        "metadata": None, "web_search_options": None,
    },
}  # fmt: skip
"""Parameters OpenAI defines that the door does not serve, with the value that asks for nothing
(accepted: an SDK may send it); any other value is refused."""
UNIONS = {
    "stop": "a string or a list of strings",
    "prompt": "a string, a list of token ids, or a list of one of those",
}
"""How to say what a parameter of several shapes takes (pydantic reports each shape's error)."""


def check(kind: str, body: Any) -> CompletionBody | ChatBody:
    """The body of a /v1/completions (kind "completions") or /v1/chat/completions ("chat")
    request, checked; BodyError names the first parameter that is wrong."""
    if not isinstance(body, dict):
        raise BodyError("body", f"must be a JSON object; got {type(body).__name__}")
    model = CompletionBody if kind == "completions" else ChatBody
    for key, value in body.items():
        if key in model.model_fields:
            continue
        if key in UNSERVED[kind]:
            if value is None or value == UNSERVED[kind][key]:
                continue
            raise BodyError(key, f"is not served by this worker (only {UNSERVED[kind][key]!r} is)")
        endpoint = "/v1/completions" if kind == "completions" else "/v1/chat/completions"
        raise BodyError(key, f"is not a parameter of {endpoint}")
    try:
        checked = model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(_loc(first["loc"])) or "body"
        if param in UNIONS and param in body:
            raise BodyError(param, f"must be {UNIONS[param]}; got {_shown(body[param])}") from None
        raise BodyError(param, _message(dict(first))) from None
    if checked.stream_options is not None and not checked.stream:
        raise BodyError("stream_options", "is taken only with stream: true")
    return checked


def _loc(loc: tuple[Any, ...]) -> list[str]:
    """The parameter path, without pydantic's union branch names (`function-after[...]`, `str`)."""
    out: list[str] = []
    for part in loc:
        if isinstance(part, int):
            out[-1:] = [f"{out[-1]}[{part}]"] if out else [f"[{part}]"]
        elif not any(c in part for c in "[]-") and part not in ("str", "int", "list[int]", "list[str]"):
            out.append(part)
    return out


def _message(error: dict[str, Any]) -> str:
    """pydantic's error in the door's words: what is allowed, and what was given."""
    kind, ctx, shown = error["type"], error.get("ctx", {}), _shown(error.get("input"))
    bounds = {
        "greater_than_equal": f"must be >= {ctx.get('ge')}",
        "greater_than": f"must be > {ctx.get('gt')}",
        "less_than_equal": f"must be <= {ctx.get('le')}",
        "less_than": f"must be < {ctx.get('lt')}",
    }
    if kind in bounds:
        return f"{bounds[kind]}; got {shown}"
    if kind in ("float_type", "float_parsing", "finite_number"):
        return f"must be a finite number; got {shown}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer; got {shown}"
    types = {
        "string_type": "a string",
        "bool_type": "true or false",
        "list_type": "a list",
        "dict_type": "an object",
    }
    if kind in types:
        return f"must be {types[kind]}; got {shown}"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return f"is not an option of this parameter; got {shown}"
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}; got {shown}"
    if kind in ("too_short", "string_too_short"):
        return f"must not be empty; got {shown}"
    return f"{error['msg']}; got {shown}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

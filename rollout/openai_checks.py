"""A request body checked against the door's schema (openai_schema.py): `check(kind, body,
max_chars)` returns the checked model or raises BodyError(param, message) naming the first
parameter that is wrong (a type, a range, a parameter the endpoint does not know, or one OpenAI
defines that the door does not serve, given at a value that asks for something); the door turns it
into OpenAI's error shape. `shown` is how a value appears in an error."""

from __future__ import annotations

import reprlib
from typing import Annotated, Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from .openai_schema import (
    BodyError,
    ChatBody,
    CompletionBody,
    DetokenizeBody,
    Id,
    ResponsesBody,
    TokenizeBody,
)

MODELS: dict[str, type[BaseModel]] = {
    "completions": CompletionBody, "chat": ChatBody, "tokenize": TokenizeBody, "detokenize": DetokenizeBody,
    "responses": ResponsesBody,
}  # fmt: skip
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "tokenize": "/tokenize",
             "detokenize": "/detokenize", "responses": "/v1/responses"}  # fmt: skip

UNSERVED: dict[str, dict[str, Any]] = {
    "completions": {
        "best_of": 1, "suffix": None,
    },
    "responses": {
        "parallel_tool_calls": True, "truncation": "disabled", "background": False,
        "reasoning": None, "include": [], "service_tier": "auto",
    },
    "chat": {
        "parallel_tool_calls": True,
        "functions": None, "function_call": None, "audio": None, "modalities": ["text"],
        "prediction": None, "reasoning_effort": None, "service_tier": None, "store": False,
        "metadata": None, "web_search_options": None,
    },
}  # fmt: skip
"""Parameters OpenAI defines that the door does not serve, with the value that asks for nothing
(accepted: an SDK may send it); any other value is refused."""
UNIONS = {"prompt": "a string, a list of token ids, or a list of one of those"}
"""How to say what a parameter of several shapes takes (pydantic reports each shape's error)."""


def check(kind: str, body: Any, max_chars: int | None = None) -> BaseModel:
    """The body of a request to `kind`'s endpoint (ENDPOINTS), checked (no string longer than
    `max_chars`); BodyError names the first parameter that is wrong."""
    if not isinstance(body, dict):
        raise BodyError("body", f"must be a JSON object; got {_JSON_KINDS.get(type(body), 'a number')}")
    model, unserved = MODELS[kind], UNSERVED.get(kind, {})
    for key, value in body.items():
        if key in model.model_fields:
            continue
        if key in unserved:
            if value is None or value == unserved[key]:
                continue
            raise BodyError(key, f"is not served by this worker (only {unserved[key]!r} is)")
        raise BodyError(_name(key), f"is not a parameter of {ENDPOINTS[kind]}")
    try:
        checked = model.model_validate(body, context={"max_chars": max_chars})
    except ValidationError as e:
        raise _body_error(e, body) from None
    if getattr(checked, "stream_options", None) is not None and not getattr(checked, "stream", None):
        raise BodyError("stream_options", "is taken only with stream: true")
    return checked


_ID: TypeAdapter[str] = TypeAdapter(Annotated[Id, Field(min_length=1)])


def check_id(param: str, value: str) -> str:
    """An id given outside the body (a header), checked as the body's ids are."""
    try:
        return _ID.validate_python(value)
    except ValidationError as e:
        raise BodyError(param, _message(dict(e.errors()[0]))) from None


def _body_error(e: ValidationError, body: dict[str, Any]) -> BodyError:
    """The error to report: a string that breaks the text rule first (of a parameter of several
    shapes, pydantic reports every shape's error), else the first."""
    errors = e.errors()
    first = next((x for x in errors if x["type"] in _TEXT_ERRORS), errors[0])
    param = _loc(first["loc"]) or "body"
    message = _message(dict(first))
    if "[key]" in first["loc"]:
        message = f"keys {message}"
    elif param in UNIONS and param in body and first["type"] not in _TEXT_ERRORS:
        message = f"must be {UNIONS[param]}; got {shown(body[param])}"
    return BodyError(param, message)


_TEXT_ERRORS = ("text", "string_unicode")
_JSON_KINDS = {list: "a list", str: "a string", bool: "true or false", type(None): "null"}
_BRANCHES = ("str", "int", "float", "bool", "none", "list[int]")


def _loc(loc: tuple[Any, ...]) -> str:
    """The parameter path (`messages[0].content`), without pydantic's union branch names
    (`function-after[...]`, `json-str`, `str`) and without a key that is itself wrong."""
    out: list[str] = []
    for k, part in enumerate(loc):
        if isinstance(part, int):
            out[-1:] = [f"{out[-1]}[{part}]"] if out else [f"[{part}]"]
        elif k + 1 < len(loc) and loc[k + 1] == "[key]":
            continue
        elif not ("[" in part or part.startswith(("json-", "function-", "item-")) or part in _BRANCHES):
            out.append(_name(part))
    path = ".".join(out)
    return path if len(path) <= 120 else path[:117] + "..."


def _name(key: str) -> str:
    """A key of the body as a parameter name: as given, or escaped and cut when it would not read."""
    return key if key.isprintable() and 0 < len(key) <= 64 else shown(key)


def _message(error: dict[str, Any]) -> str:
    """pydantic's error in the door's words: what is allowed, and what was given (never pydantic's
    own message)."""
    kind, ctx, given = error["type"], error.get("ctx", {}), shown(error.get("input"))
    bounds = {
        "greater_than_equal": f"must be >= {ctx.get('ge')}",
        "greater_than": f"must be > {ctx.get('gt')}",
        "less_than_equal": f"must be <= {ctx.get('le')}",
        "less_than": f"must be < {ctx.get('lt')}",
    }
    if kind in bounds:
        return f"{bounds[kind]}; got {given}"
    if kind == "text":
        return str(error["msg"])  # the door's own words (_valid)
    if kind == "shape":
        return f"{error['msg']}; got {given}"  # the door's own words (_shapes)
    if kind == "string_unicode":
        return "must hold only valid Unicode keys; one has an unpaired UTF-16 surrogate or a byte that is not UTF-8"
    if kind in ("float_type", "float_parsing", "finite_number"):
        return f"must be a finite number; got {given}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer; got {given}"
    types = {
        "string_type": "a string",
        "bool_type": "true or false",
        "list_type": "a list",
        "dict_type": "an object",
        "model_type": "an object",
        "model_attributes_type": "an object",
        "none_required": "null",
    }
    if kind in types:
        return f"must be {types[kind]}; got {given}"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return f"is not an option of this parameter; got {given}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}; got {given}"
    if kind in ("too_short", "string_too_short"):
        return f"must not be empty; got {given}"
    if kind == "recursion_loop":
        return "nests too deep"
    return f"is not valid here; got {given}"


def shown(value: Any) -> str:
    """`value` in a few characters, whatever its size or depth; what cannot be encoded (a surrogate
    is not printable) escaped."""
    text = _REPR.repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxlong, _REPR.maxother = 2, 40, 40, 40

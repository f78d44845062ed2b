"""The request bodies of the OpenAI-compatible door as pydantic models: every parameter is either
served (typed and bounded here: a wrong type or an out-of-range number is a 400 naming it, never a
500), or one OpenAI defines that this door does not serve, refused unless it is given at its neutral
value, or unknown to the endpoint. Nothing is accepted and silently ignored, but for keys an SDK
sends back in a message or tool call beside those the door reads (`_Open`: JSON, not used).

Every string of a body, at any depth (messages, tools, keys), is `Text`: valid Unicode (no unpaired
UTF-16 surrogate, which a client sends after cutting a string inside an emoji, and no byte that is
not UTF-8, which the door decodes to one) and no longer than the model's context can hold; ids are
`Id`, at most MAX_ID_CHARS. So nothing a tokenizer or the JSON encoder cannot take passes the schema.

`check(kind, body, max_chars)` raises BodyError(param, message); the door turns it into OpenAI's
error shape. The door checks what depends on the worker itself (the model length, the vocabulary,
the chat template, caps on n and tokens).
"""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
)
from pydantic_core import PydanticCustomError
from typing_extensions import TypeAliasType

from ..core.data.prompts import RESERVED_TEMPLATE_KWARGS

INT32 = 2**31 - 1
INT64 = 2**63 - 1
MAX_ID_CHARS = 256
"""The longest id (episode_id, X-Episode-Id, user, model, tool and tool call names and ids)."""


class BodyError(Exception):
    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


def _valid(value: str, cap: int | None, why: str) -> str:
    """The rule of every string: at most `cap` characters, and encodable as UTF-8."""
    if cap is not None and len(value) > cap:
        raise PydanticCustomError(
            "text",
            "must be at most {cap} characters ({why}); got {n}",
            {"cap": cap, "why": why, "n": len(value)},
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PydanticCustomError(
            "text", "must be valid Unicode text; an unpaired UTF-16 surrogate or a byte that is not UTF-8 "
            "is at character {at}", {"at": e.start},
        ) from None  # fmt: skip
    return value


def _text(value: str, info: ValidationInfo) -> str:
    return _valid(value, (info.context or {}).get("max_chars"), "no more fit in the model's context")


def _id(value: str) -> str:
    return _valid(value, MAX_ID_CHARS, "an id")


Text = Annotated[str, AfterValidator(_text)]
"""A text: at most `max_chars` (the validation context) characters, as more cannot fit in the
model's context."""
Id = Annotated[str, AfterValidator(_id)]
"""An id or a name: at most MAX_ID_CHARS characters."""


def _json_kind(value: Any) -> str:
    return f"json-{type(value).__name__}"


if TYPE_CHECKING:  # mypy does not follow a recursive TypeAliasType; to it, any value
    Json: TypeAlias = Any
else:
    Json = TypeAliasType(
        "Json",
        Annotated[
            Union[
                Annotated[Text, Tag("json-str")], Annotated[dict[Text, "Json"], Tag("json-dict")],
                Annotated[list["Json"], Tag("json-list")], Annotated[bool, Tag("json-bool")],
                Annotated[int, Tag("json-int")], Annotated[float, Tag("json-float")],
                Annotated[None, Tag("json-NoneType")],
            ],
            Discriminator(_json_kind),
        ],
    )  # fmt: skip
"""Free-form JSON (a tool's schema, keys a message has beyond the door's): its strings and keys are
Text. A tagged union, so that a wrong value is one error, not one per branch and depth."""


def _shapes(what: str) -> Discriminator:
    """A union told apart by the JSON value's shape: a wrong value is the error of the shape it has
    (a part of a list, not "must be a string"), or, of no shape served, "must be `what`"."""
    return Discriminator(_json_kind, custom_error_type="shape", custom_error_message=f"must be {what}")


Stop = Annotated[
    Union[Annotated[Text, Tag("json-str")], Annotated[list[Text], Tag("json-list")]],
    _shapes("a string or a list of strings"),
]
Content = Annotated[
    Union[Annotated[Text, Tag("json-str")], Annotated[list["TextPart"], Tag("json-list")]],
    _shapes("a string or a list of text parts"),
]
Arguments = Annotated[
    Union[Annotated[Text, Tag("json-str")], Annotated[dict[Text, Json], Tag("json-dict")]],
    _shapes("a JSON object, or its JSON text"),
]


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    include_usage: bool | None = None


class _Open(BaseModel):
    """An object an SDK may send with more keys than the door reads (a message it got back, a tool
    call); the others must be JSON, and are not used."""

    model_config = ConfigDict(strict=True, extra="allow")
    __pydantic_extra__: dict[Text, Json] = Field(init=False)


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text"]
    text: Text


class FunctionCall(_Open):
    name: Id
    arguments: Arguments = "{}"
    """OpenAI's JSON text of an object; the object itself is taken too."""


class ToolCall(_Open):
    id: Id | None = None
    type: Literal["function"] | None = None
    function: FunctionCall


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    """Required but for an assistant's tool calls (the door checks it)."""
    name: Id | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: Id | None = None


class _Body(BaseModel):
    """What both endpoints serve: the sampling parameters both engines honour."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    model: Id | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=INT32)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    n: int | None = Field(None, ge=1, le=INT32)
    seed: int | None = Field(None, ge=-INT64 - 1, le=INT64)
    max_tokens: int | None = Field(None, ge=1, le=INT32)
    stop: Stop | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[Text, float] | None = None  # token ids and bias ranges: the worker checks them
    min_tokens: int | None = Field(None, ge=0, le=INT32)  # vLLM's
    ignore_eos: bool | None = None  # vLLM's
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT32)]] | None = None  # vLLM's
    user: Id | None = None
    episode_id: Id | None = Field(None, min_length=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None


class CompletionBody(_Body):
    prompt: Text | list[int] | list[Text] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = None


def _template_kwargs(value: dict[str, Any]) -> dict[str, Any]:
    taken = [k for k in value if k in RESERVED_TEMPLATE_KWARGS]
    if taken:
        raise PydanticCustomError(
            "text", "{keys} cannot be set here (the door passes it itself)", {"keys": ", ".join(taken)}
        )
    return value


class ChatBody(_Body):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32)
    tools: list[dict[Text, Json]] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: Annotated[dict[Text, Json], AfterValidator(_template_kwargs)] | None = None
    """vLLM's field: variables the chat template reads (e.g. enable_thinking)."""


class TokenizeBody(BaseModel):
    """vLLM's /tokenize: a prompt, or chat messages as the template renders them."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    model: Id | None = None
    prompt: Text | None = None
    messages: list[Message] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    tools: list[dict[Text, Json]] | None = None
    chat_template_kwargs: Annotated[dict[Text, Json], AfterValidator(_template_kwargs)] | None = None


class DetokenizeBody(BaseModel):
    """vLLM's /detokenize: token ids back to text."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    model: Id | None = None
    tokens: list[Annotated[int, Field(ge=0, le=INT32)]]


class InputText(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["input_text", "output_text"]
    text: Text
    annotations: list[Json] | None = None  # an output_text sent back as it came


class InputMessage(_Open):
    """A message item of the Responses API's input (a `type` of "message", or none)."""

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[
        Union[Annotated[Text, Tag("json-str")], Annotated[list[InputText], Tag("json-list")]],
        _shapes("a string or a list of input_text parts"),
    ]


class FunctionCallItem(_Open):
    type: Literal["function_call"]
    call_id: Id
    name: Id
    arguments: Text


class FunctionCallOutput(_Open):
    type: Literal["function_call_output"]
    call_id: Id
    output: Text


def _item_kind(value: Any) -> str:
    return f"item-{value.get('type') or 'message'}" if isinstance(value, dict) else "other"


InputItem = Annotated[
    Union[
        Annotated[InputMessage, Tag("item-message")], Annotated[FunctionCallItem, Tag("item-function_call")],
        Annotated[FunctionCallOutput, Tag("item-function_call_output")],
    ],
    Discriminator(_item_kind, custom_error_type="shape", custom_error_message="must be a message, a "
                  "function_call or a function_call_output item"),
]  # fmt: skip


class FunctionTool(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["function"]
    name: Id
    description: Text | None = None
    parameters: dict[Text, Json] | None = None
    strict: bool | None = None


class ResponsesBody(BaseModel):
    """The Responses API's common subset (POST /v1/responses)."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    model: Id | None = None
    input: Annotated[
        Union[Annotated[Text, Tag("json-str")], Annotated[list[InputItem], Tag("json-list")]],
        _shapes("a string or a list of input items"),
    ]
    instructions: Text | None = None
    previous_response_id: Id | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=INT32)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    store: bool | None = None
    metadata: dict[Id, Text] | None = None
    user: Id | None = None
    episode_id: Id | None = Field(None, min_length=1)
    seed: int | None = Field(None, ge=-INT64 - 1, le=INT64)  # rlcore's, as chat's
    stream: bool | None = None
    stream_options: dict[Id, bool] | None = None  # OpenAI's include_obfuscation: the door sends none


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
        "text": {"format": {"type": "text"}}, "reasoning": None, "include": [], "service_tier": "auto",
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

"""The request bodies of the OpenAI-compatible door as pydantic models: every parameter is either
served (typed and bounded here: a wrong type or an out-of-range number is a 400 naming it, never a
500), or one OpenAI defines that this door does not serve, refused unless it is given at its neutral
value, or unknown to the endpoint. Nothing is accepted and silently ignored, but for keys an SDK
sends back in a message or tool call beside those the door reads (`_Open`: JSON, not used).

Every string of a body, at any depth (messages, tools, keys), is `Text`: valid Unicode (no unpaired
UTF-16 surrogate, which a client sends after cutting a string inside an emoji, and no byte that is
not UTF-8, which the door decodes to one) and no longer than the model's context can hold; ids are
`Id`, at most MAX_ID_CHARS. So nothing a tokenizer or the JSON encoder cannot take passes the schema.

A body is checked against them by openai_checks.check (which also refuses the parameters OpenAI
defines that the door does not serve). The door checks what depends on the worker itself (the
model length, the vocabulary, the chat template, caps on n and tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
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


class JsonSchemaSpec(BaseModel):
    """A chat request's response_format.json_schema."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    name: Id
    description: Text | None = None
    schema_: dict[Text, Json] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """What a chat reply must be: text, any JSON object, or JSON of a schema (held to it token by
    token: rollout/engines/hf_grammar.py)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


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
    response_format: ResponseFormat | None = None


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


class ResponsesFormat(BaseModel):
    """A Responses request's text.format: the chat ResponseFormat, its json_schema's keys inline."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: Id | None = None
    description: Text | None = None
    schema_: dict[Text, Json] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponsesText(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    format: ResponsesFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    """Served at "medium" only (the model's own length; openai_responses.chat_request refuses the others)."""


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
    text: ResponsesText | None = None

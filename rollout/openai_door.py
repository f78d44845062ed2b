"""The OpenAI-compatible HTTP door of a rollout worker (`rlcore rollout serve --http-port`):
/v1/models, /v1/completions and /v1/chat/completions on the worker's engine, beside gRPC, and
vLLM's /tokenize and /detokenize (openai_app.py adds /metrics: door_metrics.py).

The door is the same worker: the same token (`Authorization: Bearer`), engine lock, pause gate,
limits and validation as RolloutService (sampling is checked by the same function, the error
names the request's parameter), errors in OpenAI's shape ({"error": {"message", "type", "param",
"code"}}). Concurrent requests share the engine's running batch whatever their settings (the
worker's batching engine, batching.py). Chat requests are rendered by the model's chat template with the request's `tools`;
tool calls in a reply (in the format the model's templates use: workflows/tool_formats.py) come back
as `tool_calls`.

A request tagged with an episode id (body field `episode_id`, or header `X-Episode-Id`) is
recorded token by token (episodes.py); the gRPC call FinishEpisode scores the record and turns it
into experiences a trainer takes. Each choice also carries the ids of its tokens (`token_ids`,
an rlcore field) and the response the version of the weights that generated it. `stream: true`
sends the answer as OpenAI's server-sent events while it is generated (openai_stream.py).
/v1/completions takes several prompts, `echo` (each prompt's tokens and, with `logprobs`, their
log-probs first: a distillation teacher's scores) and `logprobs` k (the k likeliest tokens);
chat takes `top_logprobs`.

A request's `model` names the model or a LoRA adapter the worker holds beside its weights
(engines/adapters.py; loaded by `--lora-modules`, the gRPC LoadAdapter, or POST
/v1/load_lora_adapter as vLLM takes it), which then generates its answer; /v1/models lists both.
This module is the door's logic; openai_app.py serves it over FastAPI.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

from ..core.data.prompts import PromptFormat
from ..core.rpc.convert import sampling_to_proto
from ..core.rpc.errors import InvalidArgument, NotFound, ServiceError, Unavailable
from ..core.types import Completion, SamplingParams, StructuredOutput
from .engines.adapters import AdapterNotHeld
from .engines.base import StructuredOutputRefused, TokensOut
from .episodes import EpisodeRecorder
from .openai_checks import check, check_id, shown
from .openai_errors import DoorError, invalid, not_served
from .openai_messages import Conversations, assistant_message, comparable, template_messages
from .openai_schema import BodyError
from .openai_stream import LiveStream
from .server import RolloutServicer
from .workflows.tool_formats import ToolCallFormat, resolve
from .workflows.turns import TurnFormat

log = logging.getLogger(__name__)

STRUCTURED = "structured output: "
"""The head of an engine's StructuredOutputRefused message, which the door's answer drops (it names response_format)."""

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "n", "seed", "presence_penalty",
                 "frequency_penalty", "min_tokens", "ignore_eos", "stop_token_ids")  # fmt: skip
"""The request's parameters that are SamplingParams' own (stop, max_tokens and logit_bias are converted)."""
MAX_N = 64
"""Completions one request may ask for (`rlcore rollout serve --http-max-n`)."""
MAX_REQUEST_TOKENS = 1 << 18
"""n x max_tokens one request may ask for (`--http-max-request-tokens`): a request holds the engine
for its whole generation."""
BATCH_WAIT_S = 0.01
"""How long a request that finds the engine idle waits for concurrent ones to share its engine call
(`--http-batch-wait-ms`)."""


class OpenAIDoor:
    """The door's logic, apart from the web framework (openai_app.build_app wires it to FastAPI)."""

    def __init__(
        self, servicer: RolloutServicer, recorder: EpisodeRecorder, token: str, model_name: str,
        max_n: int = MAX_N, max_request_tokens: int = MAX_REQUEST_TOKENS, batch_wait_s: float = BATCH_WAIT_S,
        tool_call_format: str = "auto",
    ):  # fmt: skip
        self.servicer, self.recorder, self.token, self.model_name = servicer, recorder, token, model_name
        self.max_n, self.max_request_tokens, self.batch_wait_s = max_n, max_request_tokens, batch_wait_s
        self.tokenizer = servicer.tokenizer
        self.tool_calls = resolve(tool_call_format, self.tokenizer)
        """How the model writes tool calls (`--tool-call-format`; auto: as its templates say)."""
        # No token decodes to more characters than its vocabulary string has (byte-level BPE: one
        # symbol per byte); so a text longer than this x max_model_len cannot fit, whatever it holds,
        # and is refused before the tokenizer spends seconds on it.
        self.max_chars = max(map(len, self.tokenizer.get_vocab()), default=1) * servicer.max_model_len
        self.conversations = Conversations()
        """Stored /v1/responses conversations, for a later previous_response_id."""

    # ------------------------------------------------------------------------------------------
    # requests

    def check_token(self, authorization: str | None) -> None:
        scheme, _, given = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise DoorError(
                401,
                "missing or wrong API key: send the worker's token as `Authorization: Bearer <token>`",
                kind="authentication_error",
            )

    def models(self) -> dict[str, Any]:
        """The model, then each LoRA adapter the worker holds (as vLLM lists them: its folder as
        `root`, the model as `parent`)."""
        base = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "rlcore",
                "max_model_len": self.servicer.max_model_len}  # fmt: skip
        adapters = [
            {**base, "id": name, "root": path, "parent": self.model_name}
            for name, path in sorted(self.servicer.engine.adapter_names().items())
        ]
        return {"object": "list", "data": [base, *adapters]}

    def load_adapter(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/load_lora_adapter {"lora_name", "lora_path"} (vLLM's): hold that adapter; a
        request whose `model` is its name generates with it."""
        name, path = (self._text(body, key) for key in ("lora_name", "lora_path"))
        if name == self.model_name:
            raise invalid("lora_name", f"'{name}' is the model's own name here; give the adapter another")
        try:
            held = self.servicer.load_adapter(name, path)
        except InvalidArgument as e:
            raise invalid("lora_name" if e.field == "name" else "lora_path", str(e).split(": ", 1)[1]) from None
        return {"object": "list", "adapters": held}

    def unload_adapter(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/unload_lora_adapter {"lora_name"} (vLLM's): drop that adapter."""
        try:
            held = self.servicer.unload_adapter(self._text(body, "lora_name"))
        except NotFound as e:
            raise DoorError(404, str(e), "lora_name", "not_found_error") from None
        return {"object": "list", "adapters": held}

    @staticmethod
    def _text(body: Any, key: str) -> str:
        value = body.get(key) if isinstance(body, dict) else None
        if not isinstance(value, str) or not value:
            raise invalid(key, "give a non-empty string")
        return value

    def sampling(
        self, body: dict[str, Any], prompt_len: int, prompt_param: str = "prompt", prompts: int = 1
    ) -> SamplingParams:
        """The request's sampling, checked as RolloutService checks it (the error names the
        request's parameter), types and ranges by the schema (openai_schema.py) first, then what
        depends on this worker: the model length, and the caps on n and tokens per request.
        max_tokens defaults to the room the prompt leaves."""
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else (stop or [])
        n = body.get("n") or 1
        if n > self.max_n:
            raise invalid(
                "n", f"at most {self.max_n} completions per request (rlcore rollout serve --http-max-n)"
            )
        room = self.servicer.max_model_len - prompt_len
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or max(room, 1)
        values = {k: body[k] for k in SAMPLING_KEYS if body.get(k) is not None}
        values.setdefault("temperature", 1.0)
        values["adapter"] = "" if body.get("model") in (None, self.model_name) else body["model"]
        bias = body.get("logit_bias") or {}
        try:
            values["logit_bias"] = {int(token): value for token, value in bias.items()}
        except ValueError:
            raise invalid("logit_bias", f"keys must be token ids; got {sorted(bias)[:3]}") from None
        outside = [t for t in values["logit_bias"] if not 0 <= t < self.servicer.vocab_size]
        if outside:
            raise invalid("logit_bias", f"token id {outside[0]} is outside [0, {self.servicer.vocab_size})")
        try:
            sampling = self.servicer._sampling(
                sampling_to_proto(SamplingParams(**values, stop=stop, max_tokens=max_tokens))
            )
            self.servicer._check_length(prompt_param, prompt_len, sampling)
        except InvalidArgument as e:
            if e.field == "sampling.adapter":  # unloaded since the body's check
                raise not_served(body["model"], self._served()) from None
            field = e.field.removeprefix("sampling.")
            raise invalid(field, str(e).split(": ", 1)[1]) from None
        if prompts * sampling.n * sampling.max_tokens > self.max_request_tokens:
            many = f"{prompts} prompts x " if prompts > 1 else ""
            raise invalid(
                "max_tokens",
                f"{many}n {sampling.n} x max_tokens {sampling.max_tokens} is more than the {self.max_request_tokens} "
                "tokens one request may generate here (rlcore rollout serve --http-max-request-tokens)",
            )
        return sampling

    def episode_id(self, body: dict[str, Any], header: str | None) -> str | None:
        """The body's episode_id (checked by the schema), else the X-Episode-Id header's, checked
        as the body's is (its bytes read as UTF-8, as the body's are)."""
        if "episode_id" in body or header is None:
            return body.get("episode_id")
        try:
            return check_id("X-Episode-Id", header.encode("latin-1").decode("utf-8", "surrogateescape"))
        except BodyError as e:
            raise invalid(e.param, str(e).split(": ", 1)[1]) from None

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, on_tokens: TokensOut | None = None
    ) -> tuple[list[list[Completion]], int]:
        """The prompts' completions (each prompt's n), and the version of the weights. Requests go through the worker's batching engine, as RunTasks'
        tasks do: concurrent requests decode together (batching.py), under the worker's gate and
        engine lock; `on_tokens` sees the tokens as they are sampled (a streamed answer). A paused
        worker refuses new requests (503); one admitted waits out a weight update that starts
        meanwhile."""
        try:
            self.servicer.gate.check()
            results, version = self.servicer.batching.generate_versioned(
                prompts, sampling, self.batch_wait_s, on_tokens
            )
            self.servicer.gate.count(sum(len(c.token_ids) for cs in results for c in cs))
        except Unavailable as e:
            raise DoorError(503, str(e), kind="service_unavailable") from None
        except AdapterNotHeld:  # unloaded since the request was checked
            raise not_served(sampling.adapter, self._served()) from None
        except ServiceError as e:
            raise DoorError(500, str(e), kind="server_error") from None
        except StructuredOutputRefused as e:
            raise invalid("response_format", str(e).removeprefix(STRUCTURED)) from None
        except ValueError as e:  # the engine's one-line refusal (a setting it does not serve)
            raise DoorError(400, str(e)) from None
        return results, version

    # ------------------------------------------------------------------------------------------
    # /v1/completions

    def completions(
        self, body: dict[str, Any], episode_header: str | None, live: LiveStream | None = None
    ) -> dict[str, Any]:
        """/v1/completions: one prompt or several (choice i * n + j is prompt i's sample j); `echo`
        puts each prompt before its completion, with its tokens' log-probs when `logprobs` is set
        (the prompt's first token has none); `logprobs` k > 0 adds the k likeliest tokens."""
        self.check_body("completions", body)
        prompts = self._prompts(body.get("prompt"))
        episode = self.episode_id(body, episode_header)
        if episode and len(prompts) > 1:
            raise invalid("prompt", "a recorded episode is one conversation: give one prompt")
        prompt = prompts[0]
        continued = (
            self.recorder.continuation(episode, prompt) if episode and isinstance(prompt, str) else None
        )
        inserted: list[int] = []
        if continued is not None and isinstance(prompt, str):
            # the previous prompt, its completion, the new text
            inserted = self._encode(prompt[len(continued.history) :])
            ids_list = [continued.tokens + inserted]
        else:
            ids_list = [self._encode(p) if isinstance(p, str) else p for p in prompts]
        logprobs, echo = body.get("logprobs"), bool(body.get("echo"))
        sampling = self.sampling(body, max(len(ids) for ids in ids_list), prompts=len(ids_list))
        sampling = replace(sampling, prompt_logprobs=echo and logprobs is not None, top_logprobs=logprobs or 0)
        self._check_episode(episode, sampling)
        results, version = self.generate(
            ids_list, sampling, self._begin(live, False, ids_list, sampling, body, live_text=not echo)
        )
        choices = [
            self._text_choice(i * sampling.n + j, p, ids, c, echo, logprobs)
            for i, (p, ids, cs) in enumerate(zip(prompts, ids_list, results, strict=True))
            for j, c in enumerate(cs)
        ]
        if episode:
            c = results[0][0]
            history = (prompt if isinstance(prompt, str) else self.tokenizer.decode(ids_list[0])) + c.text
            self.recorder.record(episode, continued, inserted, ids_list[0], c, history, version, sampling.adapter)
        return self._response("text_completion", choices, ids_list, results, version, sampling)

    def _prompts(self, prompt: Any) -> list[str | list[int]]:
        """The request's prompts (typed by the schema: each string fits the model's context): one, or
        a list of at most --http-max-n strings or token lists."""
        one = isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))
        prompts = [prompt] if one else list(prompt or [])
        if not prompts:
            raise invalid("prompt", "give a non-empty prompt: a string or a list of token ids, or a list of those")
        if len(prompts) > self.max_n:
            raise invalid("prompt", f"at most {self.max_n} prompts per request (rlcore rollout serve --http-max-n)")
        for i, p in enumerate(prompts):
            where = "prompt" if one else f"prompt[{i}]"
            if not p:
                raise invalid(where, "is empty; give a non-empty string or list of token ids")
            bad = [] if isinstance(p, str) else [t for t in p if not 0 <= t < self.servicer.vocab_size]
            if bad:
                raise invalid(where, f"token id {bad[0]} is outside [0, {self.servicer.vocab_size})")
        return prompts

    def _text_choice(
        self, index: int, prompt: str | list[int], ids: list[int], c: Completion, echo: bool, logprobs: int | None
    ) -> dict[str, Any]:
        """A text completion's choice: the text (after the prompt's, with echo) and the log-probs."""
        text = (prompt if isinstance(prompt, str) else self.tokenizer.decode(ids)) + c.text if echo else c.text
        choice: dict[str, Any] = {"index": index, "text": text, "finish_reason": c.finish_reason, "token_ids": c.token_ids}
        choice["logprobs"] = None
        if logprobs is not None:
            tokens, scores = self._pieces(c.token_ids), list[float | None](c.logprobs)
            top: list[dict[str, float] | None] | None = None
            if logprobs:
                top = [{self._piece(t): lp for t, lp in k} for k in c.top_logprobs]
            if echo:  # the prompt's tokens first (its first token has no log-prob)
                tokens, scores = self._pieces(ids) + tokens, [None, *c.prompt_logprobs, *scores]
                if top is not None:
                    top = [None, *({self._piece(t): lp} for t, lp in zip(ids[1:], c.prompt_logprobs, strict=True)), *top]
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": scores, "top_logprobs": top, "text_offset": None}
        return choice

    # ------------------------------------------------------------------------------------------
    # /v1/chat/completions

    def chat(
        self, body: dict[str, Any], episode_header: str | None, live: LiveStream | None = None
    ) -> dict[str, Any]:
        self.check_body("chat", body)
        messages = template_messages(body["messages"])
        self.check_chars("messages", sum(len(m["content"]) for m in messages))
        tools = body.get("tools")
        if body.get("top_logprobs") and not body.get("logprobs"):
            raise invalid("top_logprobs", "is taken only with logprobs: true")
        template_kwargs = body.get("chat_template_kwargs") or None  # vLLM's field (checked by the schema)
        fmt = PromptFormat(self.servicer.max_model_len, True, None, None, tools or None, template_kwargs)
        episode = self.episode_id(body, episode_header)
        continued = self.recorder.continuation(episode, messages) if episode else None
        inserted: list[int] = []
        try:
            if (
                continued is not None
            ):  # the tokens so far, then only the new turns, as the template renders them
                try:
                    turns = TurnFormat(self.tokenizer, True, None, None, tools or None, template_kwargs)
                    inserted = turns.after_reply(continued.last_reply, messages[len(continued.history) :])
                except (
                    ValueError
                ):  # a template that re-renders history (e.g. a thinking one): a new conversation
                    continued, inserted = None, []
            ids = (
                continued.tokens + inserted
                if continued is not None
                else fmt.encode_prompt(self.tokenizer, "", messages)
            )
        except Exception as e:  # no chat template, or one that refuses these messages
            raise self.template_error(e) from None
        sampling = self.sampling(body, len(ids), "messages")
        sampling = replace(
            sampling, top_logprobs=body.get("top_logprobs") or 0, structured_output=structured(body.get("response_format"))
        )
        self._check_episode(episode, sampling)
        (completions,), version = self.generate(
            [ids], sampling, self._begin(live, True, [ids], sampling, body, calls=self.tool_calls if tools else None)
        )
        choices = []
        for i, c in enumerate(completions):
            # tool calls are read from a reply only where tools were offered (as OpenAI's, vLLM's)
            message = assistant_message(c.text, self.tool_calls) if tools else {"role": "assistant", "content": c.text}
            finish = "tool_calls" if message.get("tool_calls") else c.finish_reason
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "finish_reason": finish,
                "token_ids": c.token_ids,
            }
            choice["logprobs"] = self._chat_logprobs(c) if body.get("logprobs") else None
            choices.append(choice)
        if episode:
            c = completions[0]
            history = messages + [comparable(choices[0]["message"])]
            self.recorder.record(episode, continued, inserted, ids, c, history, version, sampling.adapter)
        return self._response("chat.completion", choices, [ids], [completions], version, sampling)

    def _chat_logprobs(self, c: Completion) -> dict[str, Any]:
        """A chat choice's log-probs: each token's, with the likeliest alternatives when asked."""
        tops = c.top_logprobs or [[] for _ in c.token_ids]
        return {"content": [
            {**self._logprob(t, lp), "top_logprobs": [self._logprob(a, alp) for a, alp in top]}
            for t, lp, top in zip(c.token_ids, c.logprobs, tops, strict=True)
        ]}  # fmt: skip

    def _logprob(self, token_id: int, logprob: float) -> dict[str, Any]:
        piece = self._piece(token_id)
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}

    # ------------------------------------------------------------------------------------------
    # helpers

    def _begin(
        self, live: LiveStream | None, chat: bool, prompts: list[list[int]], sampling: SamplingParams,
        body: dict[str, Any], live_text: bool = True, calls: ToolCallFormat | None = None,
    ) -> TokensOut | None:  # fmt: skip
        """Start a streamed answer (its first events); what the engine hands its tokens to
        (`calls`: the tool-call format of a request with tools)."""
        if live is None:
            return None
        live.begin(
            chat=chat, n=len(prompts) * sampling.n, model=sampling.adapter or self.model_name,
            prompt_token_ids=prompts[0] if len(prompts) == 1 else prompts,
            policy_version=lambda: self.servicer.engine.policy_version,
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            decode=lambda tokens: str(self.tokenizer.decode(tokens, skip_special_tokens=True)),
            stop=sampling.stop, live=live_text, calls=calls,
        )  # fmt: skip
        return live.tokens

    def model(self, model_id: str) -> dict[str, Any]:
        """GET /v1/models/{id}: the served model or adapter, or a 404 in OpenAI's shape."""
        served = {m["id"]: m for m in self.models()["data"]}
        if model_id not in served:
            raise not_served(model_id, list(served))
        return served[model_id]

    def _check_episode(self, episode: str | None, sampling: SamplingParams) -> None:
        """A recorded episode is one conversation, with one model (the model or one adapter)."""
        if not episode:
            return
        if sampling.n != 1:
            raise invalid("n", "a recorded episode is one conversation: n must be 1")
        held = self.recorder.adapter_of(episode)
        if held is not None and held != sampling.adapter:
            raise invalid(
                "model", f"episode {shown(episode)} was recorded with '{held or self.model_name}'; an episode stays "
                "on one model (give this request another episode id)",
            )

    def _served(self) -> list[str]:
        """What a request's `model` may name: the model, then the adapters held."""
        return [self.model_name, *sorted(self.servicer.engine.adapter_names())]

    def check_body(self, kind: str, body: Any) -> None:
        """The schema's check (types, ranges, unserved and unknown parameters, every string valid
        text that fits in the model's context), then the model."""
        try:
            check(kind, body, self.max_chars)
        except BodyError as e:
            raise invalid(e.param, str(e).split(": ", 1)[1]) from None
        model = body.get("model")
        if model is not None and model not in (served := self._served()):
            raise not_served(model, served)

    def template_error(self, e: Exception) -> DoorError:
        """The chat template's failure in the door's words: a template's own refusal (its
        `raise_exception`, a jinja2 TemplateError) in the template's words; anything else logged."""
        if type(e).__module__ == "jinja2.exceptions" and type(e).__name__ == "TemplateError":
            return invalid("messages", f"the model's chat template refuses them: {e}")
        if not getattr(self.tokenizer, "chat_template", None):
            return invalid("messages", "the model has no chat template (send a prompt to /v1/completions)")
        log.warning("the chat template failed on a request's messages", exc_info=e)
        return invalid("messages", "the model's chat template cannot render them")

    def check_chars(self, param: str, chars: int) -> None:
        if chars > self.max_chars:
            raise invalid(
                param, f"{chars} characters cannot fit in max_model_len {self.servicer.max_model_len} tokens"
            )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _pieces(self, token_ids: list[int]) -> list[str]:
        return [self._piece(t) for t in token_ids]

    def _piece(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))

    def _response(
        self, kind: str, choices: list, prompts: list[list[int]], results: list[list[Completion]], version: int,
        sampling: SamplingParams,
    ) -> dict[str, Any]:  # fmt: skip
        """The response; `prompt_token_ids` (a list of them for several prompts) and each choice's
        `token_ids` are rlcore's (vLLM's names)."""
        generated = sum(len(c.token_ids) for cs in results for c in cs)
        prompt_len = sum(len(ids) for ids in prompts)
        prompt_ids = prompts[0] if len(prompts) == 1 else prompts
        return {
            "id": f"{'cmpl' if kind == 'text_completion' else 'chatcmpl'}-{uuid.uuid4().hex}",
            "object": kind, "created": int(time.time()), "model": sampling.adapter or self.model_name, "choices": choices,
            "usage": {"prompt_tokens": prompt_len, "completion_tokens": generated, "total_tokens": prompt_len + generated},
            "policy_version": version, "prompt_token_ids": prompt_ids,
        }  # fmt: skip


def structured(response_format: dict[str, Any] | None) -> StructuredOutput | None:
    """What a chat request's (checked) response_format holds its reply to; None: text."""
    if not response_format or response_format["type"] == "text":
        return None
    if response_format["type"] == "json_object":
        return StructuredOutput("json_object")
    schema = (response_format.get("json_schema") or {}).get("schema")
    if schema is None:  # a json_schema without its schema (the SDK allows it): any JSON object
        return StructuredOutput("json_object")
    return StructuredOutput("json_schema", json.dumps(schema))

"""The model calls tools: it writes them in its reply in the format its chat template teaches it
(tool_formats.py: Hermes/Qwen `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, Llama 3's
JSON, Mistral's `[TOOL_CALLS]`, or the tokenizer's own response template; `workflow_args.tool_call_format`,
default auto), each call's result comes back as a `tool` turn rendered by the
chat template, and the episode ends on a reply without a call (the final answer, scored by the
taskset's reward functions) or at a limit (those of multi_turn).

A malformed call (not JSON, not an object with a name and arguments, an unclosed tag), an unknown
tool or a failing one (ToolError, a timeout, any exception) becomes an error message in the tool
turn: the model reads it and the episode goes on; nothing reaches the worker. Each episode counts
`tool_calls`, `tool_errors` and `tool_used` (1 when at least one call succeeded), averaged over a
step into rollout/<name>_mean.
"""

from __future__ import annotations

from typing import Any

from ...core.types import Task
from ..envs.base import StepResult, TextEnv
from ..tools import resolve_tool
from ..tools.base import Tool, ToolError
from .conversation import LIMITS, ConversationWorkflow, Episode, positive_int
from .tool_formats import CHOICES, Hermes, ToolCall, ToolCallFormat, resolve


def parse_tool_calls(reply: str) -> list[ToolCall]:
    """The reply's calls in the Hermes format (tool_formats.py has the others)."""
    return Hermes().parse(reply)


def build_tools(args: dict[str, Any]) -> dict[str, Tool]:
    """The tools `args` (checked workflow_args) name, by name; each gets `tool_args[<its name>]`."""
    tool_args = args.get("tool_args", {})
    tools: dict[str, Tool] = {}
    for name in args["tools"]:
        cls = resolve_tool(name)
        tool = cls(tool_args.get(cls.name, {}))
        if tool.name in tools:
            raise ValueError(f"workflow_args.tools: two tools are named '{tool.name}'")
        tools[tool.name] = tool
    return tools


class ToolSession(TextEnv):
    """The tools' side of one episode: answers each reply's calls with one tool turn per call."""

    def __init__(
        self, task: Task, tools: dict[str, Tool], max_calls: int, declared: list[str] | None = None,
        calls: ToolCallFormat | None = None,
    ):  # fmt: skip
        """`declared`: the tools the task's row offers (format.tools_key), None: all of `tools`;
        `calls`: how the model writes its calls (Hermes unless said)."""
        super().__init__(task, {})
        self.calls = calls or Hermes()
        self.offered = list(tools) if declared is None else declared
        self.tools = {name: tool for name, tool in tools.items() if name in self.offered}
        self.max_calls = max_calls
        self.metrics = {"tool_calls": 0.0, "tool_errors": 0.0, "tool_used": 0.0}

    def reset(self) -> str:
        return self.task.prompt

    def step(self, reply: str) -> StepResult:
        calls = self.calls.parse(reply)
        if not calls:
            return StepResult("", done=True)  # the final answer
        outputs = [self.run(call) for call in calls[: self.max_calls]]
        if len(calls) > self.max_calls:
            outputs.append(
                f"error: {len(calls) - self.max_calls} more call(s) ignored (at most {self.max_calls} per turn)"
            )
        return StepResult("", messages=[{"role": "tool", "content": out} for out in outputs])

    def run(self, call: ToolCall) -> str:
        self.metrics["tool_calls"] += 1
        if isinstance(call, str):
            self.metrics["tool_errors"] += 1
            return f"error: {call}"
        name, arguments = call
        tool = self.tools.get(name)
        if tool is None:
            self.metrics["tool_errors"] += 1
            if name in self.offered:  # the row declares it, the workflow has no implementation
                return f"error: tool '{name}' is not available here"
            return f"error: unknown tool '{name}'; the tools are {', '.join(self.offered)}"
        try:
            output = tool(arguments)
        except ToolError as e:
            self.metrics["tool_errors"] += 1
            return f"error: {e}"
        except Exception as e:  # a user's tool that breaks must not end the rollout
            self.metrics["tool_errors"] += 1
            return f"error: tool '{name}' failed: {type(e).__name__}: {e}"
        self.metrics["tool_used"] = 1.0
        return str(output)


class ToolCallWorkflow(ConversationWorkflow):
    """`workflow_args`: tools (names of built-in tools, calculator and python, or 'pkg.mod:Class' of
    Tool subclasses), tool_args ({tool name: its args}), max_calls_per_turn (default 4), max_turns
    (default 4), max_tokens_per_turn, max_total_tokens, tool_call_format (auto, hermes,
    llama3_json, mistral, response_template; default auto). Needs model.apply_chat_template and a
    chat template that declares tools and renders tool turns."""

    KEYS = ("tools", "tool_args", "max_calls_per_turn", "tool_call_format", *LIMITS)

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        super().check_args(args)
        names = args.get("tools")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ValueError(
                "workflow_args.tools: list the tools (calculator, python, or 'pkg.mod:Class' of a Tool)"
            )
        for i, name in enumerate(names):
            try:
                resolve_tool(name)
            except ValueError as e:
                raise ValueError(f"workflow_args.tools[{i}]: {e}") from None
        if not isinstance(args.get("tool_args", {}), dict):
            raise ValueError(
                f"workflow_args.tool_args must be an object of tool name -> args; got {args['tool_args']!r}"
            )
        positive_int(args, "max_calls_per_turn", None)
        if args.get("tool_call_format", "auto") not in CHOICES:
            raise ValueError(
                f"workflow_args.tool_call_format must be one of {', '.join(CHOICES)}; got {args['tool_call_format']!r}"
            )

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        if not self.prompt_format.apply_chat_template:
            raise ValueError(
                "tool_call needs model.apply_chat_template: true (the chat template declares the tools to the "
                "model and renders their calls and results)"
            )
        self.tools = build_tools(self.args)
        self.max_calls: int = positive_int(self.args, "max_calls_per_turn", 4) or 4
        self.prompt_format.tools = [tool.schema for tool in self.tools.values()]
        self._check_template_declares_tools()
        try:
            self.tool_calls = resolve(
                self.args.get("tool_call_format", "auto"), self.tokenizer, self.prompt_format.chat_template
            )
        except ValueError as e:
            raise ValueError(f"workflow_args.{e}") from None

    @classmethod
    def tool_schemas(cls, args: dict[str, Any]) -> list[dict[str, Any]] | None:
        cls.check_args(args)
        return [tool.schema for tool in build_tools(args).values()]

    def _check_template_declares_tools(self) -> None:
        pf = self.prompt_format
        probe = [{"role": "user", "content": "x"}]
        with_tools, without = (
            self.tokenizer.apply_chat_template(
                probe, chat_template=pf.chat_template, tools=tools, add_generation_prompt=True, tokenize=False
            )
            for tools in (pf.tools, None)
        )
        if with_tools == without or not all(name in with_tools for name in self.tools):
            raise ValueError(
                "the chat template does not declare tools to the model (rendering with tools changes nothing); "
                "tool_call needs one that does: set model.chat_template to a template with tool support"
            )

    def start(self, task: Task) -> Episode:
        """The task's prompt (its conversation for a messages row) with its row's tools, if it
        declares some, else the workflow's."""
        declared = (
            [t["function"]["name"] for t in task.metadata["tools"]] if "tools" in task.metadata else None
        )
        session = ToolSession(task, self.tools, self.max_calls, declared, self.tool_calls)
        messages = list(task.metadata.get("messages") or [{"role": "user", "content": task.prompt}])
        return Episode(task, session, self.encode_prompt(task), messages=messages)

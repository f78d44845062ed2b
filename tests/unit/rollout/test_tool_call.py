"""tool_call: the Hermes call parser, tools (calculator, the sandboxed python tool, a user's tool),
error turns instead of crashes, the workflow's checks, and chat-message encoding with the scratch
BPE tokenizer and its ChatML template (tool output is context: loss mask 0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlcore.core.data.prompts import PromptFormat
from rlcore.core.types import SamplingParams, Task
from rlcore.rollout.engines.hf import HFEngine
from rlcore.rollout.rewards.compose import build_reward
from rlcore.rollout.tools.base import Tool
from rlcore.rollout.tools.calculator import Calculator
from rlcore.rollout.tools.python import PythonTool
from rlcore.rollout.workflows.tool_call import ToolCallWorkflow, ToolSession, build_tools, parse_tool_calls

BOOM = f"{__name__}:Boom"


class Boom(Tool):
    """A user's tool that breaks."""

    name = "boom"
    description = "Always fails."
    parameters = {"type": "object", "properties": {}}

    def __call__(self, arguments: dict[str, Any]) -> str:
        raise RuntimeError("kaput")


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def engine(bpe_model_path: str) -> HFEngine:
    return HFEngine(bpe_model_path)


def workflow(engine: HFEngine, args: dict[str, Any], **kwargs: Any) -> ToolCallWorkflow:
    kwargs.setdefault("apply_chat_template", True)
    return ToolCallWorkflow(
        engine, engine.tokenizer, build_reward(["exact_match"]), max_prompt_tokens=200, args=args, **kwargs
    )


def test_calls_are_parsed_in_order_and_unreadable_ones_become_errors() -> None:
    reply = (
        call("calculator", expression="2*3")
        + '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>'
        + "<tool_call>{not json}</tool_call><tool_call>[1, 2]</tool_call><tool_call>{\"name\": \"x\""
    )
    calls = parse_tool_calls(reply)
    assert calls[:2] == [("calculator", {"expression": "2*3"}), ("calculator", {"expression": "1+1"})]
    assert calls[2].startswith("malformed tool call: not JSON (Expecting property name")
    assert calls[3] == 'malformed tool call: give {"name": "<tool>", "arguments": {...}}'
    assert calls[4] == "malformed tool call: <tool_call> without its closing </tool_call>"
    assert parse_tool_calls("<answer>6</answer>") == []


def test_llama3_mistral_and_response_template_calls_read_like_hermes(bpe_model_path: str) -> None:
    """Each format of tool_formats.py on the replies its models write, and `auto` picking the one a
    chat template (or the tokenizer's declared response template) uses."""
    from transformers import AutoTokenizer

    from rlcore.rollout.workflows.tool_formats import Hermes, Llama3Json, Mistral, ResponseTemplate, resolve

    two = [("calculator", {"expression": "2*3"}), ("python", {"code": "print(1)"})]
    llama = Llama3Json()
    assert llama.parse('<|python_tag|>{"name": "calculator", "parameters": {"expression": "2*3"}}') == two[:1]
    assert llama.parse('{"name": "calculator", "parameters": {"expression": "2*3"}}; '
                       '{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}') == two  # fmt: skip
    assert llama.parse("The answer is 6.") == [] and llama.content("The answer is 6.") == "The answer is 6."
    assert llama.parse('{"answer": 42}') == []  # a JSON answer, not a call
    after = '{"name": "calculator", "parameters": {"expression": "2*3"}} and that is it'
    assert llama.parse(after) == two[:1] and llama.content(after) == "and that is it"
    assert llama.parse('{"name": "calculator", "parameters": {"expression": ')[0].startswith("malformed tool call: not JSON")
    mistral = Mistral()
    v3 = 'Let me see.[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2*3"}}, {"name": "python", "arguments": {"code": "print(1)"}}]'
    assert mistral.parse(v3) == two and mistral.content(v3) == "Let me see."
    assert mistral.parse(v3.split("[TOOL_CALLS]")[1]) == two  # the marker dropped by decoding
    v11 = '[TOOL_CALLS]calculator[ARGS]{"expression": "2*3"}[TOOL_CALLS]python[ARGS]{"code": "print(1)"}'
    assert mistral.parse(v11) == two and mistral.parse("6") == []
    assert mistral.parse('[TOOL_CALLS][{"name": 5}]') == ['malformed tool call: give {"name": "<tool>", "arguments": {...}}']

    tokenizer = AutoTokenizer.from_pretrained(bpe_model_path)
    assert isinstance(resolve("auto", tokenizer), Hermes)  # its ChatML template writes <tool_call>
    assert isinstance(resolve("auto", tokenizer, "{{ '[TOOL_CALLS]' + tool_calls|tojson }}"), Mistral)
    assert isinstance(resolve("auto", tokenizer, "{{- '<|python_tag|>' + tool_call.name }}"), Llama3Json)
    with pytest.raises(ValueError, match="tool_call_format must be one of auto, hermes, llama3_json"):
        resolve("openai", tokenizer)
    with pytest.raises(ValueError, match="the tokenizer declares no response_template"):
        resolve("response_template", tokenizer)
    tokenizer.response_template = {
        "start_anchor": "<|im_start|>assistant\n", "defaults": {"role": "assistant"},
        "fields": {"content": {}, "tool_calls": {"open": "<tool_call>", "close": "</tool_call>", "content": "json",
                                                 "repeats": True}},
    }  # fmt: skip
    declared = resolve("auto", tokenizer)
    assert isinstance(declared, ResponseTemplate)
    reply = 'Let me see.<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'
    assert declared.parse(reply) == two[:1] and declared.content(reply) == "Let me see." and declared.parse("6") == []
    with pytest.raises(ValueError, match="workflow_args.tool_call_format must be one of auto, hermes"):
        ToolCallWorkflow.check_args({"tools": ["calculator"], "tool_call_format": "xml"})


def test_tool_failures_are_error_turns_and_counted() -> None:
    tools = build_tools({"tools": ["calculator", "python", BOOM], "tool_args": {"python": {"timeout_s": 0.5}}})
    session = ToolSession(Task("t", "q"), tools, max_calls=6)
    reply = (
        call("calculator", expression="37*46") + call("calculator", expression="1/0") + call("abacus")
        + call("python", code="while True: pass") + call("boom") + "<tool_call>{oops}</tool_call>"
    )  # fmt: skip
    result = session.step(reply)
    outputs = [m["content"] for m in result.messages or []]
    assert not result.done and [m["role"] for m in result.messages or []] == ["tool"] * 6
    assert outputs[0] == "1702" and outputs[1] == "error: division by zero"
    assert outputs[2] == "error: unknown tool 'abacus'; the tools are calculator, python, boom"
    assert outputs[3] == "error: the code ran longer than 0.5 s and was stopped"
    assert outputs[4] == "error: tool 'boom' failed: RuntimeError: kaput"
    assert outputs[5].startswith("error: malformed tool call: not JSON")
    assert session.metrics == {"tool_calls": 6.0, "tool_errors": 5.0, "tool_used": 1.0}
    assert session.step("<answer>1702</answer>").done  # no call: the final answer
    # at most max_calls per turn: the rest is said to be ignored
    one = ToolSession(Task("t", "q"), tools, max_calls=1).step(call("calculator", expression="1+1") * 3)
    assert [m["content"] for m in one.messages or []] == ["2", "error: 2 more call(s) ignored (at most 1 per turn)"]


def test_the_python_tool_runs_code_in_a_limited_subprocess() -> None:
    tool = PythonTool({"timeout_s": 5, "memory_mb": 128})
    assert tool({"code": "print(sum(range(10)))"}) == "45\n"
    with pytest.raises(Exception, match="out of memory"):
        tool({"code": "x = bytearray(512 * 1024 * 1024)"})
    with pytest.raises(Exception, match="ZeroDivisionError"):
        tool({"code": "1/0"})
    assert Calculator()({"expression": "(2+3)/2"}) == "2.5"


def test_the_prompt_declares_the_tools_through_the_template(engine: HFEngine) -> None:
    wf = workflow(engine, {"tools": ["calculator"]})
    text = engine.tokenizer.decode(wf.encode_prompt(Task("t", "What is 37*46?")))
    assert '"name": "calculator"' in text and text.endswith("What is 37*46?<|im_end|>\n<|im_start|>assistant\n")
    exps = wf.run([Task("t", "What is 37*46?", answer="1702")], SamplingParams(n=2, max_tokens=8, seed=0), 0)
    assert len(exps) == 2 and all({"turns", "tool_calls", "tool_errors", "tool_used"} <= set(e.metrics) for e in exps)


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ({"tools": ["calculator"]}, {"apply_chat_template": False}, r"^tool_call needs model\.apply_chat_template: true"),
        ({"tools": ["calculator"]}, {"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"},
         r"^the chat template does not declare tools to the model"),
        ({"tools": ["abacus"]}, {}, r"^workflow_args\.tools\[0\]: 'abacus' is not one of calculator, python"),
        ({"tools": []}, {}, r"^workflow_args\.tools: list the tools"),
        ({"tools": [f"{__name__}:call"]}, {}, r"^workflow_args\.tools\[0\]: tool '.*:call' is not a Tool subclass"),
        ({"tools": ["calculator"], "max_calls_per_turn": 0}, {}, r"^workflow_args\.max_calls_per_turn must be a positive"),
        ({"tools": ["calculator"], "env": "x"}, {}, r"^workflow_args: unknown key\(s\) env"),
    ],
)  # fmt: skip
def test_bad_tool_setups_are_refused_naming_the_field(
    engine: HFEngine, args: dict[str, Any], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        workflow(engine, args, **kwargs)


def test_sft_on_messages_trains_the_assistant_turns_only(engine: HFEngine) -> None:
    tok = engine.tokenizer
    fmt = PromptFormat(200, True, None, None, [Calculator().schema])
    tool_call = call("calculator", expression="37*46")
    messages = [
        {"role": "user", "content": "What is 37*46?"},
        {"role": "assistant", "content": tool_call},
        {"role": "tool", "content": "1702"},
        {"role": "assistant", "content": "<answer>1702</answer>"},
    ]
    ((prompt, response, mask),) = fmt.encode_sft_messages(tok, messages)  # ChatML appends: one sample
    assert prompt == fmt.encode_prompt(tok, "What is 37*46?")  # what a rollout's prompt is
    runs: list[tuple[int, str]] = []
    for token, m in zip(response, mask, strict=True):
        if not runs or runs[-1][0] != m:
            runs.append((m, ""))
        runs[-1] = (m, runs[-1][1] + tok.decode([token]))
    assert runs == [
        (1, tool_call + "<|im_end|>"),
        (0, "\n<|im_start|>tool\n<tool_response>\n1702\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
        (1, "<answer>1702</answer><|im_end|>"),
    ]
    with pytest.raises(ValueError, match="no assistant turn"):
        fmt.encode_sft_messages(tok, messages[:1])


def test_sft_on_a_thinking_conversation_trains_each_turn_in_the_context_it_is_generated_in() -> None:
    """The thinking template drops the reasoning of the turns before a new user turn: the tool turn
    appends to the first sample (its two replies with their reasoning), the user turn starts a
    second whose prompt is the conversation as rendered now, the last reply trained with its own
    reasoning, as a rollout would see it (workflows/conversation.py)."""
    from rlcore.core.scratch_model import build_bpe_tokenizer

    tok = build_bpe_tokenizer(512, thinking=True)
    fmt = PromptFormat(200, True, None, None, [Calculator().schema])
    messages = [
        {"role": "user", "content": "What is 37*46?"},
        {"role": "assistant", "content": "<think>\nUse the tool.\n</think>\n\n" + call("calculator", expression="37*46")},
        {"role": "tool", "content": "1702"},
        {"role": "assistant", "content": "<think>\nIt says 1702.\n</think>\n\n<answer>1702</answer>"},
        {"role": "user", "content": "And halved?"},
        {"role": "assistant", "content": "<think>\n1702/2\n</think>\n\n<answer>851</answer>"},
    ]  # fmt: skip
    (p1, r1, m1), (p2, r2, m2) = fmt.encode_sft_messages(tok, messages)
    assert p1 == fmt.encode_prompt(tok, "What is 37*46?")
    trained = tok.decode([t for t, m in zip(r1, m1, strict=True) if m])
    assert trained.count("<think>") == 2 and "It says 1702." in trained and 0 in m1
    assert p2 == list(tok(fmt.render(tok, messages[:5], True), add_special_tokens=False)["input_ids"])
    assert "Use the tool." not in tok.decode(p2) and "<answer>1702</answer>" in tok.decode(p2)  # reasoning dropped
    assert m2 == [1] * len(r2) and tok.decode(r2) == "<think>\n1702/2\n</think>\n\n<answer>851</answer><|im_end|>"


def test_a_messages_row_of_the_wrong_shape_names_the_row_and_field(tmp_path: Path) -> None:
    from rlcore.core.config.schema import TasksetConfig
    from rlcore.core.data.taskset import load_tasks
    from rlcore.core.data.taskset_check import TasksetError, check_taskset

    path = tmp_path / "chat.jsonl"
    ts = TasksetConfig(name="chat", path=str(path))
    ts.format.prompt_type = "messages"
    cases = [
        ({"messages": "hi"}, "must be a non-empty list of {\"role\": ..., \"content\": ...} objects; got a str"),
        ({"messages": [{"role": "bot", "content": "hi"}]}, "message 0: role must be one of system, user, assistant, tool; got 'bot'"),
        ({"messages": [{"role": "user", "content": 3}]}, "message 0 (user): content must be text; got int"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "has no assistant turn (SFT trains on the assistant turns)"),
    ]  # fmt: skip
    for row, reason in cases:
        path.write_text(json.dumps({"messages": [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "a"}]}) + "\n" + json.dumps(row) + "\n")
        with pytest.raises(TasksetError) as e:
            check_taskset(ts, "buffer.explorer_input.taskset", needs_answer=False, needs_response=True)
        assert str(e.value) == f"buffer.explorer_input.taskset: {path} row 2: the messages ('messages') {reason}"
    path.write_text(json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "answer": "1"}) + "\n")
    (task,) = load_tasks(ts, "buffer.explorer_input.taskset")
    assert task.prompt == "q" and task.answer == "1" and task.metadata["messages"][1] == {"role": "user", "content": "q"}


def test_a_rows_tools_replace_the_workflows_in_its_prompt_and_calls(engine: HFEngine, tmp_path: Path) -> None:
    from rlcore.core.config.schema import TasksetConfig
    from rlcore.core.data.taskset import load_tasks

    python = PythonTool().schema
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "Print 6*7.", "answer": "42", "tools": [python]}) + "\n" + json.dumps({"prompt": "q", "answer": "1"}) + "\n")
    declared, plain = load_tasks(TasksetConfig(name="t", path=str(path)), "taskset")
    assert declared.metadata["tools"] == [python] and "tools" not in plain.metadata
    wf = workflow(engine, {"tools": ["calculator", "python"]})
    own, default = (engine.tokenizer.decode(wf.encode_prompt(t)) for t in (declared, plain))
    assert '"name": "python"' in own and '"name": "calculator"' not in own
    assert '"name": "calculator"' in default and '"name": "python"' in default
    session = wf.start(declared).env
    outputs = [m["content"] for m in session.step(call("calculator", expression="1+1") + call("python", code="print(6*7)")).messages or []]
    assert outputs == ["error: unknown tool 'calculator'; the tools are python", "42\n"]
    only_declared = ToolSession(declared, build_tools({"tools": ["calculator"]}), 4, declared=["python"])
    assert only_declared.run(("python", {"code": "print(1)"})) == "error: tool 'python' is not available here"
    path.write_text(json.dumps({"prompt": "q", "tools": [{"type": "function"}]}) + "\n")
    with pytest.raises(ValueError, match=r"^taskset: .* row 1: the tools \('tools'\) tool 0 must be"):
        load_tasks(TasksetConfig(name="t", path=str(path)), "taskset")


def test_a_rows_system_prompt_and_a_template_file_reach_the_prompt(engine: HFEngine, tmp_path: Path) -> None:
    from rlcore.core.config.schema import RLCoreConfig, TasksetConfig
    from rlcore.core.data.taskset import load_tasks
    from rlcore.rollout.explorer import workflow_spec

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "q", "system_prompt": "Be brief."}) + "\n" + json.dumps({"prompt": "r"}) + "\n")
    own, default = load_tasks(TasksetConfig(name="t", path=str(path)), "taskset")
    wf = workflow(engine, {"tools": ["calculator"]}, system_prompt="Be kind.")
    assert "Be brief." in engine.tokenizer.decode(wf.encode_prompt(own))
    assert "Be kind." in engine.tokenizer.decode(wf.encode_prompt(default))
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    cfg = RLCoreConfig()
    cfg.model.chat_template_path = str(template)
    assert workflow_spec(cfg, TasksetConfig(name="t", path=str(path))).chat_template == template.read_text()

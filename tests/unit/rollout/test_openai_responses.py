"""The Responses API's requests and responses in chat terms (rollout/openai_responses.py), read back
by the openai SDK's own Response type."""

from __future__ import annotations

from openai.types.responses import Response

from rlcore.rollout.openai_errors import DoorError
from rlcore.rollout.openai_responses import as_responses_error, chat_request, reply_message, response

CHAT = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "tiny", "policy_version": 2,
    "prompt_token_ids": [1, 2, 3], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    "choices": [{"index": 0, "finish_reason": "tool_calls", "token_ids": [7, 8, 9, 10], "logprobs": None,
                 "message": {"role": "assistant", "content": "Let me look.", "tool_calls": [
                     {"id": "call_1", "type": "function", "function": {"name": "price", "arguments": '{"x": "pen"}'}},
                     {"id": "call_2", "type": "function", "function": {"name": "calc", "arguments": '{"x": "3*4"}'}}]}}],
}  # fmt: skip


def test_input_items_become_the_conversation_the_chat_template_renders() -> None:
    earlier = [{"role": "system", "content": "old"}, {"role": "user", "content": "q"}, reply_message(CHAT)]
    body = {
        "model": "tiny", "instructions": "Be brief.", "max_output_tokens": 9, "seed": 4,
        "tools": [{"type": "function", "name": "price", "parameters": {"type": "object"}}],
        "input": [
            {"type": "function_call_output", "call_id": "call_1", "output": "3"},
            {"type": "function_call_output", "call_id": "call_2", "output": "12"},
            {"type": "function_call", "call_id": "call_3", "name": "calc", "arguments": "{}"},
            {"type": "function_call", "call_id": "call_4", "name": "price", "arguments": "{}"},
            {"role": "user", "content": [{"type": "input_text", "text": "so "}, {"type": "input_text", "text": "what?"}]},
        ],
    }  # fmt: skip
    chat = chat_request(body, earlier)
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "user"]
    assert chat["messages"][0]["content"] == "Be brief."  # this request's instructions replace the earlier
    assert [c["id"] for c in chat["messages"][5]["tool_calls"]] == ["call_3", "call_4"]  # calls in a row: one turn
    assert chat["messages"][-1]["content"] == "so what?"
    assert chat["tools"] == [{"type": "function", "function": {"name": "price", "parameters": {"type": "object"}}}]
    assert (chat["max_tokens"], chat["seed"], chat["model"]) == (9, 4, "tiny")


def test_a_reply_with_tool_calls_is_a_message_and_function_call_items() -> None:
    out = Response.model_validate(response({"input": "q", "previous_response_id": "resp_0"}, CHAT))
    assert [item.type for item in out.output] == ["message", "function_call", "function_call"]
    assert out.output_text == "Let me look."
    assert [(i.call_id, i.name, i.arguments) for i in out.output[1:]] == [
        ("call_1", "price", '{"x": "pen"}'), ("call_2", "calc", '{"x": "3*4"}')
    ]
    assert out.status == "completed" and out.previous_response_id == "resp_0"
    assert (out.usage.input_tokens, out.usage.output_tokens) == (3, 4)
    assert out.model_extra["token_ids"] == [7, 8, 9, 10]
    cut = response({"input": "q"}, {**CHAT, "choices": [{**CHAT["choices"][0], "finish_reason": "length"}]})
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_chat_error_names_the_responses_parameter() -> None:
    e = as_responses_error(DoorError(400, "messages[3].content: is required", "messages[3].content"))
    assert (e.param, str(e)) == ("input", "input: is required")
    e = as_responses_error(DoorError(400, "max_tokens: 300 leaves no room", "max_tokens"))
    assert (e.param, str(e)) == ("max_output_tokens", "max_output_tokens: 300 leaves no room")
    same = DoorError(400, "temperature: must be >= 0", "temperature")
    assert as_responses_error(same) is same

"""Tasksets checked before anything starts (`rlcore config validate`, and again by `rlcore launch`):
every row is read, so an unreadable file, a malformed row or a missing or null column is a one-line
error naming the file and the row, not a crash minutes into a run.

Files (jsonl, json, csv, parquet, compressed too) are read with the standard library and pyarrow:
no torch, no `datasets`. A `save_to_disk` folder, a folder of data files and a Hub id are read by
`datasets`, as the run reads them (`rows_of`).

A format key may name a nested field with dots (verl's `reward_model.ground_truth`): `column`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from typing import Any

from ..config.schema import TasksetConfig
from .dataset_files import is_hub_id, load_dataset_of
from .files import describe_formats, file_format, open_text, supported


class TasksetError(ValueError):
    """A taskset that cannot be used; str(e) is one line naming the file and the row."""


MISSING: Any = object()
"""What `column` gives for a field a row does not have."""


def column(row: dict[str, Any], key: str) -> Any:
    """`row[key]`, or for a dotted key the field nested under its parts (`reward_model.ground_truth`
    is row["reward_model"]["ground_truth"]); MISSING when the row has neither."""
    if key in row:
        return row[key]
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool): what a column of margins or difficulties holds."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def own_columns(fmt: Any) -> tuple[str, ...]:
    """The columns a taskset's format (FormatConfig) takes for the task itself: its prompt (or
    messages), answer, response, tools and system prompt; the others become the task's metadata."""
    first = (fmt.messages_key,) if fmt.prompt_type == "messages" else (fmt.prompt_key, fmt.response_key)
    return (*first, fmt.answer_key, fmt.tools_key, fmt.system_prompt_key)


def value_of(row: dict[str, Any], key: str) -> Any:
    """`column`, None for a missing field (as dict.get)."""
    found = column(row, key)
    return None if found is MISSING else found


def response_text(value: Any) -> str | None:
    """A response column's text: a string as it is, or chat messages' assistant turns joined (a
    conversation's reply); None when it is neither."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        turns = [m.get("content") for m in value if m.get("role") == "assistant"]
        if turns and all(isinstance(t, str) for t in turns):
            return "".join(turns)
    return None


ROLES = ("system", "user", "assistant", "tool")


def messages_problem(value: Any, needs_assistant: bool) -> str | None:
    """What is wrong with a row's chat messages (None when nothing is): a non-empty list of
    {"role": system|user|assistant|tool, "content": text} objects (an assistant turn may carry
    `tool_calls` and null content); `needs_assistant`: SFT trains on the assistant turns."""
    if not isinstance(value, list) or not value:
        got = "an empty list" if isinstance(value, list) else f"a {type(value).__name__}"
        return f'must be a non-empty list of {{"role": ..., "content": ...}} objects; got {got}'
    for j, m in enumerate(value):
        if not isinstance(m, dict):
            return f"message {j} is a {type(m).__name__}, not an object with role and content"
        if m.get("role") not in ROLES:
            return f"message {j}: role must be one of {', '.join(ROLES)}; got {m.get('role')!r}"
        content = m.get("content")
        if not isinstance(content, str) and not (
            content is None and m["role"] == "assistant" and m.get("tool_calls")
        ):
            return f"message {j} ({m['role']}): content must be text; got {type(content).__name__}"
    if needs_assistant and not any(m["role"] == "assistant" for m in value):
        return "has no assistant turn (SFT trains on the assistant turns)"
    return None


def tools_problem(value: Any) -> str | None:
    """What is wrong with a row's tools (None when nothing is): a list of OpenAI function schemas."""
    if not isinstance(value, list):
        return f'must be a list of {{"type": "function", "function": {{"name": ...}}}} objects; got a {type(value).__name__}'
    for j, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            return f'tool {j} must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}'
    return None


def check_taskset(
    ts: TasksetConfig, key: str, needs_answer: bool, needs_response: bool, needs_pair: bool = False,
    numbers: tuple[tuple[str, str], ...] = (),
) -> int:  # fmt: skip
    """Read every row of the taskset file `ts.path`; returns how many rows it has. `key` is the
    config path of the taskset (for messages); `needs_answer` / `needs_response` / `needs_pair`: the
    rewards compare with an answer / the stage trains on reference responses (SFT) / on preference
    pairs (DPO: chosen and rejected, text or chat messages); `numbers`: (column, the config key that
    names it) of columns every row must hold a number in (a reward model's pair margins, a
    curriculum's difficulty)."""
    path, fmt = ts.path, ts.format
    messages = fmt.prompt_type == "messages"
    required = [("messages", fmt.messages_key)] if messages else [("prompt", fmt.prompt_key)]
    required += [("answer", fmt.answer_key)] if needs_answer else []
    required += [("response", fmt.response_key)] if needs_response and not messages else []
    required += [("chosen", fmt.chosen_key), ("rejected", fmt.rejected_key)] if needs_pair else []
    count = 0
    for number, row in rows_of(ts, key):
        if not isinstance(row, dict):
            raise TasksetError(
                f"{key}: {path} row {number} is a {type(row).__name__}, not an object with columns"
            )
        for what, name in required:
            value = column(row, name)
            if value is MISSING:
                raise TasksetError(
                    f"{key}: {path} row {number} has no '{name}' column (the {what}; "
                    f"{key}.format.{what}_key names it); columns: {', '.join(map(str, row)) or 'none'}"
                )
            if value is None or (what == "prompt" and str(value).strip() == ""):
                raise TasksetError(
                    f"{key}: {path} row {number}: the {what} ('{name}') is {'null' if value is None else 'empty'}"
                )
            problem = messages_problem(value, needs_response) if what == "messages" else None
            if problem is not None:
                raise TasksetError(f"{key}: {path} row {number}: the messages ('{name}') {problem}")
            if what in ("chosen", "rejected") and response_text(value) is None:
                raise TasksetError(
                    f"{key}: {path} row {number}: the {what} ('{name}') is a {type(value).__name__}, neither "
                    'text nor chat messages with an assistant turn ([{"role": "assistant", "content": ...}])'
                )
        for name, config_key in numbers:
            value = row.get(name, MISSING)  # a column of its own
            if not is_number(value):
                raise TasksetError(
                    f"{config_key}: {path} row {number} has no number in column '{name}' "
                    f"(got {'nothing' if value is MISSING else repr(value)}); give every row one, or unset the key"
                )
        tools = row.get(fmt.tools_key)
        problem = None if tools is None else tools_problem(tools)
        if problem is not None:
            raise TasksetError(f"{key}: {path} row {number}: the tools ('{fmt.tools_key}') {problem}")
        count += 1
    if count == 0:
        raise TasksetError(f"{key}.path: {path} has no rows")
    return count


def rows_of(ts: TasksetConfig, key: str) -> Iterator[tuple[int, Any]]:
    """(row number from 1, row) of the taskset `ts`: its file, or, for a folder or a Hub id, the
    split `datasets` loads for the run (a Hub id that cannot be read from here, offline say, is a
    TasksetError saying so: the run could not read it either)."""
    import os

    if not os.path.isdir(ts.path) and not is_hub_id(ts.path):
        yield from _rows(ts.path, key)
        return
    try:
        ds = load_dataset_of(ts, key)
    except ValueError as e:
        raise TasksetError(str(e)) from None
    except Exception as e:  # datasets' own errors: a folder it cannot read
        raise TasksetError(f"{key}.path: cannot read {ts.path}: {type(e).__name__}: {e}") from None
    yield from enumerate(ds, start=1)


def _rows(path: str, key: str) -> Iterator[tuple[int, Any]]:
    """(row number from 1, row) of a taskset file."""
    ext = file_format(path)[0]
    try:
        if not supported(path):
            raise TasksetError(
                f"{key}.path: unsupported file type of {path}; use one of {describe_formats()}"
            )
        if ext == ".parquet":
            import pyarrow.parquet as pq

            yield from enumerate(pq.read_table(path).to_pylist(), start=1)
        elif ext == ".csv":
            with open_text(path, newline="") as f:
                for i, row in enumerate(csv.DictReader(f), start=1):
                    yield i, {k: (None if v == "" else v) for k, v in row.items()}
        else:
            yield from _json_rows(path, key, array_allowed=ext == ".json")
    except OSError as e:
        raise TasksetError(f"{key}.path: cannot read {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise TasksetError(f"{key}.path: cannot read {path}: {e}") from None
    except Exception as e:  # pyarrow's ArrowInvalid for a file that is not parquet
        if isinstance(e, TasksetError):
            raise
        raise TasksetError(f"{key}.path: cannot read {path}: {type(e).__name__}: {e}") from None


def _json_rows(path: str, key: str, array_allowed: bool) -> Iterator[tuple[int, Any]]:
    """JSON lines (blank lines skipped; row numbers are line numbers), or in a .json file also a
    JSON array of objects."""
    with open_text(path) as f:
        head = f.read(1 << 16).lstrip()
        f.seek(0)
        if array_allowed and head.startswith("["):
            try:
                yield from enumerate(json.load(f), start=1)
            except json.JSONDecodeError as e:
                raise TasksetError(f"{key}: {path} is not valid JSON (line {e.lineno}: {e.msg})") from None
            return
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as e:
                raise TasksetError(f"{key}: {path} row {number} is not valid JSON ({e.msg})") from None


def first_row(ts: TasksetConfig, key: str) -> dict[str, Any] | None:
    """The first row of a taskset (None: it has none, or the first is not an object)."""
    for _, row in rows_of(ts, key):
        return row if isinstance(row, dict) else None
    return None

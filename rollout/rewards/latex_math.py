"""The `math` reward: is the response's final answer mathematically equal to the task's?

Hugging Face's math-verify (github.com/huggingface/Math-Verify) parses both sides, LaTeX or plain,
into sympy and compares them, so equivalent forms count: `\\frac{1}{2}`, `0.5` and `1/2`; `\\{1,2\\}`
and `\\{2,1\\}`; `x = 3` and `3`. The answer it reads is the response's `<answer>...</answer>` when
the model wrote one (the quickstart's format), else the last `\\boxed{}` or LaTeX expression of the
response. math-verify bounds its parsing with SIGALRM, which Python allows only on the main thread:
elsewhere (a rollout worker's gRPC thread) it runs without that bound.
"""

from __future__ import annotations

import threading

from ...core.types import Task
from .answer import extract_answer


def math_verify(response: str, task: Task) -> float:
    """1.0 when the answer is equivalent to task.answer under math-verify, else 0.0."""
    from math_verify import parse, verify

    if task.answer is None:
        raise ValueError(f"math needs task.answer; task '{task.task_id}' has none")
    bound = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(_as_latex(task.answer), parsing_timeout=bound)  # type: ignore[arg-type]
    tagged = extract_answer(response)
    pred = parse(response if tagged is None else _as_latex(tagged), parsing_timeout=bound)  # type: ignore[arg-type]
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=bound) else 0.0


def _as_latex(answer: str) -> str:
    """A bare answer (`3/4`, `\\frac{3}{4}`) in math delimiters, so math-verify reads all of it as math."""
    answer = answer.strip()
    if "\\boxed" in answer or answer.startswith(("$", "\\(", "\\[")):
        return answer
    return f"${answer}$"

"""`calculator`: evaluates an arithmetic expression (numbers, + - * / // % **, parentheses)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from .base import Tool, ToolError

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 100
MAX_LENGTH = 200


class Calculator(Tool):
    name = "calculator"
    description = "Evaluate an arithmetic expression."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 37*46"}},
        "required": ["expression"],
    }

    def __call__(self, arguments: dict[str, Any]) -> str:
        expression = self.required_str(arguments, "expression")
        if len(expression) > MAX_LENGTH:
            raise ToolError(f"expression longer than {MAX_LENGTH} characters")
        try:
            tree = ast.parse(expression, mode="eval")
        except SyntaxError:
            raise ToolError(f"not an arithmetic expression: {expression!r}") from None
        value = _evaluate(tree.body)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return str(value)


def _evaluate(node: ast.AST) -> int | float:
    """The expression's value, walking the syntax tree (nothing is executed)."""
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            return _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ToolError(f"only numbers, + - * / // % ** and parentheses are allowed; got {ast.unparse(node)!r}")

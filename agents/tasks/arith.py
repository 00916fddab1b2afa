"""A safe arithmetic evaluator for the `calculator` tool: parses with `ast`, walks only number
literals, + - * / // % ** and parentheses. No names, calls, attributes or `eval`, and bounds on
input length, exponents and magnitudes so a model cannot make the tool hang or eat memory."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e15

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class ExpressionError(ValueError):
    """The expression is not plain arithmetic, or is out of bounds. The message says why."""


def safe_eval(expression: str) -> Number:
    """Evaluate a plain arithmetic expression ("37 * 12 + 5") without `eval`; anything else, or out of
    bounds, raises ExpressionError."""
    if not isinstance(expression, str):
        raise ExpressionError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression too long ({len(expression)} > {MAX_EXPRESSION_CHARS} chars)")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ExpressionError(f"not an arithmetic expression: {expression!r} ({e.msg})") from None
    return _check(_eval(tree.body))


def _eval(node: ast.AST) -> Number:
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, int | float) and not isinstance(value, bool):  # bool is an int subclass
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ExpressionError(f"exponent {right} above the limit {MAX_EXPONENT}")
        try:
            return _check(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ExpressionError("division by zero") from None
        except OverflowError:
            raise ExpressionError(f"overflow in {left} {type(node.op).__name__} {right}") from None
    raise ExpressionError(f"not allowed in an arithmetic expression: {ast.dump(node)[:80]}")


def _check(value: Number) -> Number:
    if isinstance(value, complex):  # (-8) ** 0.5
        raise ExpressionError(f"complex result {value}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError(f"non-finite result {value}")
    if abs(value) > MAX_MAGNITUDE:
        raise ExpressionError(f"result magnitude {abs(value):.3g} above {MAX_MAGNITUDE:.0g}")
    return value


def format_number(value: Number) -> str:
    """How the tool prints a result: integers (and integral floats) without a decimal point."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.10g}"
    return str(value)

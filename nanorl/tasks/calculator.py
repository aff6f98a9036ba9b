"""The calculator task (`--task calculator`): multiplication a small model cannot do in its head (three digits by
two), with a `calculate` tool it can call. The reward is the final number of the episode's last reply; the tool
only helps when the model learns to call it and to copy its result (issue 35).

    task = calculator_task()                       # 200 held out, Task.tools == [calculate]
    calculate("123 * 45")                          # '5535'
"""

from __future__ import annotations

import ast
import random

from nanorl.tasks.rewards import final_number

_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _evaluate(node):
    """An arithmetic expression tree of numbers, + - * / and unary minus -> its value; anything else is refused."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if abs(left) > 1e12 or abs(right) > 1e12:
            raise ValueError("numbers beyond 1e12 are not supported")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    raise ValueError(f"only numbers and + - * / are allowed, not {type(node).__name__}")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers, + - * / and parentheses.

    Args:
        expression: the expression to evaluate, e.g. "123 * 45"
    """
    if len(expression) > 200:
        raise ValueError("the expression is longer than 200 characters")
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)  # parsed, never eval()
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def calculator_task(eval_size: int = 200, seed: int = 0, n_train: int = 20_000):
    """Problems "What is 123 * 45?" (a three-digit by a two-digit number), distinct; the held-out ones drawn first."""
    from nanorl.tasks import Example, Task

    rng, seen = random.Random(seed), {}
    while len(seen) < eval_size + n_train:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        seen.setdefault((a, b), None)
    examples = [
        Example(
            f"What is {a} * {b}? Use the calculate tool, then give the final answer as a number.", {"answer": a * b}
        )
        for a, b in seen
    ]
    return Task(
        "calculator", train=examples[eval_size:], eval=examples[:eval_size], reward=final_number, tools=[calculate]
    )

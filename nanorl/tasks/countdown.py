"""Countdown (as in TinyZero): reach a target with the given numbers, each used once, with + - * /.

    task = countdown_task(count=3, max_number=20)
    countdown_reward("", "<answer>(7 - 2) * 4</answer>", numbers=[2, 4, 7], target=20)   # -> 1.0

Problems are generated from a random expression over the drawn numbers, so every one is solvable;
the held-out split is drawn first. The reward parses the last <answer>...</answer> (else the last
line with an '='-free expression) with Python's `ast`, never `eval`: only numbers, + - * / and
parentheses; every given number used exactly once; the value must equal the target.
"""

from __future__ import annotations

import ast
import random
import re
from fractions import Fraction

_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _value(node, used: list):
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left, used), _value(node.right, used))
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    raise ValueError("only integers, + - * / and parentheses are allowed")


def countdown_reward(prompt, completion: str, numbers: list[int], target: int, **_) -> float:
    tags = _TAG.findall(completion)
    text = tags[-1] if tags else completion.strip().splitlines()[-1] if completion.strip() else ""
    text = text.split("=")[0].strip()
    used: list = []
    try:
        value = _value(ast.parse(text, mode="eval").body, used)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return 0.0
    return float(sorted(used) == sorted(numbers) and value == target)


def countdown_task(count: int = 3, max_number: int = 20, eval_size: int = 200, seed: int = 0, n_train: int = 20_000):
    from nanorl.tasks import Example, Task

    rng = random.Random(seed)
    seen, examples = set(), []
    while len(examples) < eval_size + n_train and len(seen) < 50 * (eval_size + n_train):
        nums = [rng.randint(1, max_number) for _ in range(count)]
        expr = str(nums[0])
        for x in nums[1:]:
            expr = f"({expr} {rng.choice('+-*')} {x})"
        target = eval(expr)  # our own expression of integers and + - *: safe
        key = (tuple(sorted(nums)), target)
        if target <= 0 or key in seen:
            continue
        seen.add(key)
        shown = rng.sample(nums, len(nums))
        prompt = (
            f"Using the numbers {shown}, create an equation that equals {target}. You can use + - * / and "
            f"each number exactly once. Give the equation in <answer> </answer> tags, e.g. "
            f"<answer>(1 + 2) * 3</answer>."
        )
        examples.append(Example(prompt, {"numbers": shown, "target": target}))
    return Task("countdown", train=examples[eval_size:], eval=examples[:eval_size], reward=countdown_reward)

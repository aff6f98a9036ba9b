"""Math answers: pull the final answer out of a completion and compare it with the reference,
equivalence-aware: numbers (fractions, decimals, units, percentages) compared exactly, anything else (LaTeX,
symbols) by the `math-verify` library, which the reward needs (`pip install math-verify`, or nanorl-llm[math]): a run
without it stops at setup, before any model loads, never falling back to comparing strings.

    math_reward("...", "so the total is \\\\boxed{\\\\frac{3}{4}}", answer="0.75")    # -> 1.0
    task = gsm8k_task("gsm8k_test.jsonl")     # a local GSM8K-format file: {question, answer "... #### 42"}

The answer is, in order of preference: the last \\boxed{...}, the text after "####", the last
<answer>...</answer>, else the last number in the completion.
"""

from __future__ import annotations

import importlib.util
import json
import re
from fractions import Fraction
from pathlib import Path

_HASHES = re.compile(r"####\s*([^\n]+)")
_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")
_UNITS = re.compile(
    r"\\(?:text|mathrm)\{[^}]*\}|\$|%|\\%|\b(?:dollars?|cents?|cm|km|kg|g|m|hours?|minutes?|"
    r"units?|degrees?)\b",
    re.I,
)


def last_boxed(text: str) -> str | None:
    """Contents of the last \\boxed{...}, with nested braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extract_answer(text: str) -> str | None:
    for candidate in (last_boxed(text), *(_HASHES.findall(text)[-1:]), *(_TAG.findall(text)[-1:])):
        if candidate is not None and candidate.strip():
            return candidate.strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def to_number(text: str) -> Fraction | None:
    """'1,234.5' / '3/4' / '\\frac{3}{4}' / '$12' / '45%' -> an exact Fraction, or None."""
    t = _UNITS.sub("", text).replace(",", "").replace(" ", "")
    t = re.sub(r"\\[dt]?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", r"\1/\2", t).strip("{}().")
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def math_equal(pred: str, gold: str) -> bool:
    a, b = to_number(pred), to_number(gold)
    if a is not None and b is not None:
        return a == b
    from math_verify import parse, verify  # requires() checked it is installed

    try:
        return bool(verify(parse(f"${gold}$"), parse(f"${pred}$")))
    except Exception:  # math-verify raises on some malformed LaTeX: a wrong answer, not a crash
        return False


def math_reward(prompt, completion: str, answer, **_) -> float:
    """1.0 when the completion's final answer equals `answer` (see module docstring), else 0.0."""
    pred = extract_answer(completion)
    return float(pred is not None and math_equal(pred, str(answer)))


def requires() -> None:
    """What the reward needs besides its fields, checked by Task.check before any model loads."""
    from nanorl.tasks import RewardSetupError

    if importlib.util.find_spec("math_verify") is None:
        raise RewardSetupError(
            "reward 'math' needs math-verify for answers that are not plain numbers: pip install math-verify"
        )


math_reward.requires = requires


def gsm8k_task(path: str | Path, eval_size: int = 200, seed: int = 0):
    """A local GSM8K-format JSONL ({"question", "answer": "reasoning #### 42"}) as a Task."""
    import random

    from nanorl.tasks import Example, Task

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K file not found: {path}")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if "question" not in row or "####" not in str(row.get("answer", "")):
                raise ValueError(f"{path}:{n}: expected 'question' and an 'answer' ending in '#### <number>'")
            rows.append(
                Example(
                    row["question"] + "\nGive the final answer after '####'.",
                    {"answer": row["answer"].split("####")[-1].strip()},
                )
            )
    random.Random(seed).shuffle(rows)
    n_eval = min(eval_size, len(rows) // 2)
    return Task(path.stem, train=rows[n_eval:], eval=rows[:n_eval], reward=math_reward)

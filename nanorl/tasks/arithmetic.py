"""The default task: procedural arithmetic ("What is 23 + 45?"), with a held-out split drawn first."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from nanorl.tasks.rewards import final_number

if TYPE_CHECKING:
    from nanorl.tasks import Task


def arithmetic(
    digits: int = 2, operators: str = "+", eval_size: int = 200, seed: int = 0, max_train: int = 50_000
) -> Task:
    """Procedural arithmetic: "What is 23 + 45?" -> reward 1 if the final number is 68.

    Problems are distinct; the held-out split is drawn first and never appears in training.
    """
    bad = set(operators) - set("+-*")
    if not operators or bad:
        raise ValueError(f"config key 'operators': use characters from '+-*', got {operators!r}")
    if digits < 1:
        raise ValueError(f"config key 'digits': must be >= 1, got {digits}")
    lo, hi = 10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1
    total = (hi - lo + 1) ** 2 * len(operators)
    rng = random.Random(seed)
    if eval_size >= total:
        raise ValueError(f"config key 'eval_size': {eval_size} leaves no training problems (only {total} exist)")
    want = min(total, eval_size + max_train)
    if total <= 4 * want:  # small space: enumerate and shuffle
        problems = [(a, op, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1) for op in operators]
        rng.shuffle(problems)
        problems = problems[:want]
    else:  # large space: rejection-sample distinct problems
        seen: set = set()
        while len(seen) < want:
            seen.add((rng.randint(lo, hi), rng.choice(operators), rng.randint(lo, hi)))
        problems = sorted(seen)
        rng.shuffle(problems)

    from nanorl.tasks import Example, Task

    def make(a, op, b):
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        return Example(f"What is {a} {op} {b}?", {"answer": answer})

    examples = [make(*p) for p in problems]
    return Task("arithmetic", train=examples[eval_size:], eval=examples[:eval_size], reward=final_number)

"""Tasks: data (prompts plus the fields their reward needs) and a reward function.

    task = get_task("arithmetic", digits=2, operators="+", eval_size=200, seed=0)
    task = get_task("my_prompts.jsonl", reward="final_number")
    task = Task("mine", train=[Example("Say hi", {})], eval=[...], reward=my_reward)   # from Python

A prompt is a string (rendered as one user message with the model's chat template) or a list of
chat messages. `reward(prompt, completion, **fields) -> float` gets the example's fields as keywords.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from nanorl.rewards import REWARDS, final_number


@dataclass
class Example:
    prompt: str | list[dict]
    fields: dict = field(default_factory=dict)


@dataclass
class Task:
    name: str
    train: list[Example]
    eval: list[Example]
    reward: Callable[..., float]

    def __post_init__(self):
        if not self.train:
            raise ValueError(f"task '{self.name}': the training split is empty")

    def score(self, examples: list[Example], completions: list[str]) -> list[float]:
        """Rewards of completions[i] for examples[i]. A reward with a `.batch(prompts, completions,
        fields)` attribute (e.g. the code sandbox) scores them all at once, in parallel."""
        batch = getattr(self.reward, "batch", None)
        if batch is not None:
            return [float(r) for r in batch([e.prompt for e in examples], completions, [e.fields for e in examples])]
        out = []
        for ex, completion in zip(examples, completions):
            try:
                out.append(float(self.reward(ex.prompt, completion, **ex.fields)))
            except Exception as e:  # name the input that broke the user's reward
                raise RuntimeError(f"reward of task '{self.name}' failed on prompt {ex.prompt!r} "
                                   f"with completion {completion!r}: {e!r}") from e
        return out


def arithmetic(digits: int = 2, operators: str = "+", eval_size: int = 200, seed: int = 0,
               max_train: int = 50_000) -> Task:
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

    def make(a, op, b):
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        return Example(f"What is {a} {op} {b}?", {"answer": answer})

    examples = [make(*p) for p in problems]
    return Task("arithmetic", train=examples[eval_size:], eval=examples[:eval_size], reward=final_number)


def jsonl_task(path: str | Path, reward: str = "final_number", eval_size: int = 200, seed: int = 0,
               prompt_field: str = "prompt") -> Task:
    """Rows of {"prompt": str or messages, <fields for the reward>...}; after a seeded shuffle the first
    eval_size rows (at most half the file) are held out and never trained on."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")
    if reward not in REWARDS:
        raise ValueError(f"config key 'reward': expected one of {sorted(REWARDS)}, got {reward!r}")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None
        if prompt_field not in row:
            raise ValueError(f"{path}:{n}: missing field '{prompt_field}'")
        rows.append(Example(row.pop(prompt_field), row))
    if len(rows) < 2:
        raise ValueError(f"{path}: needs at least 2 rows (train and eval), found {len(rows)}")
    random.Random(seed).shuffle(rows)
    n_eval = min(eval_size, len(rows) // 2)
    return Task(path.stem, train=rows[n_eval:], eval=rows[:n_eval], reward=REWARDS[reward])


def get_task(name: str, *, reward: str = "final_number", digits: int = 2, operators: str = "+",
             eval_size: int = 200, seed: int = 0) -> Task:
    if name == "arithmetic":
        return arithmetic(digits=digits, operators=operators, eval_size=eval_size, seed=seed)
    if name == "code":
        from nanorl.tasks.code import code_task

        return code_task(eval_size=min(eval_size, 10), seed=seed)
    if name.endswith(".jsonl"):
        return jsonl_task(name, reward=reward, eval_size=eval_size, seed=seed)
    raise ValueError(f"config key 'task': unknown task {name!r} (use 'arithmetic', 'code' or a .jsonl file)")

"""Tasks: data (prompts plus the fields their reward needs) and a reward function.

    task = get_task("arithmetic", digits=2, operators="+", eval_size=200, seed=0)
    task = get_task("countdown") / get_task("code") / get_task("sql")     # built-in verifiable tasks
    task = get_task("rows.csv", reward="math=1,answer_tag=0.2", prompt_field="question")
    task = task_from_config(cfg)                                          # the task keys of a config
    task = Task("mine", train=[Example("Say hi", {})], eval=[...], reward=my_reward)   # from Python

A prompt is a string (rendered as one user message with the model's chat template) or a list of
chat messages. `reward(prompt, completion, **fields) -> float` gets the example's fields as keywords.
A reward spec is comma-separated `name=weight` items; a name is a built-in reward (REWARDS), a
`module:function`, or a `path/to/file.py:function`. Each part is logged as `reward/<name>_mean`.
Built-in tasks live beside this file (arithmetic.py, countdown.py, code.py, sql.py, math_answer.py); data files
(.jsonl, .csv, .parquet, or a folder saved by `datasets.Dataset.save_to_disk`) are read by files.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass
class Example:
    prompt: str | list[dict]
    fields: dict = field(default_factory=dict)


@dataclass
class Task:
    name: str
    train: list[Example]
    eval: list[Example]
    reward: Callable[..., float]  # one reward, or a list of (name, reward, weight) parts
    on_error: str = "raise"  # a reward that raises: "raise" (stop, naming the input) or "zero" (score 0, count it)

    def __post_init__(self):
        if not self.train:
            raise ValueError(f"task '{self.name}': the training split is empty")

    def parts(self) -> list[tuple[str, Callable, float]]:
        return self.reward if isinstance(self.reward, list) else [("task", self.reward, 1.0)]

    def score_parts(self, examples: list[Example], completions: list[str]):
        """-> ({part name: rewards}, weighted total rewards, number of reward errors).
        A reward with a `.batch(prompts, completions, fields)` attribute (e.g. the code sandbox)
        scores all completions at once, in parallel."""
        parts, errors = {}, 0
        for name, fn, _ in self.parts():
            batch = getattr(fn, "batch", None)
            scored = batch([e.prompt for e in examples], completions, [e.fields for e in examples]) if batch else None
            values = []
            for i, (ex, completion) in enumerate(zip(examples, completions)):
                try:  # a reward must be a finite number: NaN or inf would reach every weight through the update
                    value = float(scored[i] if batch else fn(ex.prompt, completion, **ex.fields))
                    if not math.isfinite(value):
                        raise ValueError(f"the reward is {value}, not a finite number")
                    values.append(value)
                except Exception as e:
                    if self.on_error != "zero":  # name the input that broke the reward
                        raise RuntimeError(f"reward '{name}' of task '{self.name}' failed on prompt {ex.prompt!r} "
                                           f"with completion {completion!r}: {e!r}") from e
                    values.append(0.0)
                    errors += 1
            parts[name] = values
        total = [sum(w * parts[n][i] for n, _, w in self.parts()) for i in range(len(completions))]
        return parts, total, errors

    def score(self, examples: list[Example], completions: list[str]) -> list[float]:
        return self.score_parts(examples, completions)[1]


def _builtin_rewards() -> dict:
    from nanorl.rewards import REWARDS
    from nanorl.tasks.code import code_reward
    from nanorl.tasks.countdown import countdown_reward
    from nanorl.tasks.math_answer import math_reward
    from nanorl.tasks.sql import sql_reward

    return {**REWARDS, "math": math_reward, "code": code_reward, "sql": sql_reward, "countdown": countdown_reward}


def load_reward(name: str) -> Callable:
    """A built-in reward by name, a `module:function`, or a `path/to/file.py:function`."""
    import importlib
    import importlib.util

    builtin = _builtin_rewards()
    if name in builtin:
        return builtin[name]
    if ":" not in name:
        raise ValueError(f"config key 'reward': unknown reward {name!r} (built-in: {', '.join(builtin)}; "
                         f"or module:function, or file.py:function)")
    where, fn_name = name.rsplit(":", 1)
    if where.endswith(".py"):
        if not Path(where).is_file():
            raise FileNotFoundError(f"reward file not found: {where}")
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"config key 'reward': {where} has no function {fn_name!r}")
    return fn


def parse_reward_spec(spec: str) -> list[tuple[str, Callable, float]]:
    """'math=1,answer_tag=0.2' -> [("math", math_reward, 1.0), ("answer_tag", answer_tag, 0.2)]."""
    parts = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        name, _, weight = item.partition("=")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"config key 'reward': weight of {name!r} must be a number, got {weight!r}") from None
        parts.append((name.split(":")[-1] if ":" in name else name, load_reward(name), w))
    if not parts:
        raise ValueError("config key 'reward': empty reward spec")
    return parts


def get_task(name: str, *, reward: str = "", digits: int = 2, operators: str = "+", eval_size: int = 200,
             seed: int = 0, prompt_field: str = "prompt", answer_field: str = "answer", on_error: str = "raise") -> Task:
    """A built-in task or a data file; a non-empty `reward` spec replaces the task's own reward."""
    if name == "arithmetic":
        from nanorl.tasks.arithmetic import arithmetic

        task = arithmetic(digits=digits, operators=operators, eval_size=eval_size, seed=seed)
    elif name == "countdown":
        from nanorl.tasks.countdown import countdown_task

        task = countdown_task(eval_size=eval_size, seed=seed)
    elif name in ("code", "sql"):  # small hand-written sets: 10 problems held out
        from nanorl.tasks.code import code_task
        from nanorl.tasks.sql import sql_task

        task = (code_task if name == "code" else sql_task)(eval_size=min(eval_size, 10), seed=seed)
    elif name.startswith("gsm8k:"):
        from nanorl.tasks.math_answer import gsm8k_task

        task = gsm8k_task(name[len("gsm8k:"):], eval_size=eval_size, seed=seed)
    elif Path(name).suffix in (".jsonl", ".csv", ".parquet") or Path(name).is_dir():
        from nanorl.tasks.files import file_task

        task = file_task(name, reward=reward or "final_number", eval_size=eval_size, seed=seed,
                         prompt_field=prompt_field, answer_field=answer_field)
    else:
        raise ValueError(f"config key 'task': unknown task {name!r} (use arithmetic, countdown, code, sql, "
                         f"gsm8k:FILE.jsonl, or a .jsonl / .csv / .parquet file or dataset folder)")
    if reward:
        task.reward = parse_reward_spec(reward)
    task.on_error = on_error
    return task


def task_from_config(cfg) -> Task:
    """The task a config names (config.TaskConfig's fields: the one place they are read)."""
    return get_task(cfg.task, reward=cfg.reward, digits=cfg.digits, operators=cfg.operators, eval_size=cfg.eval_size,
                    prompt_field=cfg.prompt_field, answer_field=cfg.answer_field, on_error=cfg.reward_errors)

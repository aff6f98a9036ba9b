"""The catalog: nanorl's built-in tasks and rewards by name (tasks.get_task and the reward spec look them up here).

    task = builtin_task("arithmetic", digits=2)       # or countdown, code, sql, gsm8k:FILE, a data file or a Dataset
    builtin_rewards()["math"]                         # rewards a spec can name: 'math=1,answer_tag=0.2'
"""

from __future__ import annotations

from pathlib import Path

from nanorl.config import ConfigError


def builtin_rewards() -> dict:
    from nanorl.tasks.rewards import REWARDS
    from nanorl.tasks.code import code_reward
    from nanorl.tasks.countdown import countdown_reward
    from nanorl.tasks.math_answer import math_reward
    from nanorl.tasks.sql import sql_reward

    return {**REWARDS, "math": math_reward, "code": code_reward, "sql": sql_reward, "countdown": countdown_reward}


def builtin_task(name, digits: int = 2, operators: str = "+", eval_size: int = 200, seed: int = 0,
                 prompt_field: str = "prompt", answer_field: str = "answer"):
    """A built-in task by name, or a task from data: a file, a folder, a hub id, or a datasets.Dataset."""
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
    elif isinstance(name, str) and name.startswith("gsm8k:"):
        from nanorl.tasks.math_answer import gsm8k_task

        task = gsm8k_task(name[len("gsm8k:"):], eval_size=eval_size, seed=seed)
    elif not isinstance(name, str) or "/" in name or Path(name).suffix or Path(name).exists():
        from nanorl.tasks.files import file_task  # a data file or folder, a hub id, a datasets.Dataset

        task = file_task(name, reward="final_number", eval_size=eval_size, seed=seed,
                         prompt_field=prompt_field, answer_field=answer_field)
    else:
        raise ConfigError(f"config key 'task': unknown task {name!r} (use arithmetic, countdown, code, sql, "
                          f"gsm8k:FILE.jsonl, a data file (.jsonl, .json, .csv, .parquet), a dataset folder or hub id)")
    return task

"""The catalog: nanorl's built-in tasks and rewards by name (tasks.get_task and the reward spec look them up here),
and the user's own reward functions, imported from a `module:function` or a `path/to/file.py:function`.

    task = builtin_task("arithmetic", digits=2)       # or countdown, code, sql, gsm8k:FILE, a data file or a Dataset
    builtin_rewards()["math"]                         # rewards a spec can name: 'math=1,answer_tag=0.2'
    load_reward("my_rewards.py:digits")               # a built-in name, module:function or file.py:function
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from nanorl.errors import ConfigError


def builtin_rewards() -> dict:
    from nanorl.tasks.code import code_reward
    from nanorl.tasks.countdown import countdown_reward
    from nanorl.tasks.math_answer import math_reward
    from nanorl.tasks.rewards import REWARDS
    from nanorl.tasks.sql import sql_reward

    return {**REWARDS, "math": math_reward, "code": code_reward, "sql": sql_reward, "countdown": countdown_reward}


def builtin_task(name, digits=2, operators="+", eval_size=200, eval_data="", seed=0, template="auto", **fields):
    """A built-in task by name, or a task from data: a file, a folder, a hub id, or a datasets.Dataset (its prompts
    read as apply_chat_template `template` says: files.plain_prompt; `fields`: prompt_field, answer_field)."""
    data = not isinstance(name, str) or "/" in name or Path(name).suffix or Path(name).exists()
    if eval_data and not data:
        raise ConfigError(f"config key 'eval_data': held-out rows from a file are for a task from data, not {name!r}")
    if name == "arithmetic":
        from nanorl.tasks.arithmetic import arithmetic

        task = arithmetic(digits=digits, operators=operators, eval_size=eval_size, seed=seed)
    elif name == "countdown":
        from nanorl.tasks.countdown import countdown_task

        task = countdown_task(eval_size=eval_size, seed=seed)
    elif name == "calculator":  # with a tool (agents/)
        from nanorl.tasks.calculator import calculator_task

        task = calculator_task(eval_size=eval_size, seed=seed)
    elif name == "guess":  # a multi-turn environment (agents/)
        from nanorl.tasks.guess import guess_task

        task = guess_task(eval_size=eval_size, seed=seed)
    elif name in ("code", "sql"):  # small hand-written sets: 10 problems held out
        from nanorl.tasks.code import code_task
        from nanorl.tasks.sql import sql_task

        task = (code_task if name == "code" else sql_task)(eval_size=min(eval_size, 10), seed=seed)
    elif isinstance(name, str) and name.startswith("gsm8k:"):
        from nanorl.tasks.math_answer import gsm8k_task

        task = gsm8k_task(name[len("gsm8k:") :], eval_size=eval_size, seed=seed)
    elif data:
        from nanorl.tasks.files import file_task  # a data file or folder, a hub id, a datasets.Dataset

        task = file_task(name, "final_number", eval_size, seed, eval_data=eval_data, template=template, **fields)
    else:
        raise ConfigError(
            f"config key 'task': unknown task {name!r} (use arithmetic, countdown, calculator, guess, code, sql, "
            f"gsm8k:FILE.jsonl, a data file (.jsonl, .json, .csv, .parquet), a dataset folder or hub id)"
        )
    return task


def load_reward(name: str) -> Callable:
    """A built-in reward by name, a `module:function`, or a `path/to/file.py:function`."""

    builtin = builtin_rewards()
    if name in builtin:
        return builtin[name]
    if ":" not in name:
        raise ConfigError(
            f"config key 'reward': unknown reward {name!r} (built-in: {', '.join(builtin)}; "
            f"or module:function, or file.py:function)"
        )
    return load_object(name, "reward")


def load_object(name: str, key: str):
    """A callable (a function or a class) named `module:name` or `path/to/file.py:name`, for config key `key`."""
    import importlib.util  # binds importlib too

    if ":" not in name:
        raise ConfigError(f"config key '{key}': {name!r} is not module:name or file.py:name")
    where, fn_name = name.rsplit(":", 1)
    if where.endswith(".py"):
        if not Path(where).is_file():
            raise FileNotFoundError(f"{key} file not found: {where}")
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(Path(where).resolve().parent))  # its helper modules beside it, as `python file.py`
        sys.modules.setdefault(spec.name, module)  # importable by name (pickling, multiprocessing)
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise ConfigError(f"config key '{key}': {where} failed to load: {type(e).__name__}: {e}") from None
    else:
        try:  # from the working directory too, as `python -m` would
            if str(Path.cwd()) not in sys.path:
                sys.path.append(str(Path.cwd()))
            module = importlib.import_module(where)
        except ImportError as e:
            raise ConfigError(f"config key '{key}': cannot import {where!r}: {e}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ConfigError(f"config key '{key}': {where} has no function {fn_name!r}")
    return fn

"""Code rewards: run the completion's program against the task's tests in the sandbox.

    code_reward(prompt, "```python\\ndef add(a, b):\\n    return a + b\\n```", tests=[{"call": "add(1, 2)", "expected": "3"}])
    task = code_task()                     # the built-in set: 40 small functions written for nanorl

Tests are either {"call": "f(1, 2)", "expected": "3"} (a Python expression and the literal it must
equal, compared strictly: same built-in types all the way down, so an object whose __eq__ always
says True gains nothing) or {"assert": "f(1) == 2"} statements. The harness runs the solution in its
own namespace, every test in try/except, and prints a per-run secret (from the environment, removed
before the solution runs) with the pass count; output without the secret scores 0. Reward: the
fraction of tests passed, or 1/0 with all_or_nothing.
"""

from __future__ import annotations

import json
import re

from nanorl.tasks.sandbox import Limits, run_many

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", re.S)

HARNESS = """
import json as _json, os as _os
_nonce = _os.environ.pop("NANORL_NONCE", "")
_tests = _json.loads({tests!r})
_ns = {{"__name__": "solution"}}
_SCALARS = (int, float, str, bool, type(None), bytes, complex)

def _same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return len(a) == len(b) and all(k in b and _same(v, b[k]) for k, v in a.items())
    if isinstance(a, (set, frozenset)):
        return all(type(x) in _SCALARS for x in a) and a == b
    return type(a) in _SCALARS and a == b

_passed = 0
try:
    exec(compile({solution!r}, "solution.py", "exec"), _ns)
    for _t in _tests:
        try:
            if "assert" in _t:
                exec("assert " + _t["assert"], _ns)
                _passed += 1
            elif _same(eval(_t["call"], _ns), eval(_t["expected"], {{}})):
                _passed += 1
        except BaseException:
            pass
except BaseException:
    pass
print("\\n" + _nonce, _passed, len(_tests), flush=True)
"""


def extract_code(completion: str) -> str:
    """The first fenced code block (an unclosed fence runs to the end), else the whole completion."""
    m = _FENCE.search(completion)
    return m.group(1) if m else completion


def passed_fraction(result, n_tests: int) -> float:
    """Pass count from the harness line that carries this run's secret; 0 if it never printed it."""
    for line in reversed(result.stdout.splitlines()):
        parts = line.split()
        if len(parts) == 3 and parts[0] == result.nonce and parts[2] == str(n_tests):
            return int(parts[1]) / max(n_tests, 1)
    return 0.0


def score_programs(completions: list[str], tests: list[list[dict]], all_or_nothing: bool = False,
                   limits: Limits | None = None) -> list[float]:
    programs = [HARNESS.format(tests=json.dumps(t), solution=extract_code(c)) for c, t in zip(completions, tests)]
    fractions = [passed_fraction(r, len(t)) for r, t in zip(run_many(programs, limits), tests)]
    return [float(f == 1.0) if all_or_nothing else f for f in fractions]


def code_reward(prompt, completion: str, tests: list[dict], all_or_nothing: bool = False, **_) -> float:
    """One completion; `code_reward.batch` scores many in parallel (the trainer uses it)."""
    return score_programs([completion], [tests], all_or_nothing)[0]


def _batch(prompts, completions, fields: list[dict], *_, **__) -> list[float]:
    aon = [bool(f.get("all_or_nothing", False)) for f in fields]
    fractions = score_programs(completions, [f["tests"] for f in fields])
    return [float(x == 1.0) if a else x for x, a in zip(fractions, aon)]


code_reward.batch = _batch


def code_task(eval_size: int = 10, seed: int = 0, path=None):
    """The built-in set (nanorl/tasks/data/code_tasks.jsonl): 40 small Python functions, each with a
    prompt, 3-5 strict tests and a reference solution; `eval_size` of them are held out."""
    import random
    from pathlib import Path

    from nanorl.tasks import Example, Task

    path = Path(path or Path(__file__).with_name("data") / "code_tasks.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    random.Random(seed).shuffle(rows)
    if not 0 < eval_size < len(rows):
        raise ValueError(f"config key 'eval_size': the code task has {len(rows)} problems; hold out 1..{len(rows) - 1}")
    examples = [Example(r["prompt"], {"tests": r["tests"]}) for r in rows]
    return Task("code", train=examples[eval_size:], eval=examples[:eval_size], reward=code_reward)

"""Code rewards: run the completion's program in the sandbox, then judge what it returned outside it.

    code_reward(prompt, "```python\\ndef add(a, b):\\n    return a + b\\n```",
                tests=[{"call": "add(1, 2)", "expected": "3"}])
    task = code_task()                     # the built-in set: 40 small functions written for nanorl

Tests are either {"call": "f(1, 2)", "expected": "3"} (a Python expression and the literal it must
equal) or {"assert": "f(1) == 2"} statements. The expected answers never enter the sandbox. What
runs there is the solution plus RUNNER, which evaluates only each test's expressions (a call; the
non-literal sides of an assert's comparisons; comparisons, `and`, `or` and `not` are left to the judge) and writes
each value to file descriptor 3 as plain data: one JSON line per expression, tagged with its
built-in type (["i", "3"], ["l", [...]], ...; anything else is ["?", type name]). The trainer parses
that defensively (`parse_values`, `decode`: size, depth and type checks) and compares it itself: a
call strictly (same built-in types all the way down, so an object whose `__eq__` always says True
gains nothing), an assert with Python's operators on the plain values. The program can patch
anything in its own interpreter or write lines of its own, but it never sees what it is compared
against: a forged value is only a guess, and a second line for one expression voids the whole run.
Every comparison is made here, also one with no literal side (`f(1) == g(1)`: both sides come out as plain
data). What the sandbox evaluates still runs in the program's interpreter, where it may have replaced a builtin
(`sorted`, `abs`) that an expression calls besides the solution: write the expected side as a literal.
Reward: the fraction of tests passed, in [0, 1], or 1/0 with all_or_nothing. Output that does not
parse scores 0 and is flagged: `code_reward.batch` returns tasks.Scores with per-sample flags "failed" (the
program did not exit 0 within its limits) and "malformed", logged each step as reward/<part>_failed_mean and
reward/<part>_malformed_mean (reward/task_... for the code task's own reward); nothing the program does raises.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re

from nanorl.tasks.sandbox import Limits, SandboxError, run_many

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", re.S)
MAX_DEPTH, MAX_NODES = 64, 100_000  # of one decoded value

RUNNER = """
import json as _json, os as _os
_exprs = {exprs!r}
_out = _os.fdopen(3, "w")
_SCALARS = {{int: "i", float: "f", str: "s", bool: "b", type(None): "n", bytes: "y", complex: "c"}}
_NESTED = {{list: "l", tuple: "t", set: "S", frozenset: "F"}}

def _encode(v):
    kind = type(v)
    if kind in (int, float, complex):
        return [_SCALARS[kind], repr(v)]
    if kind in (str, bool, type(None)):
        return [_SCALARS[kind], v]
    if kind is bytes:
        return ["y", v.hex()]
    if kind in _NESTED:
        return [_NESTED[kind], [_encode(x) for x in v]]
    if kind is dict:
        return ["d", [[_encode(k), _encode(x)] for k, x in v.items()]]
    return ["?", kind.__name__]

_ns = {{"__name__": "__main__"}}
try:
    exec(compile({solution!r}, "solution.py", "exec"), _ns)
except BaseException:
    pass
for _i, _e in enumerate(_exprs):
    try:
        _line = _json.dumps([_i, _encode(eval(_e, _ns))])
    except BaseException:
        _line = _json.dumps([_i, ["!"]])
    _out.write(_line + "\\n")
    _out.flush()
"""


# --- tests -> (expressions for the sandbox, checks for the judge) ---

_CONSTRUCTORS = {"frozenset": frozenset, "float": float}  # frozenset({1}), float("inf"): literals in all but name


def _literal(node: ast.expr):
    """(True, value) where `node` is a Python literal (or frozenset/float of one), else (False, None)."""
    try:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _CONSTRUCTORS
            and len(node.args) == 1
            and not node.keywords
        ):
            return True, _CONSTRUCTORS[node.func.id](ast.literal_eval(node.args[0]))
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


_OPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


def plan_assert(node: ast.expr, exprs: list[str]) -> tuple:
    """An assert's test -> a check, appending what the sandbox must evaluate to `exprs`: `and`, `or`, `not` and
    every comparison are applied by the judge; a comparison sends only its non-literal sides in."""
    if isinstance(node, ast.BoolOp):
        return ("all" if isinstance(node.op, ast.And) else "any", [plan_assert(v, exprs) for v in node.values])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return ("not", plan_assert(node.operand, exprs))
    if isinstance(node, ast.Compare) and all(type(op) in _OPS for op in node.ops):
        sides = []
        for x in [node.left, *node.comparators]:  # each side a value: a literal here, or the sandbox's plain data
            ok, value = _literal(x)
            if not ok:
                exprs.append(ast.unparse(x))
            sides.append(("value", value) if ok else ("expr", len(exprs) - 1))
        return ("compare", [_OPS[type(op)] for op in node.ops], sides)
    exprs.append(ast.unparse(node))  # anything else (`f(1)`, `is_even(f(2))`) is judged by the truth of its value
    return ("truth", len(exprs) - 1)


def plan_test(test: dict, exprs: list[str]) -> tuple:
    """One test -> a check for `passes`, appending the expressions the sandbox must evaluate to `exprs`."""
    if "call" in test and "expected" in test:
        ok, expected = _literal(ast.parse(str(test["expected"]), mode="eval").body)
        if not ok:
            raise ValueError(f"code test {test!r}: 'expected' must be a Python literal (e.g. \"[1, 2]\")")
        exprs.append(str(test["call"]))
        return ("strict", len(exprs) - 1, expected)
    if "assert" not in test:
        raise ValueError(f"code test {test!r}: needs 'call' and 'expected', or 'assert'")
    statement = ast.parse("assert " + str(test["assert"])).body[0]  # `f(1) == 2, "message"` too
    return plan_assert(statement.test, exprs)


def plan(tests: list[dict]) -> tuple[list[str], list[tuple]]:
    exprs = []
    return exprs, [plan_test(t, exprs) for t in tests]


# --- the sandbox's output -> values ---


class Malformed(ValueError):
    """The program's output is not what the runner writes."""


class Raised:
    """An expression that raised (or returned something that is not plain data): equal to nothing."""


_SCALARS = {"i": int, "f": float, "c": complex}
_NESTED = {"l": list, "t": tuple, "S": set, "F": frozenset}


def decode(x, depth: int = 0, budget: list | None = None):
    """A tagged value -> the Python value; Malformed for anything else."""
    budget = budget if budget is not None else [MAX_NODES]
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0 or not isinstance(x, list) or not x or not isinstance(x[0], str):
        raise Malformed("not a tagged value")
    tag, rest = x[0], x[1:]
    try:
        if tag in ("!", "?"):
            return Raised
        if tag in _SCALARS and len(rest) == 1 and isinstance(rest[0], str) and len(rest[0]) < 5000:
            if tag == "i" and not re.fullmatch(r"-?[0-9]+", rest[0]):
                raise Malformed("not an int")
            return _SCALARS[tag](rest[0])
        if tag == "s" and len(rest) == 1 and isinstance(rest[0], str):
            return rest[0]
        if tag == "b" and len(rest) == 1 and isinstance(rest[0], bool):
            return rest[0]
        if tag == "n" and len(rest) == 1 and rest[0] is None:
            return None
        if tag == "y" and len(rest) == 1 and isinstance(rest[0], str):
            return bytes.fromhex(rest[0])
        if tag in _NESTED and len(rest) == 1 and isinstance(rest[0], list):
            return _NESTED[tag](decode(v, depth + 1, budget) for v in rest[0])
        if tag == "d" and len(rest) == 1 and isinstance(rest[0], list):
            pairs = [p for p in rest[0] if isinstance(p, list) and len(p) == 2]
            if len(pairs) != len(rest[0]):
                raise Malformed("not a pair")
            return {decode(k, depth + 1, budget): decode(v, depth + 1, budget) for k, v in pairs}
    except (TypeError, ValueError, OverflowError) as e:  # unhashable keys, bad numbers, bad hex
        if isinstance(e, Malformed):
            raise
        raise Malformed(str(e)) from None
    raise Malformed(f"unknown tag {tag!r}")


def parse_values(data: bytes, n: int) -> list:
    """The runner's lines -> one value per expression (Raised where none came); Malformed when a line does
    not parse, names no expression, or repeats one."""
    values, seen = [Raised] * n, set()
    for line in data.decode("utf-8", "strict").splitlines() if data else []:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise Malformed(f"not JSON: {e}") from None
        if not (isinstance(record, list) and len(record) == 2 and type(record[0]) is int and 0 <= record[0] < n):
            raise Malformed("not a record")
        if record[0] in seen:
            raise Malformed(f"expression {record[0]} reported twice")
        seen.add(record[0])
        values[record[0]] = decode(record[1])
    return values


# --- judging ---


def same(a, b) -> bool:
    """Equal and of the same built-in types all the way down (so 1 is not True, nor 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return len(a) == len(b) and all(k in b and same(v, b[k]) for k, v in a.items())
    return a == b  # scalars, and sets (whose elements are hashable scalars or tuples of them)


def passes(check: tuple, values: list) -> bool:
    kind = check[0]
    if kind == "all":
        return all(passes(c, values) for c in check[1])
    if kind == "any":
        return any(passes(c, values) for c in check[1])
    if kind == "not":
        return not passes(check[1], values)
    if kind == "truth":
        return values[check[1]] is not Raised and bool(values[check[1]])
    if kind == "strict":
        return values[check[1]] is not Raised and same(values[check[1]], check[2])
    ops, sides = check[1], [values[i] if k == "expr" else i for k, i in check[2]]
    if any(v is Raised for v in sides):
        return False
    try:
        return all(op(a, b) for op, a, b in zip(ops, sides, sides[1:]))
    except (TypeError, ValueError, OverflowError, RecursionError):  # e.g. 1 < "a"
        return False


def judge(result, checks: list[tuple], n_exprs: int) -> float | None:
    """The fraction of tests passed, in [0, 1]; None for output that does not parse (scored 0, flagged malformed)."""
    try:
        values = parse_values(result.data, n_exprs)
        passed = sum(passes(c, values) for c in checks)
    except (Malformed, UnicodeDecodeError, RecursionError, MemoryError):
        return None
    fraction = passed / max(len(checks), 1)
    return min(1.0, max(0.0, fraction)) if math.isfinite(fraction) else 0.0


def extract_code(completion: str) -> str:
    """The first fenced code block (an unclosed fence runs to the end), else the whole completion."""
    m = _FENCE.search(completion)
    return m.group(1) if m else completion


def score_programs(
    completions: list[str], tests: list[list[dict]], all_or_nothing: bool = False, limits: Limits | None = None
):
    """-> tasks.Scores: each completion's score, with the flags "failed" and "malformed" per completion."""
    from nanorl.errors import RewardSetupError
    from nanorl.tasks import Scores

    try:
        plans = [plan(t) for t in tests]
    except (ValueError, SyntaxError, TypeError) as e:  # the task's tests, not the completion
        raise RewardSetupError(f"code reward: {e}") from None
    programs = [RUNNER.format(exprs=exprs, solution=extract_code(c)) for c, (exprs, _) in zip(completions, plans)]
    try:
        results = run_many(programs, limits)
    except SandboxError as e:  # the machine, not the completion: stop the run whatever reward_errors says
        raise RewardSetupError(f"code reward: {e}") from None
    fractions = [judge(r, checks, len(exprs)) for r, (exprs, checks) in zip(results, plans)]
    flags = {"failed": [not r.ok for r in results], "malformed": [f is None for f in fractions]}
    fractions = [f or 0.0 for f in fractions]
    return Scores([float(f == 1.0) if all_or_nothing else f for f in fractions], flags)


def code_reward(prompt, completion: str, tests: list[dict], all_or_nothing: bool = False, **_) -> float:
    """One completion; `code_reward.batch` scores many in parallel (the trainer uses it)."""
    return score_programs([completion], [tests], all_or_nothing)[0]


def _batch(prompts, completions, fields: list[dict], *_, **__):
    from nanorl.tasks import Scores

    aon = [bool(f.get("all_or_nothing", False)) for f in fields]
    fractions = score_programs(completions, [f["tests"] for f in fields])
    return Scores([float(x == 1.0) if a else x for x, a in zip(fractions, aon)], fractions.flags)


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

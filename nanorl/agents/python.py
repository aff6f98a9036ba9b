"""The `python` tool (issue 35): the model writes a Python program, it runs in the code sandbox (tasks/sandbox.py,
with the code reward's isolation and limits: 5 s of wall clock and of CPU, 512 MB; where the kernel lets it build
its namespaces, as root always, no network and none of the host's files), and what it printed comes back as the
tool message.

    nanorl train --task my.jsonl --tools nanorl.agents.python:python
    train(cfg, task, tools=[python])
    python("print(6 * 7)")                          # '42'
    python("print(1)\\nx = 1 / 0")                   # raises ProgramError: 'ZeroDivisionError: division by zero
                                                    #   (line 2)\\nIt printed:\\n1'

Each call is a fresh program: nothing is kept between calls. A program that exits 0 returns its stdout, then its
stderr if any (warnings); one that raises, runs past a limit or exits non-zero raises ProgramError, which the
episode answers to the model as an error (counted in tools/failure_frequency) saying what went wrong: an exception's
last traceback line and the program's line it came from, and what it had printed. Either is cut to MAX_CHARS.
"""

from __future__ import annotations

import re

from nanorl.tasks.sandbox import Limits, run_python

LIMITS = Limits(wall_s=5.0)  # the code reward's limits (tasks/code.py runs under Limits() too)
MAX_CHARS = 2000  # of a tool message: what a model reads back stays short
PROGRAM_LINE = re.compile(r'File "(?:[^"]*/work/)?main\.py", line (\d+)')  # a traceback's frames of the program


class ProgramError(Exception):
    """The model's program failed (an exception, a limit, a non-zero exit); the message is what the model reads."""


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + f"\n[cut to its first {MAX_CHARS} characters]"


def _what_went_wrong(result) -> str:
    """A failed Result -> one line: 'ValueError: bad (line 3)', 'stopped: it ran past its 5 s limit', ..."""
    if result.reason == "timeout":
        return f"stopped: it ran past its {LIMITS.wall_s:g} s limit"
    if result.reason in ("signal SIGXCPU", "signal SIGKILL"):  # the CPU limit: soft = hard, so mostly SIGKILL
        return f"stopped: it used more than its {LIMITS.cpu_s} s of CPU time"
    lines = result.stderr.strip().splitlines()
    where = PROGRAM_LINE.findall(result.stderr)
    if lines and (where or "Traceback" in result.stderr):  # an exception, or a syntax error (no "Traceback")
        return lines[-1] + (f" (line {where[-1]})" if where else "")
    return f"it ended with {result.reason}" + (f": {lines[-1]}" if lines else "")


def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it printed (use print); nothing is kept between calls.

    Args:
        code: the Python program to run, e.g. "print(sum(range(10)))"
    """
    result = run_python(code, LIMITS)
    if not result.ok:
        printed = result.stdout.rstrip("\n")
        raise ProgramError(_cut(_what_went_wrong(result) + (f"\nIt printed:\n{printed}" if printed else "")))
    out = "\n".join(s.rstrip("\n") for s in (result.stdout, result.stderr) if s.strip())
    return _cut(out) if out else "(no output: print() what you want to see)"

"""The code sandbox against hostile programs. Every attack must score 0 (or fail its test) within the
time limit and leave the trainer alive and the host unchanged.

As root (these machines, CI) each program runs as a private unprivileged uid in its own namespaces
and minimal root (sandbox.py), so a fork bomb is capped by RLIMIT_NPROC and nothing can signal the
trainer or write to the host; the attack tests skip elsewhere rather than fork-bomb a developer's
account. tests/test_sandbox_attacks.py has one or more attacks per class of issue 20.
"""

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from nanorl.tasks.code import code_reward, code_task, extract_code, score_programs
from nanorl.tasks.sandbox import UID_BASE, UID_SLOTS, Limits, run_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux only")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="attack tests need root (private uid isolation)")
FAST = Limits(wall_s=3.0, cpu_s=3, memory_mb=256, procs=16, file_bytes=100_000)
TESTS = [{"call": "f(2)", "expected": "4"}, {"call": "f(3)", "expected": "9"}]


def _sandbox_procs() -> list[int]:
    """Pids of running (not zombie) processes owned by any sandbox uid."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                status = (d / "status").read_text()
                uid = int(status.split("Uid:")[1].split()[0])
                state = status.split("State:")[1].split()[0]
            except (OSError, IndexError):
                continue
            if UID_BASE <= uid < UID_BASE + UID_SLOTS and state != "Z":
                pids.append(int(d.name))
    return pids


def _attack(body: str) -> float:
    """Score a hostile 'solution' of f(x) = x * x; the body runs at import time. Returns the reward."""
    t0 = time.perf_counter()
    reward = score_programs([f"```python\n{body}\ndef f(x):\n    return x * x\n```"], [TESTS], limits=FAST)[0]
    # the limit holds: an unlimited attack would run until the test's own timeout. The slack is wide because on a
    # loaded 2-core machine killing a fork bomb's descendants took 8.3 s of a 3 s limit (a CI run beside two jobs)
    assert time.perf_counter() - t0 < FAST.wall_s + 30, "the sandbox overran its wall-clock limit"
    return reward


def test_correct_wrong_and_malformed_solutions():
    good = "Here you go:\n```python\ndef f(x):\n    return x * x\n```\nDone."
    assert code_reward("", good, tests=TESTS) == 1.0
    assert code_reward("", "```python\ndef f(x):\n    return x + 2\n```", tests=TESTS) == 0.5
    assert code_reward("", "```python\ndef f(x):\n    return x + 2\n```", tests=TESTS, all_or_nothing=True) == 0.0
    assert code_reward("", "def f(x) return", tests=TESTS) == 0.0  # syntax error
    assert code_reward("", "no code at all", tests=TESTS) == 0.0
    assert extract_code("```py\nx = 1\ny = 2\n").strip() == "x = 1\ny = 2"  # an unclosed fence runs to the end
    assert code_reward("", "def f(x):\n    return x * x", tests=[{"assert": "f(4) == 16"}]) == 1.0


def test_the_batch_flags_programs_that_failed_or_wrote_malformed_output():
    """code_reward.batch returns Scores: per completion whether the program failed (no clean exit within its
    limits) and whether its output did not parse; Task.score_parts logs them as reward/code_failed_mean and
    reward/code_malformed_mean, never in the reward."""
    from nanorl.tasks import Example, Task

    good = "```python\ndef f(x):\n    return x * x\n```"
    crash = "```python\nimport os\nos._exit(3)\n```"
    forged = "```python\nimport os\nos.write(3, b'not json\\n')\ndef f(x):\n    return x * x\n```"
    out = code_reward.batch([""] * 3, [good, crash, forged], [{"tests": TESTS}] * 3)
    assert out == [1.0, 0.0, 0.0] and out.flags == {"failed": [False, True, False], "malformed": [False, False, True]}
    task = Task("code", train=[Example("", {"tests": TESTS})], eval=[], reward=code_reward)
    parts, total, _ = task.score_parts(task.train * 3, [good, crash, forged])
    assert parts == {"task": [1.0, 0.0, 0.0], "task_failed": [0.0, 1.0, 0.0], "task_malformed": [0.0, 0.0, 1.0]}
    assert total == [1.0, 0.0, 0.0]


def test_reward_hacks_score_zero():
    # an object equal to everything, a fake pass line, and exiting before the tests all gain nothing
    eq_hack = "class A:\n    def __eq__(self, o): return True\ndef f(x):\n    return A()"
    assert code_reward("", eq_hack, tests=TESTS) == 0.0
    assert code_reward("", "print('0 2 2')\nimport os\nos._exit(0)", tests=TESTS) == 0.0
    assert code_reward("", "import sys\nsys.exit(0)\ndef f(x):\n    return x * x", tests=TESTS) == 0.0


def test_every_built_in_code_problem_is_solved_by_its_reference():
    rows = [
        json.loads(x)
        for x in (Path(__file__).parents[1] / "nanorl/tasks/data/code_tasks.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 40 and len({r["name"] for r in rows}) == 40
    assert score_programs([f"```python\n{r['solution']}```" for r in rows], [r["tests"] for r in rows]) == [1.0] * 40
    task = code_task(eval_size=10)
    assert len(task.train) == 30 and not {e.prompt for e in task.eval} & {e.prompt for e in task.train}


@root_only
def test_infinite_loop_is_killed():
    assert _attack("while True:\n    pass") == 0.0
    r = run_python("while True:\n    pass", FAST)
    assert r.reason in ("timeout", "signal SIGKILL", "signal SIGXCPU")


@root_only
def test_fork_bomb_is_capped_and_cleaned_up():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    assert _attack(bomb) == 0.0
    deadline = time.time() + 5
    while _sandbox_procs() and time.time() < deadline:
        time.sleep(0.1)
    assert _sandbox_procs() == []  # every descendant is gone (SIGKILL delivery is asynchronous)


@root_only
def test_memory_bomb_fails_inside_its_limit():
    assert _attack("x = bytearray(8 * 1024**3)") == 0.0
    assert _attack("chunks = []\nwhile True:\n    chunks.append(' ' * 10**7)") == 0.0


@root_only
def test_huge_output_is_capped():
    r = run_python("while True:\n    print('x' * 10000)", FAST)
    assert not r.ok and len(r.stdout) <= FAST.file_bytes
    assert _attack("while True:\n    print('x' * 10000)") == 0.0


@root_only
def test_writes_outside_its_directory_never_reach_the_host(tmp_path):
    targets = [
        Path("/tmp/nanorl_sandbox_escape"),
        Path("/var/tmp/nanorl_sandbox_escape"),
        Path("/dev/shm/nanorl_sandbox_escape"),
        Path("/run/lock/nanorl_sandbox_escape"),
        tmp_path / "escape",
        Path.home() / "nanorl_sandbox_escape",
        Path(__file__).parent / "nanorl_sandbox_escape",
    ]
    body = "for p in %r:\n    try:\n        open(p, 'w').write('pwned')\n    except OSError:\n        pass" % [
        str(t) for t in targets
    ]
    assert _attack(body) == 1.0  # the program itself is fine; its writes simply land nowhere
    assert not any(t.exists() for t in targets)


@root_only
def test_parent_environment_is_not_readable():
    os.environ["NANORL_TEST_SECRET"] = "s3cret-value"
    try:
        leak = (
            "import os\ndef f(x):\n    seen = str(dict(os.environ))\n    for p in ('/proc/%d/environ' % os.getppid(),"
            " '/proc/1/environ'):\n        try:\n            seen += open(p, 'rb').read().decode('latin1')\n"
            "        except OSError:\n            pass\n    return x * x if 's3cret-value' in seen else -1"
        )
        assert code_reward("", leak, tests=TESTS) == 0.0
        r = run_python("import os; print(dict(os.environ))", FAST)
        assert "s3cret" not in r.stdout and r.ok
    finally:
        del os.environ["NANORL_TEST_SECRET"]


@root_only
def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(4)
    port = server.getsockname()[1]
    hits = []
    threading.Thread(target=lambda: hits.append(_accept(server)), daemon=True).start()
    body = (
        "import socket\nok = False\nfor host in ('127.0.0.1', '8.8.8.8'):\n    try:\n"
        f"        socket.create_connection((host, {port}), timeout=1)\n        ok = True\n    except OSError:\n"
        "        pass\ndef f(x):\n    return x * x if ok else 0"
    )
    assert code_reward("", body, tests=TESTS) == 0.0
    time.sleep(0.5)
    assert hits in ([], [None])
    server.close()


def _accept(server):
    try:
        return server.accept()
    except OSError:
        return None


@root_only
def test_cannot_kill_the_trainer():
    body = (
        f"import os, signal\nfor pid in (os.getppid(), {os.getpid()}, 1):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\nraise SystemExit(1)"
    )
    assert _attack(body) == 0.0  # and this test process is still here to check it

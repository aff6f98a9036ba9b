"""The code reward's judge: tests become expressions for the sandbox and checks for the trainer, the
sandbox's output is parsed defensively, and the reward stays in [0, 1] whatever the program writes."""

import json
import os
import sys

import pytest

from nanorl.tasks import RewardSetupError
from nanorl.tasks.code import Malformed, Raised, code_reward, decode, judge, parse_values, passes, plan, same
from nanorl.tasks.sandbox import Limits, Result, run_python

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux only")
SQUARE = "def f(x):\n    return x * x"


def _line(i, tagged) -> bytes:
    return (json.dumps([i, tagged]) + "\n").encode()


def test_expected_values_never_enter_the_sandbox():
    exprs, checks = plan(
        [
            {"call": "f(2)", "expected": "4"},
            {"assert": "f(3) == 9"},
            {"assert": "not f(1) > 100"},
            {"assert": "f(2) in (3, 4) and 0 < f(5)"},
            {"assert": "g(1) == f(1), 'same'"},
        ]
    )
    assert exprs == ["f(2)", "f(3)", "f(1)", "f(2)", "f(5)", "g(1)", "f(1)"]  # no 4, 9, 100, (3, 4) or 0 inside
    assert checks[0] == ("strict", 0, 4)
    values = [4, 9, 1, 4, 25, 1, 1]
    assert [passes(c, values) for c in checks] == [True] * 5
    assert [passes(c, [4.0, 9.0, 101, 5, 0, 1, 2]) for c in checks] == [False, True, False, False, False]


def test_bad_tests_are_the_tasks_fault():
    for bad in ([{"call": "f(1)", "expected": "list(range(3))"}], [{"call": "f(1)"}], [{"assert": "f(1) =="}]):
        with pytest.raises(RewardSetupError):
            code_reward("", SQUARE, tests=bad)


def test_values_round_trip_strictly():
    values = [
        0,
        -7,
        10**40,
        1.5,
        float("inf"),
        2 - 3j,
        "é\n",
        b"\x00\xff",
        True,
        None,
        [1, (2, "3")],
        {"a": [1.0], 2: {3}},
        {(1, 2), "x"},
        frozenset({1}),
        (),
    ]
    source = "def f(i):\n    return %r[i]\n" % (values[:-1] + [()],)
    source = source.replace("inf", "float('inf')")
    tests = [
        {"call": f"f({i})", "expected": repr(v) if v != float("inf") else "float('inf')"} for i, v in enumerate(values)
    ]
    assert code_reward("", source, tests=tests) == 1.0
    assert not same([1], [True]) and not same({"a": 1}, {"a": 1.0}) and not same((1,), [1])


@pytest.mark.parametrize(
    "data",
    [
        b"not json\n",
        b"[0]\n",
        b'[5, ["i", "1"]]\n',
        b'[-1, ["i", "1"]]\n',
        b'[true, ["i", "1"]]\n',
        _line(0, ["i", "4"]) + _line(0, ["i", "5"]),  # a second answer for one expression
        _line(0, ["i", "1e3"]),
        _line(0, ["i", " 4"]),
        _line(0, ["i", "9" * 6000]),
        _line(0, ["x", 1]),
        _line(0, ["s", 1]),
        _line(0, ["b", 1]),
        _line(0, ["y", "zz"]),
        _line(0, ["S", [["l", []]]]),  # unhashable
        _line(0, ["d", [[["i", "1"]]]]),
        _line(0, ["l", "abc"]),
        b"[0, " * 10000 + b"\n",
        b"\xff\xfe\n",
        _line(0, ["l", [["l", [["l", []]]]]] * 40000),
    ],
)
def test_malformed_output_scores_zero_and_is_counted(data):
    with pytest.raises(Malformed):
        try:
            parse_values(data, 2)
        except (UnicodeDecodeError, RecursionError) as e:
            raise Malformed(str(e)) from e
    _, checks = plan([{"call": "f(2)", "expected": "4"}, {"call": "f(3)", "expected": "9"}])
    assert judge(Result(True, 0, "", "", "", data), checks, 2) is None  # score_programs: 0, flagged malformed


def test_reward_is_a_fraction_whatever_the_output():
    _, checks = plan([{"call": "f(2)", "expected": "4"}, {"call": "f(3)", "expected": "9"}])
    for data in (b"", _line(0, ["i", "4"]), _line(1, ["i", "9"]) + _line(0, ["i", "4"]), _line(0, ["!"])):
        reward = judge(Result(True, 0, "", "", "", data), checks, 2)
        assert 0.0 <= reward <= 1.0
    assert parse_values(_line(1, ["?", "A"]), 2) == [Raised, Raised]
    assert decode(["l", [["i", "1"], ["n", None]]]) == [1, None]


@linux
def test_forged_results_gain_nothing():
    tests = [{"call": "f(2)", "expected": "4"}, {"call": "f(3)", "expected": "9"}]
    guesses = "".join(f'os.write(3, b\'[{i}, ["i", "{v}"]]\\n\')\n' for i in range(2) for v in (0, 4, 9))
    assert code_reward("", "import os\n" + guesses + SQUARE, tests=tests) == 0.0  # every guess voids the run
    for patch in (
        "import builtins\nclass A:\n    __eq__ = lambda s, o: True\nbuiltins.eval = lambda *a: A()",
        'import json\njson.dumps = lambda *a: \'[0, ["i", "4"]]\'',
        "import builtins\nbuiltins.type = lambda x: int",
        "import os\nos.close(3)",
    ):
        assert code_reward("", patch + "\ndef f(x):\n    return 0", tests=tests) == 0.0, patch  # as f alone


@linux
def test_an_assert_with_no_literal_side_is_compared_by_the_judge():
    """`assert f(x) == ref(x)` with both sides computed: each side comes out as plain data and the judge compares
    them, so an object that equals everything, or a patched operator module, cannot pass it."""
    ref = "def ref(x):\n    return x * x\n"
    tests = [{"assert": "f(2) == ref(2)"}, {"assert": "f(3) == ref(3) and ref(3) <= f(3)"}]
    assert code_reward("", ref + SQUARE, tests=tests) == 1.0
    for cheat in (
        "class A:\n    __eq__ = __le__ = lambda s, o: True\ndef f(x):\n    return A()",
        "import operator\noperator.eq = operator.le = lambda a, b: True\ndef f(x):\n    return 0",
    ):
        assert code_reward("", ref + cheat, tests=tests) == 0.0, cheat


@linux
def test_the_sandbox_sees_no_nanorl_checkout_home_or_run_folder(tmp_path):
    canary = tmp_path / "run_canary.txt"
    canary.write_text("canary")
    data = os.path.join(os.path.dirname(__import__("nanorl").__file__), "tasks", "data", "code_tasks.jsonl")
    probe = (
        "import os, sys\nfound = []\nfor p in %r:\n    try:\n        open(p).read(1)\n        found.append(p)\n"
        "    except OSError:\n        pass\nfor top in ('/usr', '/root', '/home', '/tmp', sys.prefix):\n"
        "    for d, _, files in os.walk(top):\n        found += [f for f in files if f in ('code_tasks.jsonl', "
        "'run_canary.txt', '_sandbox_launch.py')]\nprint(found)"
    ) % [data, str(canary), os.path.expanduser("~/.bashrc"), os.getcwd() + "/pyproject.toml"]
    r = run_python(probe, Limits(wall_s=20, cpu_s=20))
    assert r.ok and r.stdout.strip() == "[]", r.stdout + r.stderr

"""Practitioner warnings (logger.py, RULES): each fires on the run that earns it, is printed once and
recorded in the metrics; the default run fires none."""

import json
from pathlib import Path

import pytest

from nanorl.logger import RULES, RunWarnings

RESULTS = Path(__file__).parents[1] / "results"


def replay(rows: list[dict]) -> tuple[RunWarnings, list[dict]]:
    w = RunWarnings()
    out = []
    for i, row in enumerate(rows, 1):
        m = dict(row)
        w.log(m, i)
        out.append(m)
    return w, out


def test_the_default_run_fires_no_warning():
    rows = [json.loads(x) for x in (RESULTS / "grpo_default_seed0" / "metrics.jsonl").read_text().splitlines()]
    w, out = replay(rows)
    assert not w.said and not any(k.startswith("warn/") for m in out for k in m)


def healthy(n: int = 12, **over) -> list[dict]:
    base = {
        "reward/frac_groups_with_variance": 0.6,
        "rollout/truncated_frac": 0.1,
        "loss/kl": 0.01,
        "policy/sampler_logp_diff": 0.0,
        "policy/entropy": 1.0,
        "policy/trained_tokens": 100,
        "reward/errors": 0,
    }
    return [{**base, **{k: (v(i) if callable(v) else v) for k, v in over.items()}} for i in range(n)]


@pytest.mark.parametrize(
    "name, rows",
    [
        ("no_signal", healthy(**{"reward/frac_groups_with_variance": 0.0})),
        ("truncated", healthy(**{"rollout/truncated_frac": 0.95})),
        ("kl_rising", healthy(**{"loss/kl": lambda i: 0.01 if i < 6 else 0.5})),
        ("mismatch", healthy(**{"policy/sampler_logp_diff": 0.2})),
        ("entropy_collapse", healthy(**{"policy/entropy": lambda i: 1.0 if i < 5 else 0.01})),
        ("reward_errors", healthy(**{"reward/errors": lambda i: int(i == 7)})),
    ],
)
def test_each_warning_fires_on_its_run_once(name, rows, capsys):
    assert not replay(healthy())[0].said  # the healthy series fires nothing
    w, out = replay(rows)
    assert w.said == {name}
    assert any(m.get(f"warn/{name}") == 1 for m in out)
    printed = capsys.readouterr().out
    assert printed.count("[nanorl] warning") == 1 and " ".join(RULES[name].__doc__.split())[:40] in printed


def test_entropy_of_steps_that_trained_nothing_does_not_count():
    rows = healthy(
        **{"policy/entropy": lambda i: 1.0 if i < 5 else 0.0, "policy/trained_tokens": lambda i: 100 if i < 5 else 0}
    )
    assert not replay(rows)[0].said

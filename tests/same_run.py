"""The check of every distributed test: runs that split the work (torchrun ranks, engines, a server) end where one
process ends, with the same metrics at every step and the same final weights (tests/test_distributed.py,
tests/test_vllm.py)."""

import json

import pytest
import torch
from safetensors.torch import load_file


def metrics(folder) -> list[dict]:
    """A run's metrics.jsonl without its timings."""
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
        for line in (folder / "metrics.jsonl").read_text().splitlines()
    ]


def assert_same_run(
    tmp_path, models: list[str], atol: float, steps: int = 3, others=("two",), metrics_atol: float = 1e-7
) -> None:
    """Each run in `others` (folders of tmp_path) equals one/: the same final weights and the same metrics, one line
    per step."""
    for other in others:
        for model in models:
            one, two = (load_file(tmp_path / run / model / "model.safetensors") for run in ("one", other))
            assert one.keys() == two.keys(), (other, model)
            for k in one:
                where = f"{other}/{model}: {k}"
                torch.testing.assert_close(two[k], one[k], rtol=1e-5, atol=atol, msg=lambda m, w=where: f"{w}: {m}")
        m1, m2 = metrics(tmp_path / "one"), metrics(tmp_path / other)
        assert [m["step"] for m in m2] == list(range(1, steps + 1))  # one line per step: only the main process writes
        assert m1[0]["optim/grad_norm"] > 0  # it trained
        for a, b in zip(m1, m2):
            assert a.keys() == b.keys()
            for k in a:
                assert b[k] == pytest.approx(a[k], rel=1e-5, abs=metrics_atol), (other, k)

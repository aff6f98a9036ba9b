"""`nanorl dpo`, `sft` and `rm` checkpoint and resume like `nanorl train`: a run stopped by SIGTERM finishes its
step, writes a checkpoint and exits 143; `--resume true` continues it, and on CPU the stopped-and-resumed run
writes the uninterrupted run's metrics and evaluations, step for step, and ends with the same weights."""

import importlib
import json
import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from nanorl import offline
from nanorl.cli import TRAINERS, main
from nanorl.config import ConfigError

# 30 rows: 24 train / 6 held out; batches of 5 -> 5 steps per epoch, 10 in 2 epochs (a partial batch in each)
ROWS = [{"prompt": f"q{i}", "chosen": "a" * (1 + i % 3), "rejected": "b" * (1 + i % 4)} for i in range(30)]


def flags(tmp_path, out, *more) -> list[str]:
    data = tmp_path / "rows.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return [
        "--model",
        "tiny",
        "--data",
        str(data),
        "--out-dir",
        str(out),
        "--report-to",
        "none",
        "--epochs",
        "2",
        "--batch-size",
        "5",
        "--micro-batch-size",
        "3",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "1",
        "--eval-every",
        "3",
        "--save-every",
        "4",
        "--seed",
        "3",
        "--backend",
        "torch",
        *more,
    ]


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def stop_at(monkeypatch, step: int) -> None:
    """Send this process SIGTERM while step `step` is being logged, as `kill` would."""

    def hook(s, metrics):
        if s == step:
            os.kill(os.getpid(), signal.SIGTERM)

    make_logger = offline.make_logger
    monkeypatch.setattr(offline, "make_logger", lambda *a, **k: make_logger(*a, **k, callbacks=[hook]))


def same_run(a, b) -> None:
    """metrics.jsonl: the same steps with every metric equal, apart from wall-clock times; eval.jsonl and
    results.json's before/after equal; the final weights equal."""
    strip = [
        [{k: v for k, v in m.items() if not k.startswith("time/")} for m in lines(d / "metrics.jsonl")] for d in (a, b)
    ]
    assert [m["step"] for m in strip[1]] == list(range(1, 11)) and strip[0] == strip[1]
    assert lines(a / "eval.jsonl") == lines(b / "eval.jsonl")
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (a, b))
    assert (ra["before"], ra["after"]) == (rb["before"], rb["after"])
    wa, wb = (load_file(d / "model" / "model.safetensors") for d in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize(
    "command, more",
    [
        ("dpo", ["--task", "arithmetic", "--eval-size", "2", "--max-new-tokens", "3"]),  # the task's accuracy too
        ("sft", ["--task", ""]),
        ("rm", []),
        ("rm", ["--lora-r", "4"]),  # the checkpoint is an adapter, with the scalar head in it
    ],
)
def test_a_stopped_and_resumed_run_equals_an_uninterrupted_one(tmp_path, monkeypatch, command, more):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    main([command, *flags(tmp_path, straight, *more)])
    with monkeypatch.context() as m:
        stop_at(m, 3)
        with pytest.raises(SystemExit) as e:  # the CLI turns the Interrupted into exit code 128 + SIGTERM
            main([command, *flags(tmp_path, stopped, *more)])
    assert e.value.code == 143
    assert (stopped / "checkpoint" / "step").read_text() == "3" and not (stopped / "model").exists()
    main([command, *flags(tmp_path, stopped, *more), "--resume", "true"])  # steps 4-10, checkpoints at 4 and 8
    same_run(straight, stopped)
    # resumed again from step 8, as after a crash: the lines written after that checkpoint are replaced, not repeated
    main([command, *flags(tmp_path, stopped, *more), "--resume", "true"])
    same_run(straight, stopped)


@pytest.mark.parametrize("command", ["dpo", "sft", "rm"])
def test_resume_without_a_checkpoint_is_refused(tmp_path, command):
    module, cls = TRAINERS[command]
    with pytest.raises(ConfigError, match="config key 'resume': no checkpoint"):
        importlib.import_module(module).train(cls(model="tiny", out_dir=str(tmp_path), resume=True))
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before anything was written


def test_keep_last_a_changed_config_and_a_new_run(tmp_path, capsys):
    out = tmp_path / "run"
    main(["sft", *flags(tmp_path, out, "--task", "", "--save-every", "2", "--keep-last", "2")])
    assert (out / "checkpoint" / "step").read_text() == "8"  # none after the last step: the final model is saved
    assert sorted(p.name for p in out.glob("checkpoint-step*")) == ["checkpoint-step6"]
    with pytest.raises(SystemExit) as e:  # a key that changes what is computed
        main(["sft", *flags(tmp_path, out, "--task", "", "--lr", "1e-3", "--resume", "true")])
    assert e.value.code == 2 and "['lr']" in capsys.readouterr().err
    main(["sft", *flags(tmp_path, out, "--task", "", "--epochs", "1", "--save-every", "0")])  # a new run: old ones go
    assert not (out / "checkpoint").exists() and not list(out.glob("checkpoint-step*"))


def test_dpo_resume_keeps_the_starting_models_reference_and_checks_the_data(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        stop_at(m, 2)
        with pytest.raises(SystemExit):
            main(["dpo", *flags(tmp_path, out, "--task", "")])
    state = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert state["ref"].shape == (30, 2)  # the starting model's log-probs of every row, chosen and rejected
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS + ROWS[:5]))
    with pytest.raises(SystemExit) as e:
        main(["dpo", *flags(tmp_path, out, "--task", ""), "--resume", "true"])
    assert e.value.code == 2 and "config key 'data'" in capsys.readouterr().err

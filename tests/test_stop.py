"""Runs you can leave alone: one run per folder (a lock), SIGINT / SIGTERM finish the step and write a checkpoint
that --resume continues from, and keep_last keeps older checkpoints. Subprocesses run the tiny model."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from nanorl.cli import main

TINY = [
    "--model",
    "tiny",
    "--report-to",
    "none",
    "--backend",
    "torch",
    "--prompts-per-step",
    "2",
    "--samples-per-prompt",
    "2",
    "--max-new-tokens",
    "4",
    "--eval-size",
    "2",
]


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def test_a_second_run_on_the_same_folder_is_refused(tmp_path, capsys):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom nanorl.checkpoint import lock\n"
            f"lock({str(tmp_path / 'run')!r}); print('locked', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(SystemExit) as e:
            main(["train", *TINY, "--out-dir", str(tmp_path / "run"), "--steps", "1"])
        assert e.value.code == 2 and f"in use by another nanorl run (pid {holder.pid})" in capsys.readouterr().err
        assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing of the second run was written
    finally:
        holder.kill()
        holder.wait()
    main(["train", *TINY, "--out-dir", str(tmp_path / "run"), "--steps", "1"])  # the lock went with its process
    main(["train", *TINY, "--out-dir", str(tmp_path / "run"), "--steps", "1"])  # and this process may run again
    other = subprocess.run(
        [sys.executable, "-c", f"from nanorl.checkpoint import lock\nlock({str(tmp_path / 'run')!r}); print('locked')"],
        capture_output=True,
        text=True,
    )
    assert other.stdout.strip() == "locked", other.stderr[-500:]  # a finished run lets the folder go


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_finishes_the_step_writes_a_checkpoint_and_resume_continues(tmp_path, sig, code):
    out = tmp_path / "run"
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nanorl.cli",
            "train",
            *TINY,
            "--out-dir",
            str(out),
            "--steps",
            "500",
            "--save-every",
            "0",
            "--eval-every",
            "1000",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while len(lines(out / "metrics.jsonl")) < 2 and time.time() < deadline and run.poll() is None:
        time.sleep(0.05)
    run.send_signal(sig)
    _, err = run.communicate(timeout=120)
    assert run.returncode == code, err[-2000:]
    done = len(lines(out / "metrics.jsonl"))
    state = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert 2 <= done < 500 and state["step"] == done  # the checkpoint is of the last logged step
    assert f"stopped by {sig.name} after step {done}" in err and "--resume true" in err
    main(
        [
            "train",
            *TINY,
            "--out-dir",
            str(out),
            "--steps",
            str(done + 2),
            "--save-every",
            "0",
            "--eval-every",
            "1000",
            "--resume",
            "true",
        ]
    )
    assert [m["step"] for m in lines(out / "metrics.jsonl")] == list(range(1, done + 3))  # every step once


def test_keep_last_keeps_older_checkpoints(tmp_path):
    out = tmp_path / "run"
    main(["train", *TINY, "--out-dir", str(out), "--steps", "8", "--save-every", "2", "--keep-last", "2"])
    assert (out / "checkpoint" / "step").read_text() == "6"
    assert sorted(p.name for p in out.glob("checkpoint-step*")) == ["checkpoint-step4"]
    main(["train", *TINY, "--out-dir", str(out), "--steps", "2", "--save-every", "1"])  # a new run: old ones go
    assert not list(out.glob("checkpoint-step*"))


def test_the_signal_handlers_are_restored_after_a_run(tmp_path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    main(["train", *TINY, "--out-dir", str(tmp_path / "run"), "--steps", "1"])
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_full_disk_is_named_and_the_previous_checkpoint_survives(tmp_path, monkeypatch):
    import shutil

    from nanorl import checkpoint
    from nanorl.hub import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    checkpoint.save(tmp_path / "checkpoint", model, tok, step=1)

    def disk_full(*a, **k):  # what torch raises when the disk fills up mid-write
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0: file write failed")

    monkeypatch.setattr(type(model), "save_pretrained", disk_full)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 1024))
    with pytest.raises(OSError, match="no space left.*previous checkpoint is intact"):
        checkpoint.save(tmp_path / "checkpoint", model, tok, step=2)
    assert (tmp_path / "checkpoint" / "step").read_text() == "1" and not (tmp_path / "checkpoint.tmp").exists()


def test_a_run_stopped_in_its_last_step_reports_its_final_evaluation_on_resume(tmp_path):
    """A signal during the last step: its evaluation is logged, the checkpoint is of the last step, and the resumed
    run (no steps left) writes results.json with that evaluation as "after", not the "before" numbers."""
    from nanorl.checkpoint import Interrupted
    from nanorl.config import GRPOConfig, parse_args
    from nanorl.grpo import train

    out = tmp_path / "run"
    (tmp_path / "r.py").write_text(
        "def digits(completions, **kw):  # the tiny model's samples differ on it\n"
        "    return [sum(c.isdigit() for c in s) / max(len(s), 1) for s in completions]\n"
    )
    args = [
        "--model",
        "tiny",
        "--report-to",
        "none",
        "--out-dir",
        str(out),
        "--steps",
        "3",
        "--eval-every",
        "1",
        "--lr",
        "3e-2",
        "--save-every",
        "0",
        "--reward",
        f"{tmp_path / 'r.py'}:digits",
        "--max-new-tokens",
        "8",
    ]

    def stop_at_the_end(step, metrics):
        if step == 3:
            signal.raise_signal(signal.SIGTERM)

    with pytest.raises(Interrupted):
        train(parse_args(GRPOConfig, args), callbacks=[stop_at_the_end])
    evals = lines(out / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 1, 2, 3] and (out / "checkpoint" / "step").read_text() == "3"
    assert evals[-1]["eval/greedy_reward"] != evals[0]["eval/greedy_reward"]  # the evaluations tell apart
    result = train(parse_args(GRPOConfig, args + ["--resume", "true"]))
    final = {k: v for k, v in evals[-1].items() if k != "step"}
    assert result["after"] == final and json.loads((out / "results.json").read_text())["after"] == final
    assert result["before"] == {k: v for k, v in evals[0].items() if k != "step"}


def test_a_resume_with_no_step_left_evaluates_weights_newer_than_its_last_evaluation(tmp_path):
    """Evaluations at steps 0, 3 and 5, a checkpoint after step 4; resumed with --steps 4 nothing is left to train,
    and the latest evaluation (step 3) is older than the weights: the run evaluates them (step 4) as its "after".
    Resumed with --steps 3, below the checkpoint's step, it is refused."""
    from nanorl.config import ConfigError, GRPOConfig, parse_args
    from nanorl.grpo import train

    out = tmp_path / "run"
    (tmp_path / "r.py").write_text(
        "def digits(completions, **kw):\n"
        "    return [sum(c.isdigit() for c in s) / max(len(s), 1) for s in completions]\n"
    )
    args = [
        "--model",
        "tiny",
        "--report-to",
        "none",
        "--out-dir",
        str(out),
        "--eval-every",
        "3",
        "--lr",
        "3e-2",
        "--save-every",
        "1",
        "--reward",
        f"{tmp_path / 'r.py'}:digits",
        "--max-new-tokens",
        "8",
    ]
    train(parse_args(GRPOConfig, args + ["--steps", "5"]))
    assert [e["step"] for e in lines(out / "eval.jsonl")] == [0, 3, 5]
    assert (out / "checkpoint" / "step").read_text() == "4"
    with pytest.raises(
        ConfigError, match=r"config key 'steps': 3 is below the step of the checkpoint being resumed \(4"
    ):
        train(parse_args(GRPOConfig, args + ["--steps", "3", "--resume", "true"]))  # it would report 3 steps run
    result = train(parse_args(GRPOConfig, args + ["--steps", "4", "--resume", "true"]))
    evals = lines(out / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 3, 4]  # the step-5 line rewound, step 4 evaluated (before: 0, 3)
    assert result["after"] == {k: v for k, v in evals[-1].items() if k != "step"}


KILLED_AFTER_RENAME = """
import os, pathlib, sys
from nanorl.cli import main

rename, count = pathlib.Path.rename, [0]

def rename_then_die(self, target):  # the save at step 1 renames twice (no checkpoint before it), step 2's 3 times
    out = rename(self, target)
    count[0] += self.name.startswith("checkpoint")
    if count[0] == 2 + int(sys.argv[1]):
        os._exit(137)  # as kill -9 right after it: no signal handler, no cleanup
    return out

pathlib.Path.rename = rename_then_die
main(sys.argv[2:])
"""


def timeless(path) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))} for m in lines(path)]


@pytest.mark.parametrize("command", ["train", "ppo"])
def test_a_save_killed_after_any_of_its_renames_resumes_to_the_uninterrupted_run(tmp_path, command):
    """A checkpoint is swapped in by renames (checkpoint.tmp -> .new, checkpoint -> .old, .new -> checkpoint). A
    process killed after any one of them leaves the newest whole checkpoint for --resume to find, and the resumed
    run ends where the uninterrupted one ends: the same metrics at every step and the same weights."""
    from safetensors.torch import load_file

    args = [command, *TINY, "--lr-schedule", "constant", "--save-every", "1", "--eval-every", "100"]
    args += ["--minibatch-size", "4"] if command == "ppo" else []  # PPO: its critic is saved in the same swap
    main([*args, "--out-dir", str(tmp_path / "straight"), "--steps", "3"])
    weights = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    for k in (1, 2, 3):  # the save at step 2, killed after its k-th rename
        run = [*args, "--out-dir", str(tmp_path / f"killed{k}"), "--steps", "3"]
        done = subprocess.run([sys.executable, "-c", KILLED_AFTER_RENAME, str(k), *run], capture_output=True, text=True)
        assert done.returncode == 137, done.stderr[-2000:]
        assert (tmp_path / f"killed{k}" / "checkpoint").is_dir() == (k != 2)  # none between the two swap renames
        main([*run, "--resume", "true"])
        assert timeless(tmp_path / f"killed{k}" / "metrics.jsonl") == timeless(tmp_path / "straight" / "metrics.jsonl")
        resumed = load_file(tmp_path / f"killed{k}" / "model" / "model.safetensors")
        assert all(torch.equal(resumed[n], weights[n]) for n in weights), k

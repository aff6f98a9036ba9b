"""Runs you can leave alone: non-finite rewards and gradients never reach the weights, impossible settings are
refused before any model is loaded, and every step shows on the console and in the trackers."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_grpo import toy_task

from nanorl import Example, GRPOConfig, Task, train
from nanorl.config import ConfigError, DPOConfig, PPOConfig, validate
from nanorl.learner import count_bad_steps, make_optimizer, optimizer_step
from nanorl.logger import console_line
from nanorl.models import tiny_model_and_tokenizer

SMALL = dict(
    model="tiny",
    steps=3,
    prompts_per_step=2,
    samples_per_prompt=4,
    max_new_tokens=6,
    lr=1e-2,
    warmup_steps=0,
    eval_every=100,
    save_every=0,
    eval_size=4,
    report_to="none",
)


def _metrics(path):
    return [json.loads(x) for x in open(path / "metrics.jsonl")]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), None, "0.5 points"])
def test_a_reward_that_is_not_a_finite_number_is_reported_with_its_input(tmp_path, bad):
    task = Task(
        "bad",
        train=[Example(f"q{i}") for i in range(8)],
        eval=[Example("e")],
        reward=lambda prompt, completion, **_: bad if prompt == "q3" else 0.5,
    )
    with pytest.raises(RuntimeError, match="reward 'task'.*prompt 'q3' with completion"):
        train(GRPOConfig(out_dir=str(tmp_path / "raise"), **{**SMALL, "prompts_per_step": 8}), task)
    train(GRPOConfig(out_dir=str(tmp_path / "zero"), reward_errors="zero", **{**SMALL, "prompts_per_step": 8}), task)
    m = _metrics(tmp_path / "zero")
    assert m[0]["reward/errors"] == 4 and all(math.isfinite(x["reward/mean"]) for x in m)  # q3's 4 samples


def test_a_non_finite_gradient_skips_the_update_and_leaves_the_weights():
    model, _ = tiny_model_and_tokenizer()
    opt, sched = make_optimizer(model, GRPOConfig(lr=1e-2, warmup_steps=0, lr_schedule="constant"), 10)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    model.lm_head.weight.grad[0, 0] = float("nan")
    assert math.isnan(optimizer_step(model, opt, sched, 1.0))
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters()) and sched.last_epoch == 1
    assert count_bad_steps(1, 0, 3, 1) == 1 and count_bad_steps(0, 2, 3, 4) == 0
    with pytest.raises(RuntimeError, match="3 steps in a row"):
        count_bad_steps(1, 2, 3, 7)


def test_a_run_whose_loss_turns_nan_stops_with_its_weights_intact(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    import nanorl.update as update

    loss = update.policy_loss
    monkeypatch.setattr(update, "policy_loss", lambda *a, **k: (loss(*a, **k)[0] * float("nan"), loss(*a, **k)[1]))
    from test_variants import varied_task

    with pytest.raises(RuntimeError, match="2 steps in a row"):
        train(GRPOConfig(out_dir=str(tmp_path), max_bad_steps=2, **{**SMALL, "save_every": 1}), varied_task())
    m = _metrics(tmp_path)
    assert [x["optim/skipped_updates"] for x in m] == [1, 1]
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint").state_dict()
    start = tiny_model_and_tokenizer()[0].state_dict()
    assert all(torch.equal(saved[k], v) for k, v in start.items())  # no update ever reached the weights


@pytest.mark.parametrize(
    "cls,key,value",
    [
        (GRPOConfig, "lr", float("inf")),
        (GRPOConfig, "lr", float("nan")),
        (GRPOConfig, "warmup_steps", -1),
        (GRPOConfig, "top_k", -1),
        (GRPOConfig, "kl_coef", -0.5),
        (GRPOConfig, "save_every", -2),
        (GRPOConfig, "max_bad_steps", -1),
        (GRPOConfig, "report_to", "console,mlfloww"),
        (PPOConfig, "value_clip", -1.0),
        (DPOConfig, "label_smoothing", -0.1),
        (GRPOConfig, "rm_weight", float("inf")),
    ],
)
def test_impossible_values_are_refused_naming_the_key(cls, key, value):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        validate(cls(**{key: value}))


def test_the_cli_refuses_a_bad_value_in_one_line_before_loading_anything(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "nanorl.cli", "train", "--lr", "inf", "--out-dir", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and r.stderr.strip() == "nanorl: error: config key 'lr': must be a finite number, got inf"
    assert not (tmp_path / "x").exists()


def test_console_line_of_a_step():
    m = {
        "reward/mean": 0.34,
        "reward/acc": 0.3125,
        "rollout/len_mean": 14.2,
        "loss/kl": 0.002,
        "time/step": 7.61,
        "optim/skipped_updates": 0,
    }
    assert console_line(m, 12, 40) == "step 12/40 reward 0.340 acc 0.31 len 14 kl 0.0020 7.6 s"
    m.update({"loss/kl": 0.0, "reward/kl_penalty": 0.0, "optim/skipped_updates": 1})
    assert console_line(m, 3, None) == "step 3 reward 0.340 acc 0.31 len 14 skipped 1 7.6 s"
    assert console_line({"train/loss": 0.69314, "time/step": 1.0}, 2, 20) == "step 2/20 loss 0.6931 1.0 s"


def test_every_step_prints_a_line_when_the_output_is_not_a_terminal(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "nanorl.cli",
        "train",
        "--model",
        "tiny",
        "--steps",
        "2",
        "--eval-size",
        "4",
        "--prompts-per-step",
        "2",
        "--samples-per-prompt",
        "2",
        "--max-new-tokens",
        "4",
        "--out-dir",
        str(tmp_path),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)  # a pipe, not a terminal
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.startswith("step ")]
    assert [x.split()[1] for x in lines] == ["1/2", "2/2"] and all(x.endswith(" s") for x in lines)


def test_tensorboard_and_wandb_offline_receive_the_metrics(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    wandb = pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "mine")
    base = {**SMALL, "report_to": "tensorboard,wandb", "eval_every": 3, "save_every": 2, "log_completions": True}
    train(GRPOConfig(out_dir=str(tmp_path), **base), toy_task())
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward/mean")] == [1, 2, 3]
    assert [e.step for e in events.Scalars("eval/greedy_acc")][-1] == 3
    assert [e.step for e in events.Tensors("completions/text_summary")] == [1, 2, 3]  # every completion, a table
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * SMALL["prompts_per_step"] * SMALL["samples_per_prompt"]  # log_completions: all
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    run_id = (tmp_path / "wandb_run_id").read_text()
    assert len(runs) == 1 and runs[0].stat().st_size > 0 and runs[0].name == f"run-{run_id}.wandb"
    assert wandb.run is None  # the run was finished
    train(GRPOConfig(out_dir=str(tmp_path), **{**base, "steps": 4, "resume": True}), toy_task())
    assert (tmp_path / "wandb_run_id").read_text() == run_id  # the resumed run goes on in the same W&B run


TRACKIO_RUN = """
import json, sys
from pathlib import Path
from nanorl.config import GRPOConfig
from nanorl.grpo import train
from test_robust import SMALL, toy_task
out, steps, resume = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
base = {**SMALL, "report_to": "trackio", "eval_every": 3, "save_every": 2, "steps": steps, "resume": resume}
train(GRPOConfig(out_dir=str(out), **base), toy_task())
from trackio.sqlite_storage import SQLiteStorage
name = (out / "trackio_run_name").read_text()
logs = SQLiteStorage.get_logs("mine", name)
print("TRACKIO " + json.dumps({"runs": SQLiteStorage.get_runs("mine"), "name": name, "steps": [
    [x["step"], "reward/mean" in x, "eval/greedy_acc" in x, "completions" in x] for x in logs]}))
"""


def test_trackio_receives_the_metrics_and_a_resumed_run_goes_on_in_the_same_run(tmp_path):
    """report_to trackio (TRL's name; trackio's local store, here a folder of the test's own: TRACKIO_DIR): each
    step's metrics, the evaluations and the completions table; --resume continues the run of the same name."""
    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "store"), "TRACKIO_PROJECT": "mine"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])

    def run(steps, resume):
        cmd = [sys.executable, "-c", TRACKIO_RUN, str(tmp_path / "run"), str(steps), str(int(resume))]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("TRACKIO "))[len("TRACKIO ") :])

    first = run(3, False)
    assert first["runs"] == [first["name"]] and first["name"].startswith("run-")
    has = lambda i: {s for s, *x in first["steps"] if x[i]}  # noqa: E731  the steps with a reward, an eval, a table
    assert has(0) == {1, 2, 3} and has(1) == {0, 3} and has(2) == {1, 2, 3}
    again = run(4, True)  # from the checkpoint at step 2
    assert again["runs"] == [first["name"]] and again["name"] == first["name"]
    assert {s for s, *_ in again["steps"]} >= {1, 2, 3, 4}
    assert (tmp_path / "store").is_dir() and not (Path.home() / ".cache/huggingface/trackio/mine.db").exists()


def _same_run(a, b):
    """Every metric of every step equal, apart from wall-clock times and rates."""
    assert [x["step"] for x in a] == [x["step"] for x in b]
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if not k.startswith(("time/", "perf/"))} == {
            k: v for k, v in y.items() if not k.startswith(("time/", "perf/"))
        }, x["step"]


def test_a_resumed_run_equals_an_uninterrupted_one_step_for_step(tmp_path):
    """The checkpoint holds weights, AdamW, the schedule and the RNGs, and the data order and rollout seeds
    depend on the step alone, so on CPU resuming gives the uninterrupted run's metrics exactly; the lines the
    stopped run wrote after its checkpoint are replaced, not repeated."""
    base = dict(SMALL, lr_schedule="constant", steps=4)
    train(GRPOConfig(out_dir=str(tmp_path / "straight"), **base), toy_task())
    stopped = tmp_path / "stopped"
    train(GRPOConfig(out_dir=str(stopped), **{**base, "steps": 3, "save_every": 2}), toy_task())  # checkpoint at 2
    train(GRPOConfig(out_dir=str(stopped), resume=True, **{**base, "save_every": 2}), toy_task())
    _same_run(_metrics(tmp_path / "straight"), _metrics(stopped))
    assert [json.loads(x)["step"] for x in open(stopped / "eval.jsonl")] == [0, 4]
    assert max(json.loads(x)["step"] for x in open(stopped / "samples.jsonl")) == 4


def test_resume_refuses_a_missing_checkpoint_or_a_changed_config_and_a_new_run_drops_an_old_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint to resume from"):
        train(GRPOConfig(out_dir=str(tmp_path), resume=True, **SMALL), toy_task())
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before anything was written
    train(GRPOConfig(out_dir=str(tmp_path), **{**SMALL, "save_every": 2}), toy_task())
    assert (tmp_path / "checkpoint").is_dir()
    with pytest.raises(ConfigError, match=r"\['lr'\]"):
        train(GRPOConfig(out_dir=str(tmp_path), resume=True, **{**SMALL, "save_every": 2, "lr": 0.5}), toy_task())
    train(GRPOConfig(out_dir=str(tmp_path), **{**SMALL, "steps": 1}), toy_task())  # a new run in the same folder
    assert not (tmp_path / "checkpoint").exists()

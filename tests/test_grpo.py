import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nanorl import Example, GRPOConfig, Task, train
from nanorl.advantages import group_advantages
from nanorl.models import stop_token_ids, tiny_model_and_tokenizer
from nanorl.sampling import Rollouts, SamplingParams, generate
from nanorl.update import micro_batches, policy_backward

pytestmark = pytest.mark.usefixtures("each_backend")  # every loop test with backends on and off


def letter_a(prompt, completion, **_):
    """Toy reward a tiny random model can learn in a few dozen steps: the share of 'a' characters."""
    return completion.count("a") / max(len(completion), 1)


def toy_task():
    return Task(
        "letter-a",
        train=[Example(f"q{i}") for i in range(40)],
        eval=[Example(f"e{i}") for i in range(4)],
        reward=letter_a,
    )


def _metrics(out_dir):
    return [json.loads(line) for line in open(out_dir / "metrics.jsonl")]


def test_gradient_is_independent_of_micro_batch_size():
    model, tok = tiny_model_and_tokenizer(seed=1)
    prompts = [tok("ab")["input_ids"], tok("a longer one")["input_ids"], tok("c")["input_ids"]]
    roll = generate(
        model, prompts, 4, SamplingParams(max_new_tokens=9), stop_token_ids(model, tok), seed=0, pad_id=tok.pad_token_id
    )
    rewards = torch.tensor([float(len(c) % 3) for c in roll.completion_ids])
    adv = group_advantages(rewards, 4)
    grads = []
    for micro in (12, 5, 1):
        cfg = GRPOConfig(micro_batch_size=micro)
        model.zero_grad()
        stats = policy_backward(
            model, roll, adv, list(range(12)), cfg, on_policy=True, pad_id=tok.pad_token_id, device="cpu"
        )
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert stats["ratio_min"] == 1.0 and stats["ratio_max"] == 1.0 and stats["clipped"] == 0.0
    assert grads[0].abs().max() > 0
    for g in grads[1:]:
        assert torch.allclose(grads[0], g, atol=1e-6, rtol=1e-4)


def _rollouts(prompt_lengths, completion_lengths, n):
    prompts = [[7 + g] * p for g, p in enumerate(prompt_lengths) for _ in range(n)]
    return Rollouts(
        prompts,
        [[1] * c for c in completion_lengths],
        [torch.zeros(c) for c in completion_lengths],
        [False] * len(prompts),
        n,
    )


def test_micro_batches_keep_groups_together_when_that_costs_less():
    # 2 groups of 2, long prompts, completions interleaved in length: sorting by length would put both
    # prompts in each micro-batch (2 x 40 + 2 x c); group by group prefills each prompt once.
    roll = _rollouts([40, 40], [5, 6, 5, 6], n=2)
    mbs = micro_batches([0, 1, 2, 3], roll, 2)
    assert sorted(map(sorted, mbs)) == [[0, 1], [2, 3]]
    # short prompts, very different lengths within each group: sorting by length pads less
    roll = _rollouts([1, 1], [1, 30, 1, 30], n=2)
    mbs = micro_batches([0, 1, 2, 3], roll, 2)
    assert sorted(map(sorted, mbs)) == [[0, 2], [1, 3]]
    assert sorted(i for mb in micro_batches([3, 0, 2], roll, 2) for i in mb) == [0, 2, 3]  # a subset, each once


def test_grpo_learns_toy_task_and_changes_parameters(tmp_path):
    cfg = GRPOConfig(
        model="tiny",
        out_dir=str(tmp_path),
        steps=30,
        prompts_per_step=4,
        samples_per_prompt=8,
        max_new_tokens=8,
        lr=3e-3,
        warmup_steps=0,
        eval_every=100,
        save_every=0,
    )
    before = {k: v.clone() for k, v in tiny_model_and_tokenizer()[0].state_dict().items()}
    result = train(cfg, toy_task())
    m = _metrics(tmp_path)
    assert len(m) == 30
    first, last = sum(x["reward/mean"] for x in m[:5]) / 5, sum(x["reward/mean"] for x in m[-5:]) / 5
    assert last > first + 0.2, (first, last)  # seeds 0-3 gain 0.24-0.36 (from ~0.01)
    # on-policy (one optimizer step per batch): logged ratio exactly 1, nothing clipped
    assert all(x["policy/ratio_min"] == 1.0 and x["policy/ratio_max"] == 1.0 for x in m)
    assert all(x["policy/clip_frac"] == 0.0 for x in m)
    from transformers import AutoModelForCausalLM

    after = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert result["after"]["eval/greedy_acc"] >= 0.0
    for name in ("config.json", "metrics.jsonl", "samples.jsonl", "eval.jsonl", "results.json", "eval_samples.jsonl"):
        assert (tmp_path / name).is_file()


def test_off_policy_minibatches_clip_and_kl_reference(tmp_path):
    cfg = GRPOConfig(
        model="tiny",
        out_dir=str(tmp_path),
        steps=3,
        prompts_per_step=2,
        samples_per_prompt=4,
        max_new_tokens=6,
        lr=1e-2,
        epochs=2,
        minibatch_size=4,
        kl_coef=0.1,
        eval_every=100,
        save_every=0,
    )
    train(cfg, toy_task())
    m = _metrics(tmp_path)
    assert any(x["policy/ratio_max"] != 1.0 for x in m)  # later minibatches are off-policy
    assert all(x["loss/kl"] >= 0 for x in m) and any(x["loss/kl"] > 0 for x in m)


def test_resume_continues_from_checkpoint(tmp_path):
    base = dict(
        model="tiny",
        out_dir=str(tmp_path),
        prompts_per_step=2,
        samples_per_prompt=4,
        max_new_tokens=6,
        lr=1e-3,
        eval_every=100,
        save_every=2,
    )
    train(GRPOConfig(steps=3, **base), toy_task())  # checkpoint at step 2, then step 3
    assert json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    train(GRPOConfig(steps=5, resume=True, **base), toy_task())
    steps = [x["step"] for x in _metrics(tmp_path)]
    assert steps == [1, 2, 3, 4, 5]  # resumed after the step-2 checkpoint: step 3 redone, written once


def test_cli_train_and_eval(tmp_path):
    out = tmp_path / "run"
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
        "8",
        "--prompts-per-step",
        "2",
        "--samples-per-prompt",
        "2",
        "--max-new-tokens",
        "4",
        "--out-dir",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "held-out greedy accuracy" in r.stdout
    saved = json.loads((out / "config.json").read_text())
    assert saved == dataclasses.asdict(
        GRPOConfig(
            model="tiny",
            steps=2,
            eval_size=8,
            prompts_per_step=2,
            samples_per_prompt=2,
            max_new_tokens=4,
            out_dir=str(out),
        )
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "nanorl.cli",
            "eval",
            "--model",
            str(out / "model"),
            "--task",
            "arithmetic",
            "--eval-size",
            "8",
            "--k",
            "2",
            "--max-new-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    metrics = json.loads(r.stdout[r.stdout.index("{") :])
    assert set(metrics) >= {"eval/greedy_acc", "eval/pass@2"}


def test_custom_reward_example_runs(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parents[1] / "examples" / "custom_reward.py"),
            "--model",
            "tiny",
            "--steps",
            "2",
            "--prompts-per-step",
            "2",
            "--samples-per-prompt",
            "2",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "held-out mean reward:" in r.stdout
    assert len(_metrics(tmp_path)) == 2


def test_plot_writes_png(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")
    from nanorl.integrations.plot import plot_run

    train(
        GRPOConfig(
            model="tiny",
            out_dir=str(tmp_path),
            steps=2,
            prompts_per_step=2,
            samples_per_prompt=2,
            max_new_tokens=4,
            eval_every=1,
            save_every=0,
        ),
        toy_task(),
    )
    png = plot_run(tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_overlays_runs_of_every_command(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")
    from nanorl.config import SFTConfig
    from nanorl.integrations.plot import SERIES, _points, _read, plot_runs
    from nanorl.sft import train as sft_train

    for name in ("a", "b"):
        train(
            GRPOConfig(
                model="tiny",
                out_dir=str(tmp_path / name),
                steps=2,
                prompts_per_step=2,
                samples_per_prompt=2,
                max_new_tokens=4,
                eval_every=1,
                save_every=0,
                lr=float(name == "a") + 1e-3,
            ),
            toy_task(),
        )
    rows = [{"prompt": f"q{i}", "completion": "aaaa"} for i in range(8)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sft_train(
        SFTConfig(
            model="tiny",
            data=str(tmp_path / "sft.jsonl"),
            out_dir=str(tmp_path / "sft"),
            batch_size=4,
            task="",
            eval_every=1,
        )
    )  # no reward, no accuracy: loss curves
    png = plot_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "cmp.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_runs([tmp_path / "sft"]).name == "curve.png"
    drawn = [k for f, k, _ in SERIES if _points(_read(tmp_path / "sft" / f"{f}.jsonl"), k)[0]]
    assert "train/loss" in drawn and "eval/nll_per_token" in drawn and "reward/mean" not in drawn
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "nanorl.cli",
            "plot",
            str(tmp_path / "a"),
            str(tmp_path / "sft"),
            "--out",
            str(tmp_path / "mixed.png"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and (tmp_path / "mixed.png").is_file(), r.stderr[-2000:]

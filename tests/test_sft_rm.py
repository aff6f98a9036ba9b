import json

import pytest
import torch
import torch.nn.functional as F

from nanorl.config import RMConfig, SFTConfig
from nanorl.models import tiny_model_and_tokenizer

pytestmark = pytest.mark.usefixtures("each_backend")  # every loop test with backends on and off


def _rows(tmp_path, rows, name="rows.jsonl"):
    f = tmp_path / name
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(f)


def test_sft_loss_is_reply_tokens_only():
    from nanorl.sft import reply_nll

    model, tok = tiny_model_and_tokenizer(seed=4)
    rows = [
        {"prompt": tok("the prompt")["input_ids"], "chosen": tok("ok!")["input_ids"] + [tok.eos_token_id]},
        {"prompt": tok("q")["input_ids"], "chosen": tok("a longer reply")["input_ids"] + [tok.eos_token_id]},
        {"prompt": tok("c")["input_ids"], "chosen": tok("ab")["input_ids"], "weight": [0.0, 1.0]},
    ]  # a turn between
    nll, n = reply_nll(model, rows, tok.pad_token_id, "cpu")
    expect, count = 0.0, 0
    for r in rows:  # reference: a plain forward over prompt + reply, scoring only the trained reply positions
        ids = torch.tensor([r["prompt"] + r["chosen"]])
        logp = F.log_softmax(model(ids).logits[0, :-1], -1)
        targets = ids[0, 1:]
        start = len(r["prompt"]) - 1  # position that predicts the first reply token
        w = torch.tensor(r.get("weight", [1.0] * len(r["chosen"])))
        expect -= (logp[start:].gather(-1, targets[start:, None])[:, 0] * w).sum().item()
        count += int(w.sum())
    assert n == count and abs(nll.item() - expect) < 1e-4


def test_sft_lowers_reply_nll_and_reads_every_format(tmp_path):
    from nanorl.sft import train
    from nanorl.tasks.preferences import load_replies

    rows = [{"prompt": f"q{i}", "completion": "aaaa"} for i in range(12)]
    rows += [
        {"messages": [{"role": "user", "content": f"m{i}"}, {"role": "assistant", "content": "aaaa"}]}
        for i in range(12)
    ]
    data = _rows(tmp_path, rows)
    assert [r.chosen or r.turns[-1]["content"] for r in load_replies(data)] == ["aaaa"] * 24
    assert load_replies("builtin:arithmetic")[0].chosen  # a preference file trains on its chosen replies
    result = train(
        SFTConfig(
            model="tiny",
            data=data,
            out_dir=str(tmp_path / "run"),
            epochs=8,
            batch_size=8,
            micro_batch_size=3,
            lr=1e-2,
            lr_schedule="constant",
            task="",
            warmup_steps=0,
            eval_every=100,
        )
    )
    assert result["after"]["eval/nll_per_token"] < 0.5 * result["before"]["eval/nll_per_token"]


def test_reward_model_learns_a_separable_preference(tmp_path):
    from nanorl.reward_model import load_reward_model, rm_scores, train

    rows = [{"prompt": f"q{i}", "chosen": "a" * (1 + i % 3), "rejected": "b" * (1 + i % 4)} for i in range(30)]
    result = train(
        RMConfig(
            model="tiny",
            data=_rows(tmp_path, rows),
            out_dir=str(tmp_path / "rm"),
            epochs=4,
            batch_size=8,
            micro_batch_size=5,
            lr=3e-3,
            warmup_steps=0,
            eval_every=100,
        )
    )
    assert result["after"]["eval/pref_acc"] == 1.0
    # saved as a Hugging Face sequence-classification model, loaded back as a reward
    rm, tok = load_reward_model(str(tmp_path / "rm" / "model"), "cpu", torch.float32)
    assert type(rm).__name__.endswith("ForSequenceClassification")
    p = tok("q1")["input_ids"]
    s = rm_scores(rm, [p, p], [tok("aa")["input_ids"], tok("bb")["input_ids"]], tok.pad_token_id, "cpu")
    assert s[0] > s[1]


def test_scores_and_values_ignore_padding_and_align_with_reply_tokens():
    from nanorl.reward_model import load_reward_model, rm_scores, token_values

    rm, tok = load_reward_model("tiny", "cpu", torch.float32)
    prompts = [tok("a prompt")["input_ids"], tok("p")["input_ids"]]
    replies = [tok("xy")["input_ids"], tok("a much longer reply")["input_ids"]]
    batch_scores = rm_scores(rm, prompts, replies, tok.pad_token_id, "cpu")
    values = token_values(rm, prompts, replies, tok.pad_token_id, "cpu")  # (2, C)
    assert values.shape == (2, len(replies[1]))
    for i in range(2):
        ids = torch.tensor([prompts[i] + replies[i]])
        h = rm.base_model(input_ids=ids).last_hidden_state[0]  # (L, H), no padding at all
        v = rm.score(h).squeeze(-1)
        assert torch.allclose(batch_scores[i], v[-1], atol=1e-5)
        n, P = len(replies[i]), len(prompts[i])
        assert torch.allclose(values[i, :n], v[P - 1 : P + n - 1], atol=1e-5)  # V(prompt + reply[:t])
        assert torch.equal(values[i, n:], torch.zeros(values.shape[1] - n))


def test_rlhf_pipeline_example_runs(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "examples" / "rlhf_pipeline.py"
    r = subprocess.run(
        [sys.executable, str(script), "--model", "tiny", "--steps", "2", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[nanorl] pipeline: sft task_greedy_acc" in r.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == {"sft", "rm", "ppo"}


def test_grpo_mixes_a_reward_model_with_the_rule_reward(tmp_path):
    from test_grpo import toy_task

    from nanorl import GRPOConfig
    from nanorl import train as grpo_train
    from nanorl.reward_model import train

    rows = [{"prompt": f"q{i}", "chosen": "aaa", "rejected": "bbb"} for i in range(10)]
    train(
        RMConfig(
            model="tiny",
            data=_rows(tmp_path, rows),
            out_dir=str(tmp_path / "rm"),
            epochs=1,
            batch_size=4,
            eval_every=100,
        )
    )
    grpo_train(
        GRPOConfig(
            model="tiny",
            reward_model=str(tmp_path / "rm" / "model"),
            rm_weight=0.5,
            out_dir=str(tmp_path / "run"),
            steps=2,
            prompts_per_step=2,
            samples_per_prompt=4,
            max_new_tokens=6,
            eval_every=100,
            save_every=0,
        ),
        toy_task(),
    )
    m = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    for x in m:  # reward = 1.0 * task + 0.5 * rm, each part logged
        assert abs(x["reward/mean"] - (x["reward/task_mean"] + 0.5 * x["reward/rm_mean"])) < 1e-5

import json
import math

import pytest
import torch

from nanorl.config import ConfigError, DPOConfig, parse_args
from nanorl.losses import dpo_loss
from nanorl.tasks.preferences import load_preferences, split

pytestmark = pytest.mark.usefixtures("each_backend")  # every loop test with backends on and off


def test_dpo_loss_is_log2_at_the_reference_and_its_gradient_prefers_chosen():
    w = torch.tensor([-5.0, -2.0], requires_grad=True)
    lo = torch.tensor([-4.0, -3.0], requires_grad=True)
    loss, st = dpo_loss(w, lo, w.detach(), lo.detach(), beta=0.1)
    assert torch.allclose(loss, torch.full((2,), math.log(2)))
    assert torch.equal(st["margin"], torch.zeros(2)) and torch.equal(st["acc"], torch.zeros(2))
    loss.sum().backward()
    # d/dw of -log sigmoid(beta h) at h = 0 is -beta/2: descending raises log pi(chosen), lowers rejected
    assert torch.allclose(w.grad, torch.full((2,), -0.05)) and torch.allclose(lo.grad, torch.full((2,), 0.05))


def test_dpo_variants_against_hand_computed_values():
    w, lo, rw, rl = torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.5])
    h = (-1 + 2) - (-3 + 2.5)  # 1.5
    beta = 0.5
    sig, st = dpo_loss(w, lo, rw, rl, beta)
    assert abs(sig.item() - math.log(1 + math.exp(-beta * h))) < 1e-6
    assert abs(st["chosen_reward"].item() - 0.5) < 1e-6 and abs(st["rejected_reward"].item() + 0.25) < 1e-6
    assert st["acc"].item() == 1.0 and abs(st["margin"].item() - 0.75) < 1e-6
    smooth, _ = dpo_loss(w, lo, rw, rl, beta, label_smoothing=0.1)
    expect = 0.9 * math.log(1 + math.exp(-beta * h)) + 0.1 * math.log(1 + math.exp(beta * h))
    assert abs(smooth.item() - expect) < 1e-6
    ipo, _ = dpo_loss(w, lo, rw, rl, beta, "ipo")
    assert abs(ipo.item() - (h - 1 / (2 * beta)) ** 2) < 1e-6
    hinge, _ = dpo_loss(w, lo, rw, rl, beta, "hinge")
    assert abs(hinge.item() - max(0.0, 1 - beta * h)) < 1e-6
    with pytest.raises(ValueError, match="'loss'"):
        dpo_loss(w, lo, rw, rl, beta, "kto")


def test_preference_files_and_their_errors(tmp_path):
    pairs = load_preferences("builtin:arithmetic")
    assert len(pairs) == 400 and all(p.chosen != p.rejected for p in pairs)
    train, held = split(pairs, 0.2, seed=0)
    assert len(held) == 80 and not {p.prompt for p in held} & {p.prompt for p in train}
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps(
            {
                "chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
                "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "go"}],
            }
        )
        + "\n"
        + json.dumps({"prompt": "x", "chosen": "a", "rejected": "b"})
        + "\n"
    )
    got = load_preferences(f)
    assert got[0].prompt == [{"role": "user", "content": "hi"}] and got[0].chosen == "hello" and got[0].rejected == "go"
    f.write_text(json.dumps({"prompt": "x", "chosen": "a"}) + "\n")
    with pytest.raises(ValueError, match=r"p.jsonl: row 1: missing field 'rejected'"):
        load_preferences(f)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_preferences(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="'loss'"):
        parse_args(DPOConfig, ["--loss", "kto"])


def test_dpo_raises_preference_accuracy_on_a_tiny_model(tmp_path):
    from transformers import AutoModelForCausalLM

    from nanorl.dpo import train
    from nanorl.models import tiny_model_and_tokenizer

    rows = [{"prompt": f"q{i}", "chosen": "aaaa", "rejected": "bbbb"} for i in range(24)]
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DPOConfig(
        model="tiny",
        data=str(data),
        out_dir=str(tmp_path / "run"),
        epochs=4,
        batch_size=8,
        micro_batch_size=3,
        lr=3e-3,
        beta=0.5,
        eval_every=3,
        task="",
        warmup_steps=0,
    )
    result = train(cfg)
    assert result["before"]["eval/reward_acc"] == 0.0 and abs(result["before"]["eval/loss"] - math.log(2)) < 1e-5
    assert result["after"]["eval/reward_acc"] == 1.0 and result["after"]["eval/loss"] < 0.5
    metrics = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert metrics[-1]["train/acc"] > metrics[0]["train/acc"]
    before = tiny_model_and_tokenizer()[0].state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_dpo_gradient_is_independent_of_micro_batch_size(tmp_path):
    from nanorl.dpo import pair_batch
    from nanorl.logprobs import sequence_logprobs
    from nanorl.models import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(seed=3)
    rows = [
        {
            "prompt": tok(f"q{i}")["input_ids"],
            "chosen": tok("a" * (i + 1))["input_ids"],
            "rejected": tok("b" * (5 - i))["input_ids"],
        }
        for i in range(5)
    ]
    grads = []
    for micro in (5, 2, 1):
        model.zero_grad()
        for s in range(0, 5, micro):
            part = rows[s : s + micro]
            logp, _ = sequence_logprobs(model, pair_batch(part, tok.pad_token_id, "cpu"))
            b = len(part)
            loss, _ = dpo_loss(logp[:b], logp[b:], torch.zeros(b), torch.zeros(b), 0.1)
            (loss.sum() / 5).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    for g in grads[1:]:
        assert torch.allclose(grads[0], g, atol=1e-6, rtol=1e-4)

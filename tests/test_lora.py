"""LoRA through peft: only adapters train, the reference is the base with the adapters off, checkpoints hold the
adapter, the final model merges (or not), an adapter folder continues, and the sampler's log-probs still equal
the learner's."""

import json

import pytest
import torch
from test_grpo import toy_task
from test_variants import varied_task

from nanorl import GRPOConfig, train
from nanorl.config import ConfigError, DPOConfig, PPOConfig, RMConfig, SFTConfig, validate
from nanorl.models import load_model, tiny_model_and_tokenizer

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("each_backend")  # with backends on and off

SMALL = dict(
    model="tiny",
    steps=3,
    prompts_per_step=2,
    samples_per_prompt=4,
    max_new_tokens=6,
    lr=3e-2,
    warmup_steps=0,
    eval_every=100,
    save_every=0,
    eval_size=4,
    lora_r=4,
)


def _metrics(path):
    return [json.loads(x) for x in open(path / "metrics.jsonl")]


def test_grpo_with_lora_trains_only_adapters_and_merges_the_final_model(tmp_path):
    from transformers import AutoModelForCausalLM

    train(GRPOConfig(out_dir=str(tmp_path / "run"), kl_coef=0.1, **SMALL), varied_task())
    base = tiny_model_and_tokenizer()[0]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")  # no peft needed: merged
    assert not (tmp_path / "run" / "model" / "adapter_config.json").exists()
    changed = {k for k, v in base.state_dict().items() if not torch.equal(v, merged.state_dict()[k])}
    assert changed and all("proj" in k for k in changed)  # adapters folded into the projections only
    assert not any("embed" in k or "norm" in k for k in changed)
    m = _metrics(tmp_path / "run")
    assert m[0]["reward/kl_penalty"] == 0 and abs(m[0]["loss/kl"]) < 1e-6  # the reference is the starting model
    assert m[-1]["loss/kl"] > 0  # ... and the adapters moved away from it


def test_optimizer_holds_adapter_state_only_and_the_reference_is_the_base(tmp_path):
    from nanorl.integrations.lora import AdapterOff
    from nanorl.learner import make_optimizer
    from nanorl.models import trainable

    cfg = GRPOConfig(**{**SMALL, "lora_target": "q_proj,v_proj"})
    model = trainable(load_model("tiny")[0], cfg)
    opt, _ = make_optimizer(model, GRPOConfig(lr=1e-3, warmup_steps=0, lr_schedule="constant"), 10)
    params = [p for g in opt.param_groups for p in g["params"]]
    names = {id(p): n for n, p in model.named_parameters()}
    assert params and all("lora_" in names[id(p)] for p in params)
    assert len(params) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        for p in params:
            p.add_(0.5)  # adapters that change the function
        base = tiny_model_and_tokenizer()[0](input_ids=ids).logits
        assert torch.allclose(AdapterOff(model)(input_ids=ids).logits, base, atol=1e-6)
        assert not torch.allclose(model(input_ids=ids).logits, base, atol=1e-3)


def test_lora_checkpoints_resume_and_an_adapter_folder_continues(tmp_path):
    run = tmp_path / "run"
    train(GRPOConfig(out_dir=str(run), **{**SMALL, "steps": 2, "save_every": 1, "merge_lora": False}), toy_task())
    assert (run / "model" / "adapter_config.json").is_file()  # the adapter alone
    train(
        GRPOConfig(out_dir=str(run), resume=True, **{**SMALL, "steps": 3, "save_every": 1, "merge_lora": False}),
        toy_task(),
    )
    assert (run / "checkpoint" / "adapter_config.json").is_file()
    assert [x["step"] for x in _metrics(run)] == [1, 2, 3]  # step 2 redone after the step-1 checkpoint, once
    model, _ = load_model(str(run / "model"))  # an adapter folder loads as base + adapter
    assert hasattr(model, "peft_config")
    out = train(
        GRPOConfig(out_dir=str(tmp_path / "more"), **{**SMALL, "model": str(run / "model"), "lora_r": 0}), toy_task()
    )
    assert out["steps"] == 3


def test_sampler_logprobs_equal_the_learners_with_adapters(tmp_path):
    from nanorl.data import collate
    from nanorl.logprobs import token_logprobs
    from nanorl.models import stop_token_ids, trainable
    from nanorl.sampling import SamplingParams, generate

    model, tok = load_model("tiny")
    model = trainable(model, GRPOConfig(lora_r=4))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.5)  # B starts at 0: give the adapters an effect
    prompts = [tok("ab")["input_ids"], tok("a longer one")["input_ids"]]
    roll = generate(
        model, prompts, 3, SamplingParams(max_new_tokens=8), stop_token_ids(model, tok), seed=0, pad_id=tok.pad_token_id
    )
    logp, _ = token_logprobs(model, collate(roll.prompt_ids, roll.completion_ids, tok.pad_token_id, "cpu"))
    for i, lp in enumerate(roll.logprobs):
        torch.testing.assert_close(logp[i, : len(lp)].detach(), lp, atol=1e-4, rtol=1e-4)


def test_dpo_sft_rm_and_ppo_take_lora(tmp_path):
    from nanorl.dpo import train as dpo_train
    from nanorl.ppo import train as ppo_train
    from nanorl.reward_model import load_reward_model
    from nanorl.reward_model import train as rm_train
    from nanorl.sft import train as sft_train

    rows = [{"prompt": f"q{i}", "chosen": "aaaa", "rejected": "bbbb"} for i in range(8)]
    data = tmp_path / "prefs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    small = dict(
        model="tiny",
        data=str(data),
        epochs=1,
        batch_size=4,
        micro_batch_size=2,
        lr=1e-2,
        task="",
        warmup_steps=0,
        lora_r=4,
        merge_lora=False,
    )
    dpo_train(DPOConfig(out_dir=str(tmp_path / "dpo"), **small))
    sft_train(SFTConfig(out_dir=str(tmp_path / "sft"), **small))
    for name in ("dpo", "sft"):
        assert (tmp_path / name / "model" / "adapter_config.json").is_file()
    rm_small = {k: v for k, v in small.items() if k != "task"}  # a reward model has no task: it does not generate
    rm_train(RMConfig(out_dir=str(tmp_path / "rm"), **{**rm_small, "merge_lora": True}))
    rm, _ = load_reward_model(str(tmp_path / "rm" / "model"), "cpu")  # merged: a plain classifier
    assert not hasattr(rm, "peft_config") and rm.score.weight.abs().sum() > 0  # the head trained in full
    ppo = dict(out_dir=str(tmp_path / "ppo"), minibatch_size=4, **{**SMALL, "steps": 2, "save_every": 1})
    ppo_train(PPOConfig(**ppo), toy_task())
    assert (tmp_path / "ppo" / "critic" / "adapter_config.json").is_file()  # the critic trained adapters too
    ppo_train(PPOConfig(**{**ppo, "steps": 3, "resume": True}), toy_task())  # its checkpoint loads back
    critic, _ = load_reward_model(str(tmp_path / "ppo" / "critic"), "cpu")
    assert hasattr(critic, "peft_config")


def test_lora_settings_that_cannot_work_are_refused():
    with pytest.raises(ConfigError, match="lora_dropout"):
        validate(GRPOConfig(lora_r=4, lora_dropout=0.1))
    with pytest.raises(ConfigError, match="lora_r"):
        validate(GRPOConfig(lora_r=-1))
    from nanorl.models import trainable

    with pytest.raises(ValueError, match="lora_target"):
        trainable(load_model("tiny")[0], GRPOConfig(lora_r=4, lora_target="no_such_proj"))


def test_a_causal_lm_adapter_folder_is_a_reward_model_or_critic_base(tmp_path):
    """A LoRA adapter of a causal LM (`nanorl train --lora-r ...` with --merge-lora false) as the base of a reward
    model or PPO's critic: its weights with the adapter folded in, under a fresh scalar head (it was loaded as a
    sequence-classification adapter before, and failed)."""
    from types import SimpleNamespace

    from nanorl.integrations.lora import add_adapters
    from nanorl.models import load_model
    from nanorl.reward_model import load_reward_model

    model, tok = load_model("tiny")
    model = add_adapters(model, SimpleNamespace(lora_r=4, lora_alpha=8.0, lora_dropout=0.0, lora_target="all-linear"))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a trained adapter: B is no longer 0
            torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(0))
    model.save_pretrained(tmp_path / "adapter", save_embedding_layers=False)
    tok.save_pretrained(tmp_path / "adapter")
    rm, _ = load_reward_model(str(tmp_path / "adapter"), "cpu")
    merged = model.merge_and_unload()
    assert type(rm).__name__.endswith("ForSequenceClassification") and not hasattr(rm, "peft_config")
    w = rm.base_model.state_dict()
    assert all(torch.equal(w[k], v) for k, v in merged.model.state_dict().items())
    assert torch.count_nonzero(rm.score.weight) == 0  # a fresh head

"""The GRPO family as settings of one loop: presets, dynamic sampling, overlong rules, KL placement."""

import json

import pytest
import torch
from test_grpo import toy_task

from nanorl import Example, Task, train
from nanorl.advantages import ESTIMATORS
from nanorl.config import PRESETS, ConfigError, GRPOConfig, parse_args, preset, validate
from nanorl.models import stop_token_ids, tiny_model_and_tokenizer
from nanorl.online import informative_groups
from nanorl.sampling import SamplingParams, generate
from nanorl.update import learner_logprobs, policy_backward

pytestmark = pytest.mark.usefixtures("each_backend")  # every loop test with backends on and off

SMALL = dict(
    model="tiny",
    steps=2,
    prompts_per_step=2,
    samples_per_prompt=4,
    max_new_tokens=6,
    lr=1e-2,
    warmup_steps=0,
    eval_every=100,
    save_every=0,
)


def varied_task():
    """A reward that differs between almost any two random completions (the share of lowercase letters),
    so every step has groups with signal whatever the sampler draws."""
    return Task(
        "lowercase",
        train=[Example(f"q{i}") for i in range(40)],
        eval=[Example(f"e{i}") for i in range(4)],
        reward=lambda prompt, completion, **_: sum(c.islower() for c in completion) / max(len(completion), 1),
    )


def _metrics(out_dir):
    return [json.loads(line) for line in open(out_dir / "metrics.jsonl")]


@pytest.mark.parametrize("algo", list(PRESETS))
def test_every_algorithm_runs_and_changes_parameters(tmp_path, algo):
    from transformers import AutoModelForCausalLM

    cfg = preset(algo, out_dir=str(tmp_path), **SMALL)
    for key, value in PRESETS[algo].items():
        assert getattr(cfg, key) == SMALL.get(key, value)  # the preset, unless given
    train(cfg, varied_task())
    before = tiny_model_and_tokenizer()[0].state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert len(_metrics(tmp_path)) == 2


def test_presets_from_the_command_line_and_explicit_keys_win():
    cfg = parse_args(GRPOConfig, ["--algo", "dapo", "--clip-high", "0.3"])
    assert (cfg.clip_low, cfg.clip_high, cfg.dynamic_sampling, cfg.overlong) == (0.2, 0.3, 3, "soft")
    assert parse_args(GRPOConfig, ["--algo", "dr_grpo"]).loss_agg == "constant"
    with pytest.raises(ConfigError, match="'algo'"):
        parse_args(GRPOConfig, ["--algo", "ppo2"])
    with pytest.raises(ConfigError, match="preset"):
        validate(GRPOConfig(algo="dapo"))  # the preset's knobs were not applied
    with pytest.raises(ConfigError, match="'loss_agg'"):
        validate(GRPOConfig(loss_agg="mean"))
    with pytest.raises(ConfigError, match="'overlong_buffer'"):
        validate(GRPOConfig(overlong="soft", overlong_buffer=64))


def test_informative_groups_and_rollout_selection():
    r = torch.tensor([1.0, 1, 0, 1, 0.3, 0.3, 0, 0.5])
    assert informative_groups(r, 2) == [1, 3]
    model, tok = tiny_model_and_tokenizer()
    roll = generate(model, [[1, 2], [3], [4, 5, 6]], 2, SamplingParams(max_new_tokens=3), [0], seed=0)
    sub = roll.groups([2, 0])
    assert sub.prompt_ids == [[4, 5, 6]] * 2 + [[1, 2]] * 2
    assert sub.completion_ids == roll.completion_ids[4:6] + roll.completion_ids[0:2]
    assert (sub + sub).completion_ids == sub.completion_ids * 2


def _half_flat_reward(prompt, completion, **_):
    """Odd prompts always score 0 (a group with no variance); even prompts score completion variety."""
    return 0.0 if int(prompt[1:]) % 2 else len(set(completion)) / 10


def test_dynamic_sampling_trains_only_on_groups_with_variance(tmp_path):
    task = Task(
        "half-flat", train=[Example(f"q{i}") for i in range(40)], eval=[Example("q0")], reward=_half_flat_reward
    )
    train(GRPOConfig(out_dir=str(tmp_path), dynamic_sampling=3, **{**SMALL, "steps": 4}), task)
    m = _metrics(tmp_path)
    assert any(x["rollout/refills"] > 0 for x in m)
    for x in m:  # the trained batch is full and every group in it has variance
        assert x["rollout/groups"] == 2 and x["rollout/informative_groups"] == 2
    # without dynamic sampling the flat groups stay in the batch
    train(GRPOConfig(out_dir=str(tmp_path / "plain"), **{**SMALL, "steps": 4}), task)
    assert any(x["rollout/informative_groups"] < 2 for x in _metrics(tmp_path / "plain"))


def test_overlong_filter_trains_on_no_truncated_completion(tmp_path):
    train(GRPOConfig(out_dir=str(tmp_path), overlong="filter", **{**SMALL, "max_new_tokens": 2}), toy_task())
    for x in _metrics(tmp_path):
        if x["rollout/truncated_frac"] == 1.0:
            assert x["policy/trained_tokens"] == 0


def test_soft_overlong_penalty_shapes_the_reward(tmp_path):
    train(GRPOConfig(out_dir=str(tmp_path), overlong="soft", overlong_buffer=4, **SMALL), toy_task())
    for x in _metrics(tmp_path):  # every completion of 6 tokens is inside the buffer: penalty -1/2..-1
        assert x["reward/shaped_mean"] < x["reward/trained_mean"]


def test_kl_in_the_reward_is_zero_at_start_and_not_in_the_loss(tmp_path):
    train(
        GRPOConfig(
            out_dir=str(tmp_path), kl_coef=0.5, kl_placement="reward", kl_estimator="k1", **{**SMALL, "steps": 3}
        ),
        toy_task(),
    )
    m = _metrics(tmp_path)
    assert abs(m[0]["reward/kl_penalty"]) < 1e-4  # the policy is the reference before the first update
    assert abs(m[-1]["reward/kl_penalty"]) > 1e-3
    assert all(x["loss/kl"] == 0.0 for x in m)


@pytest.mark.parametrize(
    "loss_agg,ratio_level,estimator",
    [("token", "token", "group"), ("sequence", "sequence", "rloo"), ("constant", "token", "batch")],
)
def test_gradient_independent_of_micro_batch_for_every_mode(loss_agg, ratio_level, estimator):
    model, tok = tiny_model_and_tokenizer(seed=2)
    prompts = [tok("ab")["input_ids"], tok("a longer one")["input_ids"], tok("c")["input_ids"]]
    roll = generate(
        model, prompts, 4, SamplingParams(max_new_tokens=9), stop_token_ids(model, tok), seed=1, pad_id=tok.pad_token_id
    )
    adv = ESTIMATORS[estimator](torch.tensor([float(len(c) % 3) for c in roll.completion_ids]), 4, True)
    grads = []
    for micro in (12, 5, 1):
        cfg = GRPOConfig(micro_batch_size=micro, loss_agg=loss_agg, ratio_level=ratio_level)
        model.zero_grad()
        policy_backward(model, roll, adv, list(range(12)), cfg, on_policy=True, pad_id=tok.pad_token_id, device="cpu")
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert grads[0].abs().max() > 0
    for g in grads[1:]:
        assert torch.allclose(grads[0], g, atol=1e-6, rtol=1e-4)


def _rollout(seed=2, n=4, new=9):
    model, tok = tiny_model_and_tokenizer(seed=seed)
    prompts = [tok("ab")["input_ids"], tok("a longer one")["input_ids"], tok("c")["input_ids"]]
    roll = generate(
        model,
        prompts,
        n,
        SamplingParams(max_new_tokens=new),
        stop_token_ids(model, tok),
        seed=1,
        pad_id=tok.pad_token_id,
    )
    return model, tok, roll


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate"])
def test_mismatch_correction_weighs_each_token_by_its_truncated_or_masked_ratio(mode):
    """On-policy the ratio is 1, so weighting a token's loss by w = f(pi_learner / pi_sampler) must give the
    gradient of advantages A * w without any correction. The sampler's log-probs are the learner's shifted
    by known amounts, so w is known by hand: rho = exp(-shift)."""
    from nanorl.losses import mismatch_weights

    model, tok, roll = _rollout()
    learner = learner_logprobs(model, roll, GRPOConfig(), tok.pad_token_id, "cpu")
    # per token -0.9 .. 0.9, plus a per-sequence offset so that sequence-level ratios differ from 1 as well
    shifts = [torch.linspace(-0.9, 0.9, len(lp)) + 0.3 * (i % 3 - 1) for i, lp in enumerate(learner)]
    roll.logprobs = [lp + s for lp, s in zip(learner, shifts)]
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0] * 3)  # (N,) per sequence
    rows = list(range(12))
    cfg = GRPOConfig(micro_batch_size=12, is_mode=mode, is_cap=1.8)
    model.zero_grad()
    st = policy_backward(model, roll, adv, rows, cfg, on_policy=True, pad_id=tok.pad_token_id, device="cpu")
    corrected = _grads(model)
    C = max(len(c) for c in roll.completion_ids)
    mask = torch.zeros(12, C)
    shift = torch.zeros(12, C)
    for i, s in enumerate(shifts):
        mask[i, : len(s)], shift[i, : len(s)] = 1, s
    w, _ = mismatch_weights(-shift, torch.zeros(12, C), mask, mode, 1.8)  # rho = exp(-shift) by hand
    model.zero_grad()
    policy_backward(
        model,
        roll,
        adv[:, None] * w,
        rows,
        GRPOConfig(micro_batch_size=12),
        on_policy=True,
        pad_id=tok.pad_token_id,
        device="cpu",
    )
    assert corrected.abs().max() > 0
    torch.testing.assert_close(corrected, _grads(model), rtol=1e-4, atol=1e-6)
    assert 0 < st["is_cut"] < st["tokens"]  # some tokens truncated or masked, not all


def test_entropy_bonus_alone_raises_the_entropy():
    model, tok, roll = _rollout()
    cfg = GRPOConfig(micro_batch_size=12, entropy_coef=1.0)
    before = policy_backward(
        model, roll, torch.zeros(12), list(range(12)), cfg, on_policy=True, pad_id=tok.pad_token_id, device="cpu"
    )
    assert before["tokens"] > 0  # zero advantages, yet trained: the bonus has a gradient
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.5 * p.grad
    model.zero_grad()
    after = policy_backward(
        model, roll, torch.zeros(12), list(range(12)), cfg, on_policy=True, pad_id=tok.pad_token_id, device="cpu"
    )
    assert after["entropy"] > before["entropy"]


def test_loop_with_dual_clip_entropy_bonus_and_mismatch_correction_off_policy(tmp_path):
    train(
        GRPOConfig(
            out_dir=str(tmp_path),
            clip_ratio_c=3.0,
            entropy_coef=0.01,
            is_mode="token_truncate",
            minibatch_size=4,
            epochs=2,
            **SMALL,
        ),
        varied_task(),
    )
    for x in _metrics(tmp_path):  # the sampler and the learner share their kernels: ratios ~1, nothing cut
        assert abs(x["policy/is_ratio_mean"] - 1) < 1e-3 and x["policy/is_cut_frac"] == 0
        assert "policy/dual_clip_frac" in x
    with pytest.raises(ConfigError, match="clip_ratio_c"):
        validate(GRPOConfig(clip_ratio_c=0.5))
    with pytest.raises(ConfigError, match="is_mode"):
        validate(GRPOConfig(is_mode="tis"))

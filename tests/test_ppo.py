import json

import pytest
import torch
from test_grpo import toy_task

from nanorl.advantages import gae, whiten
from nanorl.config import ConfigError, PPOConfig, parse_args
from nanorl.losses import value_loss
from nanorl.ppo import explained_variance, train

pytestmark = pytest.mark.usefixtures("each_backend")  # every loop test with backends on and off


def _naive_gae(rewards, values, lengths, gamma, lam):
    """Textbook GAE, one sequence at a time with a Python loop over its real tokens."""
    adv = torch.zeros_like(rewards)
    for i, n in enumerate(lengths):
        running = 0.0
        for t in reversed(range(n)):
            next_v = values[i, t + 1].item() if t + 1 < n else 0.0
            delta = rewards[i, t].item() + gamma * next_v - values[i, t].item()
            running = delta + gamma * lam * running
            adv[i, t] = running
    return adv


def test_gae_matches_a_naive_reversed_loop():
    g = torch.Generator().manual_seed(0)
    lengths = [5, 2, 7, 1]
    mask = torch.zeros(4, 7)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    rewards = torch.randn(4, 7, generator=g) * mask
    values = torch.randn(4, 7, generator=g) * mask
    for gamma, lam in [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0)]:
        adv, ret = gae(rewards, values, mask, gamma, lam)
        assert torch.allclose(adv, _naive_gae(rewards, values, lengths, gamma, lam), atol=1e-5)
        assert torch.allclose(ret, (adv + values) * mask)
    # lambda = 1, gamma = 1: the return is the sum of the rewards still to come
    _, ret = gae(rewards, values, mask, 1.0, 1.0)
    for i, n in enumerate(lengths):
        for t in range(n):
            assert abs(ret[i, t].item() - rewards[i, t:n].sum().item()) < 1e-5


def test_whiten_over_real_tokens_only():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 0, 0]])
    w = whiten(x, mask)
    real = torch.tensor([1.0, 2, 3, 4])
    expect = (real - real.mean()) / real.std(correction=0)
    assert torch.allclose(w[mask.bool()], expect, atol=1e-5)
    assert torch.equal(w[~mask.bool()], torch.zeros(2))


def test_value_clip_frac_reads_the_clamp_not_rounding():
    # |V - old| = 0.1 < clip 0.2, but old + (V - old) != V in float32: not clipped
    v_old, v, ret = torch.tensor([[0.1]]), torch.tensor([[1e-8]]), torch.tensor([[1.0]])
    assert (v_old + (v - v_old)).item() != v.item()
    loss, st = value_loss(v, v_old, ret, clip=0.2)
    assert st["clipped"].item() == 0.0


def test_value_loss_clipping_by_hand():
    v_old, ret = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, -1.0]])
    v = torch.tensor([[0.5, 0.5]])
    loss, st = value_loss(v, v_old, ret, clip=0.2)
    # token 0: unclipped (0.5-1)^2 = .25, clipped (0.2-1)^2 = .64 -> max .64; token 1: (1.5)^2 = 2.25 vs (1.2)^2 -> 2.25
    assert torch.allclose(loss, torch.tensor([[0.32, 1.125]]))
    assert st["clipped"].tolist() == [[1.0, 0.0]]
    loss, _ = value_loss(v, v_old, ret, clip=0.0)
    assert torch.allclose(loss, torch.tensor([[0.125, 1.125]]))


def test_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    mask = torch.tensor([[1.0, 1, 1, 0]])
    assert abs(explained_variance(ret.clone(), ret, mask) - 1.0) < 1e-6
    assert abs(explained_variance(torch.full_like(ret, 2.0), ret, mask)) < 1e-6


def test_ppo_raises_reward_on_a_toy_task(tmp_path):
    from transformers import AutoModelForSequenceClassification

    cfg = PPOConfig(
        model="tiny",
        out_dir=str(tmp_path),
        steps=30,
        prompts_per_step=8,
        samples_per_prompt=4,
        max_new_tokens=8,
        lr=3e-3,
        critic_lr=3e-3,
        kl_coef=0.01,
        warmup_steps=0,
        eval_every=100,
        save_every=0,
        target_kl=1.0,
        epochs=2,
        minibatch_size=0,
    )
    train(cfg, toy_task())
    m = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    first, last = sum(x["reward/mean"] for x in m[:5]) / 5, sum(x["reward/mean"] for x in m[-5:]) / 5
    assert last > first + 0.3, (first, last)
    assert all(x["ppo/epochs_run"] <= 2 for x in m)
    assert m[-1]["value/explained_variance"] > m[0]["value/explained_variance"]
    for key in ("value/loss", "value/clip_frac", "returns/mean", "adv/std", "reward/kl_penalty", "policy/approx_kl"):
        assert key in m[-1]
    assert AutoModelForSequenceClassification.from_pretrained(tmp_path / "critic").config.num_labels == 1


def test_ppo_resumes_with_its_critic(tmp_path):
    base = dict(
        model="tiny",
        out_dir=str(tmp_path),
        prompts_per_step=2,
        samples_per_prompt=2,
        max_new_tokens=4,
        lr=1e-3,
        eval_every=100,
        save_every=2,
        minibatch_size=2,
    )
    train(PPOConfig(steps=3, is_mode="sequence_mask", clip_ratio_c=3.0, **base), toy_task())
    assert (tmp_path / "checkpoint" / "critic" / "config.json").is_file()  # policy and critic: one folder, one step
    train(PPOConfig(steps=4, resume=True, is_mode="sequence_mask", clip_ratio_c=3.0, **base), toy_task())
    assert [json.loads(x)["step"] for x in open(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]


def test_ppo_is_its_own_command_with_its_own_config():
    from nanorl.config import GRPOConfig

    cfg = parse_args(PPOConfig, ["--gamma", "0.9", "--kl-coef", "0.05"])
    assert (cfg.gamma, cfg.kl_coef, cfg.kl_estimator, cfg.samples_per_prompt, cfg.out_dir) == (
        0.9,
        0.05,
        "k1",
        4,
        "runs/ppo",
    )
    with pytest.raises(ConfigError, match="nanorl ppo"):  # the old spelling names the new command
        parse_args(GRPOConfig, ["--algo", "ppo"])
    with pytest.raises(ConfigError, match="unknown config key 'gamma'"):  # PPO's fields are not GRPO's
        parse_args(GRPOConfig, ["--gamma", "0.9"])
    with pytest.raises(ConfigError, match="unknown config key 'adv_estimator'"):
        parse_args(PPOConfig, ["--adv-estimator", "rloo"])

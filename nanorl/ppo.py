"""PPO with a learned critic, in the RLHF form (Schulman et al. 2017, arXiv 1707.06347; Ouyang et al.
2022, arXiv 2203.02155), in one visible loop.

    nanorl train --algo ppo                               # SmolLM2-135M-Instruct, two-digit addition
    nanorl train --algo ppo --reward-model runs/rm/model  # a learned reward, alone or with the rule reward
    nanorl train --algo ppo --model tiny --steps 3        # smoke run

Each step: rollout -> sequence reward -> per-token rewards (a detached per-token KL penalty to the
reference, -kl_coef * k1, with the sequence reward added at the last token) -> critic values ->
GAE(gamma, lambda) -> whitened advantages -> `epochs` passes of minibatches, each a clipped policy
step (the same `backward_minibatch` as GRPO, with per-token advantages) and a clipped value step
with its own optimizer and learning rate; the epochs stop early once the approximate KL to the
rollout policy passes `target_kl`.
The critic is a scalar head on a copy of the policy's backbone (or on a reward model, `critic_model`),
the same class a reward model is (`reward_model.token_values`).
Deviations: dropout stays off; advantages are whitened over the whole batch once per step.
"""

from __future__ import annotations

import time

import torch

from nanorl import checkpoint
from nanorl.advantages import gae, whiten
from nanorl.config import GRPOConfig
from nanorl.grpo import backward_minibatch, merge_stats, reward_metrics, rollout_metrics, rows_batch, update_metrics
from nanorl.learner import make_optimizer, optimizer_step
from nanorl.losses import kl_penalty, value_loss
from nanorl.models import token_logprobs
from nanorl.reward_model import load_reward_model, token_values
from nanorl.rl import Run, prompt_order
from nanorl.tasks import Task


def padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack 1-D tensors of different lengths into (N, width), padding with 0."""
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over real tokens: 1 is a perfect critic, 0 no better than a constant."""
    m = mask.bool()
    var = returns[m].var(correction=0)
    return (1 - (returns[m] - values[m]).var(correction=0) / var).item() if var > 0 else float("nan")


def train(cfg: GRPOConfig, task: Task | None = None) -> dict:
    # ------------------------------------------------------------------ setup
    run = Run(cfg, task, "ppo")
    policy, ref, task, G, device, pad_id = run.policy, run.ref, run.task, cfg.samples_per_prompt, run.device, run.pad_id
    critic_dir = run.out / "checkpoint_critic"
    critic_from = str(critic_dir) if run.resuming else (cfg.critic_model or cfg.model)
    critic, _ = load_reward_model(critic_from, device, run.dtype, run.autocast)
    critic.eval()  # no dropout
    batch = cfg.prompts_per_step * G
    mb_size = cfg.minibatch_size or batch
    opt_steps_per_batch = cfg.epochs * (batch // mb_size)
    total = cfg.steps * opt_steps_per_batch
    opt, sched = make_optimizer(policy, cfg.lr, cfg.weight_decay, cfg.warmup_steps, total, cfg.lr_schedule)
    critic_opt, critic_sched = make_optimizer(critic, cfg.critic_lr, cfg.weight_decay, cfg.warmup_steps, total,
                                              cfg.lr_schedule)

    def critic_state():  # saved with every resumable checkpoint
        checkpoint.save(critic_dir, critic, run.tok)
        return {"critic_optimizer": critic_opt.state_dict(), "critic_scheduler": critic_sched.state_dict()}

    def restore_critic(state):
        critic_opt.load_state_dict(state["critic_optimizer"])
        critic_sched.load_state_dict(state["critic_scheduler"])

    for step in run.steps(opt, sched, restore_critic):
        # -------------------------------------------------------------- rollout + reward
        t0, timer = time.perf_counter(), {"rollout": 0.0, "reward": 0.0, "tokens": 0}
        examples = [task.train[i] for i in prompt_order(len(task.train), cfg.seed, step, cfg.prompts_per_step)]
        roll, texts, rewards, parts = run.rollout_and_score(examples, cfg.seed * 1_000_003 + step, timer)  # (N,)
        t2 = time.perf_counter()

        # -------------------------------------------------------------- values, KL, per-token rewards
        C = max(len(c) for c in roll.completion_ids)
        mask = padded([torch.ones(len(c)) for c in roll.completion_ids], C)  # (N, C)
        sampler_logp = padded(roll.logprobs, C)  # (N, C) the rollout policy's log-probs
        old_values, ref_logp = torch.zeros(batch, C), sampler_logp.clone()
        with torch.no_grad():
            for s in range(0, batch, cfg.micro_batch_size):
                idx = list(range(s, min(s + cfg.micro_batch_size, batch)))
                v = token_values(critic, [roll.prompt_ids[i] for i in idx], [roll.completion_ids[i] for i in idx],
                                 pad_id, device)  # (b, c)
                old_values[idx, :v.shape[1]] = v.cpu()
                if ref is not None:
                    r, _ = token_logprobs(ref, rows_batch(roll, idx, pad_id, device), cfg.temperature)  # (b, c)
                    ref_logp[idx, :r.shape[1]] = r.cpu()
        kl = kl_penalty(sampler_logp, ref_logp, cfg.kl_estimator) * mask  # (N, C), 0 without a reference
        token_rewards = -cfg.kl_coef * kl
        last = mask.sum(-1).long() - 1  # (N,) index of each completion's last token
        token_rewards[torch.arange(batch), last] += rewards  # the sequence reward arrives at the end

        # -------------------------------------------------------------- advantage (GAE)
        adv_raw, returns = gae(token_rewards, old_values, mask, cfg.gamma, cfg.gae_lambda)  # (N, C)
        adv = whiten(adv_raw, mask)

        # -------------------------------------------------------------- update: actor and critic
        sums, vsums, epochs_run = {}, {"loss": 0.0, "clipped": 0.0}, 0
        shuffle = torch.Generator().manual_seed(cfg.seed * 7_919 + step)
        for _epoch in range(cfg.epochs):
            epochs_run += 1
            perm = torch.randperm(batch, generator=shuffle).tolist()
            kl_sum, kl_tokens = 0.0, 0
            for mb_start in range(0, batch, mb_size):
                mb = perm[mb_start:mb_start + mb_size]
                stats = backward_minibatch(policy, ref, roll, adv, mb, cfg, False, pad_id, device)
                stats["grad_norm"] = optimizer_step(policy, opt, sched, cfg.grad_clip)
                merge_stats(sums, stats)
                kl_sum, kl_tokens = kl_sum + stats["approx_kl"], kl_tokens + stats["tokens"]
                n_tokens = int(mask[mb].sum())  # the critic's normaliser: tokens of the whole minibatch
                for s in range(0, len(mb), cfg.micro_batch_size):
                    idx = mb[s:s + cfg.micro_batch_size]
                    v = token_values(critic, [roll.prompt_ids[i] for i in idx], [roll.completion_ids[i] for i in idx],
                                     pad_id, device)  # (b, c)
                    c = v.shape[1]
                    vl, vst = value_loss(v, old_values[idx, :c].to(device), returns[idx, :c].to(device), cfg.value_clip)
                    m = mask[idx, :c].to(device)
                    loss = (vl * m).sum() / n_tokens
                    loss.backward()
                    vsums["loss"] += loss.item()
                    vsums["clipped"] += (vst["clipped"] * m).sum().item()
                optimizer_step(critic, critic_opt, critic_sched, cfg.grad_clip)
            if cfg.target_kl and kl_sum / max(kl_tokens, 1) > cfg.target_kl:  # early stop (approximate KL)
                break
        t3 = time.perf_counter()

        # -------------------------------------------------------------- log / eval / checkpoint
        n_mb, m = epochs_run * (batch // mb_size), mask.bool()
        metrics = {
            "step": step + 1, **reward_metrics(rewards, parts, G), "reward/kl_penalty": kl.sum(-1).mean().item(),
            **rollout_metrics(roll), **update_metrics(sums, n_mb), "optim/lr": sched.get_last_lr()[0],
            "value/loss": vsums["loss"] / n_mb, "value/clip_frac": vsums["clipped"] / (epochs_run * m.sum().item()),
            "value/explained_variance": explained_variance(old_values, returns, mask),
            "value/mean": old_values[m].mean().item(), "returns/mean": returns[m].mean().item(),
            "adv/mean": adv_raw[m].mean().item(), "adv/std": adv_raw[m].std(correction=0).item(),
            "ppo/epochs_run": epochs_run,
            "time/rollout": timer["rollout"], "time/reward": timer["reward"], "time/update": t3 - t2,
            "time/step": t3 - t0, "perf/rollout_tokens_per_s": timer["tokens"] / timer["rollout"],
            "perf/update_tokens_per_s": sums["tokens"] / max(t3 - t2, 1e-9),
        }
        run.end_step(step, metrics, examples, texts, rewards, roll, opt, sched, critic_state)

    # ------------------------------------------------------------------ finish
    checkpoint.save(run.out / "critic", critic, run.tok)
    return run.finish()

"""PPO with a learned critic, in the RLHF form (Schulman et al. 2017, arXiv 1707.06347; Ouyang et al.
2022, arXiv 2203.02155), in one visible loop.

    nanorl ppo                                    # SmolLM2-135M-Instruct, two-digit addition
    nanorl ppo --reward-model runs/rm/model       # a learned reward, alone or with the rule reward
    nanorl ppo --model tiny --steps 3             # smoke run

Each step: rollout -> sequence reward -> per-token rewards (a detached per-token KL penalty to the
reference, -kl_coef * k1, with the sequence reward added at the last token) -> critic values ->
GAE(gamma, lambda) -> whitened advantages -> `epochs` passes of minibatches, each a clipped policy
step (the same `update.policy_backward` as GRPO, with per-token advantages) and a clipped value step
with its own optimizer and learning rate; the epochs stop early once the approximate KL to the
rollout policy passes `target_kl`.
The critic is a scalar head on a copy of the policy's backbone (or on a reward model, `critic_model`),
the same class a reward model is (`reward_model.token_values`).
Deviations: dropout stays off; advantages are whitened over the whole batch once per step.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from nanorl import checkpoint, distributed, online
from nanorl.advantages import gae, whiten
from nanorl.config import PPOConfig
from nanorl.data import chunks, right_pad
from nanorl.errors import ConfigError
from nanorl.learner import make_optimizer, optimizer_step
from nanorl.logger import make_logger
from nanorl.losses import kl_penalty
from nanorl.models import stop_token_ids, trainable
from nanorl.reward_model import load_reward_model, token_values
from nanorl.seeds import derive_seed
from nanorl.update import learner_logprobs, merge_stats, policy_backward, update_metrics, value_backward


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over real tokens: 1 is a perfect critic, 0 no better than a constant."""
    m = mask.bool()
    var = returns[m].var(correction=0)
    return (1 - (returns[m] - values[m]).var(correction=0) / var).item() if var > 0 else float("nan")


def train(cfg: PPOConfig, task=None, *, reward_funcs=None, callbacks=()) -> dict:
    """From Python, besides the config: a Task or a datasets.Dataset, reward functions (nanorl's or TRL's form),
    and callbacks fn(step, metrics)."""
    # ------------------------------------------------------------------ setup
    if not isinstance(cfg, PPOConfig):
        raise ConfigError(f"nanorl.ppo.train takes a PPOConfig, got {type(cfg).__name__}")
    t_start, out, ckpt = time.perf_counter(), Path(cfg.out_dir), Path(cfg.out_dir) / "checkpoint"
    cfg, device, backend, dtype, task, resuming, _ = online.prepare(cfg, task, ckpt, None, reward_funcs)  # seeds, task
    policy, tok, ref, rm = online.load_models(cfg, device, dtype, str(ckpt) if resuming else cfg.model)
    pad_id, group_size = tok.pad_token_id, cfg.samples_per_prompt
    sampler = online.make_sampler(cfg, policy, tok, stop_token_ids(policy, tok), backend)  # vLLM with --use_vllm
    online.check_context(cfg, policy, tok, task)
    critic_from = str(ckpt / "critic") if resuming else (cfg.critic_model or cfg.model)
    critic, _ = distributed.load(load_reward_model, critic_from, device, dtype, cfg)
    critic = distributed.shard(trainable(critic, cfg, "SEQ_CLS"), cfg).eval()  # LoRA too when lora_r > 0; FSDP
    logger = make_logger(out, cfg.report_to, append=resuming, total_steps=cfg.steps, config=cfg, callbacks=callbacks)
    online.describe(
        cfg,
        "ppo",
        task,
        {"policy": policy, "reference": ref, "reward model": rm and rm[0], "critic": critic},
        device,
        backend,
        out,
    )
    batch = cfg.prompts_per_step * group_size
    mb_size = cfg.minibatch_size or batch
    opt_steps_per_batch = cfg.epochs * (batch // mb_size)
    total = cfg.steps * opt_steps_per_batch
    opt, sched = make_optimizer(policy, cfg, total)
    critic_opt, critic_sched = make_optimizer(critic, cfg, total, cfg.critic_lr)
    start = 0
    if resuming:
        state = checkpoint.load_state(ckpt, opt, sched, policy)
        distributed.load_optimizer_state(critic, critic_opt, state["critic_optimizer"], ckpt)
        critic_sched.load_state_dict(state["critic_scheduler"])
        start = state["step"]
        logger.rewind(start)  # lines the stopped run wrote after its checkpoint are redone below

    def evaluate(at: int) -> dict:  # held-out greedy accuracy (and pass@k) of the policy after step `at`
        return online.run_eval(sampler, tok, task, cfg, logger, out, at)

    def save(done: int) -> None:  # policy and critic in one checkpoint, written in one rename
        checkpoint.save(
            ckpt,
            policy,
            tok,
            opt,
            sched,
            done,
            {"critic_scheduler": critic_sched.state_dict()},
            {"critic": critic},
            cfg.keep_last,
            {"critic_optimizer": (critic, critic_opt)},
        )

    first, last = checkpoint.first_eval(resuming, out, evaluate, start, cfg.steps)
    bad_steps = 0  # steps in a row whose updates were skipped for a non-finite gradient
    for step in checkpoint.stoppable(online.progress(start, cfg, "ppo"), save, ckpt):  # SIGINT/SIGTERM: save, stop
        # -------------------------------------------------------------- rollout
        t0, timer = time.perf_counter(), {"rollout": 0.0, "reward": 0.0, "tokens": 0}
        examples = online.step_examples(task, cfg, step)  # this rank's share of the step's prompts (torchrun)
        roll, texts = online.rollout(sampler, tok, examples, cfg, derive_seed(cfg.seed, step, "rollout"), timer)

        # -------------------------------------------------------------- reward: the sequence's, then per token
        rewards, parts = online.reward(task, rm, examples, texts, roll, cfg, timer, device, backend, step)  # (n,)
        t2 = time.perf_counter()
        everyone, mine = distributed.gather, distributed.share(batch)  # the global batch's rows; this rank's
        n, C = len(roll.completion_ids), distributed.reduce(max(len(c) for c in roll.completion_ids), "max")
        mask = right_pad([torch.ones(len(c)) for c in roll.completion_ids], C)  # (n, C) this rank's rows
        sampler_logp = right_pad(roll.logprobs, C)  # (n, C) the rollout policy's log-probs
        ref_logp = (
            right_pad(learner_logprobs(ref, roll, cfg, pad_id, device, backend), C) if ref is not None else sampler_logp
        )  # (n, C) the reference's log-probs; without one the sampler's: a KL of 0
        kl = kl_penalty(sampler_logp, ref_logp, cfg.kl_estimator) * mask  # (n, C), 0 without a reference
        token_rewards = -cfg.kl_coef * kl
        last_token = mask.sum(-1).long() - 1  # (n,) index of each completion's last token
        token_rewards[torch.arange(n), last_token] += rewards  # the sequence reward arrives at the end

        # -------------------------------------------------------------- advantage: the critic's values, GAE
        old_values = torch.zeros(n, C)
        with torch.no_grad():
            for idx in chunks(list(range(n)), cfg.micro_batch_size):
                v = token_values(
                    critic,
                    [roll.prompt_ids[i] for i in idx],
                    [roll.completion_ids[i] for i in idx],
                    pad_id,
                    device,
                    backend,
                )  # (b, c)
                old_values[idx, : v.shape[1]] = v.cpu()
        adv_raw, returns = gae(token_rewards, old_values, mask, cfg.gamma, cfg.gae_lambda)  # (n, C) row by row
        adv = whiten(everyone(adv_raw), everyone(mask))[mine]  # whitened over the global batch's tokens

        # -------------------------------------------------------------- update: the policy and the critic
        sums, vsums = {}, {"loss": 0.0, "clipped": 0.0}
        learner_old = learner_logprobs(policy, roll, cfg, pad_id, device, backend) if cfg.is_mode != "none" else None
        shuffle = torch.Generator().manual_seed(derive_seed(cfg.seed, step, "shuffle"))
        for epochs_run in range(1, cfg.epochs + 1):  # noqa: B007 (after the loop: the epochs run; target_kl stops)
            perm = torch.randperm(batch, generator=shuffle).tolist()
            kl_sum, kl_tokens = 0.0, 0
            for part in chunks(perm, mb_size):  # minibatches of the global batch; each rank trains the rows it holds
                mb = [i - mine.start for i in part if mine.start <= i < mine.stop]
                stats = policy_backward(
                    policy,
                    roll,
                    adv,
                    mb,
                    cfg,
                    on_policy=False,
                    pad_id=pad_id,
                    device=device,
                    backend=backend,
                    learner_old=learner_old,
                )
                grad_norm = optimizer_step(policy, opt, sched, cfg.grad_clip)  # NaN / inf: the update is skipped
                merge_stats(sums, stats, grad_norm)
                kl_sum, kl_tokens = kl_sum + stats["approx_kl"], kl_tokens + stats["tokens"]
                value_backward(critic, roll, mb, old_values, returns, mask, cfg, pad_id, device, backend, vsums)
                optimizer_step(critic, critic_opt, critic_sched, cfg.grad_clip)
            if cfg.target_kl and kl_sum / max(kl_tokens, 1) > cfg.target_kl:  # early stop (approximate KL)
                break
        timer["sync"] = time.perf_counter()
        sampler.sync_weights(policy)  # an engine with its own copy of the weights loads the new ones (vLLM)
        t3 = time.perf_counter()
        timer["sync"] = t3 - timer["sync"]

        # -------------------------------------------------------------- log / eval / checkpoint
        n_mb, vsums = epochs_run * (batch // mb_size), {k: distributed.reduce(v) for k, v in vsums.items()}
        rewards, kl, old_values, returns, adv_raw, mask = map(
            everyone, (rewards, kl, old_values, returns, adv_raw, mask)
        )
        m = mask.bool()
        metrics = {
            **online.reward_metrics(
                rewards, {k: everyone(v) for k, v in parts.items()}, group_size, task.acc_threshold
            ),
            "reward/kl_penalty": kl.sum(-1).mean().item(),
            "optim/lr": sched.get_last_lr()[0],
            **online.rollout_metrics(mask.sum(-1).long(), everyone(torch.tensor(roll.truncated))),
            **update_metrics(sums, n_mb),
            "value/loss": vsums["loss"] / n_mb,
            "value/clip_frac": vsums["clipped"] / (epochs_run * m.sum().item()),
            "value/explained_variance": explained_variance(old_values, returns, mask),
            "value/mean": old_values[m].mean().item(),
            "returns/mean": returns[m].mean().item(),
            "adv/mean": adv_raw[m].mean().item(),
            "adv/std": adv_raw[m].std(correction=0).item(),
            "ppo/epochs_run": epochs_run,
            **online.time_metrics(timer, t0, t2, t3, sums["tokens"], t_start),
        }
        samples = online.sample_records(examples, texts, rewards, roll, group_size, cfg.log_completions)
        last, bad_steps = online.end_of_step(step + 1, metrics, samples, cfg, logger, evaluate, save, last, bad_steps)

    # ------------------------------------------------------------------ finish
    checkpoint.save(out / "critic", critic, tok)
    return online.finish(cfg, out, policy, tok, first, last, t_start, logger)

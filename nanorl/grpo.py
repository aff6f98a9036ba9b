"""GRPO: group-relative policy optimisation with verifiable rewards, in one visible loop.

    nanorl train                                   # SmolLM2-135M-Instruct, two-digit addition, CPU
    nanorl train --model tiny --steps 5            # smoke run on a random 2-layer model
    python -c "from nanorl import GRPOConfig, train; train(GRPOConfig(steps=10))"

Each step: rollout (sample G completions for each of P prompts) -> reward -> group-relative
advantage -> clipped policy-gradient update (DeepSeekMath, arXiv 2402.03300, eq. 3).
The variants (Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++; `--algo`, config.PRESETS) are settings of
this same loop: an advantage estimator, a loss normaliser, clip ranges, a ratio level, dynamic
sampling and an overlong rule, each one small function.

Deviations from the paper, each deliberate:
1. Token-level loss with one global normaliser per minibatch (DAPO, arXiv 2503.14476) instead of a
   per-sequence mean, so long and short completions weigh by their tokens and micro-batching does
   not change the gradient.
2. kl_coef defaults to 0 (no reference model at all), as in DAPO and Dr. GRPO; with kl_coef > 0 the
   k3 estimator of the paper's eq. 4 is added to the loss (kl_estimator / kl_placement change that).
3. Dropout is off during the update (models stay in eval mode), so an on-policy ratio is exactly 1.
4. Sequences whose advantage is 0 (groups with equal rewards) are not run through the update when
   no KL term is in the loss: their gradient is exactly 0, and the loss normaliser still counts them.
"""

from __future__ import annotations

import random
import time

import torch

from nanorl.advantages import ESTIMATORS
from nanorl.config import GRPOConfig
from nanorl.data import collate
from nanorl.learner import make_optimizer, optimizer_step
from nanorl.losses import kl_penalty, loss_weights, policy_loss
from nanorl.models import token_logprobs
from nanorl.rewards import overlong_penalty
from nanorl.rl import Run, prompt_order
from nanorl.tasks import Task


def informative_groups(rewards: torch.Tensor, group_size: int) -> list[int]:
    """Indices of the groups whose rewards are not all equal (the only ones with a learning signal)."""
    r = rewards.view(-1, group_size)  # (groups, G)
    return (r.amax(dim=1) > r.amin(dim=1)).nonzero().flatten().tolist()


def rows_batch(roll, idx, pad_id: int, device):
    """A training Batch of rollout rows `idx`, with the sampler's log-probs as extra["old"]."""
    return collate([roll.prompt_ids[i] for i in idx], [roll.completion_ids[i] for i in idx], pad_id, device,
                   {"old": [roll.logprobs[i] for i in idx]})


@torch.no_grad()
def sequence_kl(ref, roll, cfg: GRPOConfig, pad_id: int, device) -> torch.Tensor:
    """Per-sequence sum of the per-token KL estimate between the rollout policy and the reference (N,)."""
    out = []
    for s in range(0, len(roll.completion_ids), cfg.micro_batch_size):
        idx = range(s, min(s + cfg.micro_batch_size, len(roll.completion_ids)))
        b = rows_batch(roll, idx, pad_id, device)
        ref_logp, _ = token_logprobs(ref, b, cfg.temperature)  # (b, C)
        out.append((kl_penalty(b.extra["old"], ref_logp, cfg.kl_estimator) * b.loss_mask).sum(-1).cpu())
    return torch.cat(out)


def micro_batches(rows: list[int], roll, size: int) -> list[list[int]]:
    """Split rollout rows into micro-batches of `size` in the cheaper of two orders: sorted by completion
    length (least padding), or group by group (a prompt is prefilled once per micro-batch it is in, so
    keeping a group together prefills it once). Cost = distinct prompts x longest prompt + rows x longest
    completion, the tokens the forward runs; the gradient is the same either way."""
    key = lambda i: tuple(roll.prompt_ids[i])  # noqa: E731
    length = lambda i: len(roll.completion_ids[i])  # noqa: E731
    longest: dict = {}
    for i in rows:
        longest[key(i)] = max(longest.get(key(i), 0), length(i))
    by_length = sorted(rows, key=length)
    by_group = sorted(rows, key=lambda i: (longest[key(i)], roll.prompt_ids[i], length(i)))

    def split(order):
        return [order[s:s + size] for s in range(0, len(order), size)]

    def cost(mbs):
        return sum(len({key(i) for i in mb}) * max(len(roll.prompt_ids[i]) for i in mb) + len(mb) * max(map(length, mb))
                   for mb in mbs)

    return min(split(by_length), split(by_group), key=cost)


def backward_minibatch(policy, ref, roll, adv, mb: list[int], cfg: GRPOConfig, on_policy: bool, pad_id: int,
                       device) -> dict:
    """Accumulate the gradient of one minibatch (rows `mb` of the rollout), micro-batch by micro-batch.
    `adv` is (N,) per sequence (GRPO family) or (N, C) per token (PPO).

    The loss weights count tokens and sequences of the whole minibatch (`losses.loss_weights`), so the
    gradient is the same for any micro_batch_size. Rows with zero advantage are skipped when there is
    no KL term: their loss is exactly 0 (the counts still include them). Returns sums for metrics.
    """
    if cfg.overlong == "filter":  # DAPO overlong filtering: truncated completions carry no loss at all
        mb = [i for i in mb if not roll.truncated[i]]
    n_tokens, n_seqs = sum(len(roll.completion_ids[i]) for i in mb), len(mb)  # counts of the whole minibatch
    kl_in_loss = ref is not None and cfg.kl_placement == "loss"
    rows = [i for i in mb if bool((adv[i] != 0).any()) or kl_in_loss]
    stats = {"loss": 0.0, "tokens": 0, "ratio": 0.0, "clipped": 0.0, "entropy": 0.0, "kl": 0.0,
             "logp_diff": 0.0, "approx_kl": 0.0, "ratio_min": float("inf"), "ratio_max": float("-inf")}
    for idx in micro_batches(rows, roll, cfg.micro_batch_size):
        mb_batch = rows_batch(roll, idx, pad_id, device)
        mask, sampler_logp = mb_batch.loss_mask, mb_batch.extra["old"]  # (b, C)
        logp, entropy = token_logprobs(policy, mb_batch, cfg.temperature, with_entropy=True)  # (b, C)
        old = logp.detach() if on_policy else sampler_logp  # on-policy: ratio exactly 1, no extra forward
        a = adv[idx][:, :logp.shape[1]] if adv.dim() == 2 else adv[idx][:, None]  # (b, C) per token, or (b, 1)
        per_token, st = policy_loss(logp, old, a.to(device), mask, cfg.clip_low, cfg.clip_high, cfg.ratio_level)
        kl = torch.zeros_like(logp)
        if kl_in_loss:
            with torch.no_grad():
                ref_logp, _ = token_logprobs(ref, mb_batch, cfg.temperature)
            kl = kl_penalty(logp, ref_logp, cfg.kl_estimator)
            per_token = per_token + cfg.kl_coef * kl
        loss = (loss_weights(mask, cfg.loss_agg, n_tokens, n_seqs, cfg.max_new_tokens) * per_token).sum()
        loss.backward()
        m = mask.bool()
        stats["loss"] += loss.item()
        stats["tokens"] += int(m.sum())
        for name, value in (("ratio", st["ratio"]), ("clipped", st["clipped"]), ("entropy", entropy),
                            ("kl", kl.detach()), ("logp_diff", (logp.detach() - sampler_logp).abs()),
                            ("approx_kl", st["ratio"] - 1 - st["ratio"].log())):  # k3 of pi_old || pi
            stats[name] += value[m].sum().item()
        stats["ratio_min"] = min(stats["ratio_min"], st["ratio"][m].min().item())
        stats["ratio_max"] = max(stats["ratio_max"], st["ratio"][m].max().item())
    return stats


def merge_stats(total: dict, new: dict) -> None:
    for k, v in new.items():
        if k == "ratio_min":
            total[k] = min(total.get(k, v), v)
        elif k == "ratio_max":
            total[k] = max(total.get(k, v), v)
        else:
            total[k] = total.get(k, 0) + v


def train(cfg: GRPOConfig, task: Task | None = None) -> dict:
    # ------------------------------------------------------------------ setup
    if cfg.algo == "ppo":  # PPO has its own loop (a critic and per-token advantages)
        from nanorl.ppo import train as ppo_train

        return ppo_train(cfg, task)
    run = Run(cfg, task, cfg.algo)
    policy, ref, task, G, device, pad_id = run.policy, run.ref, run.task, cfg.samples_per_prompt, run.device, run.pad_id
    mb_size = cfg.minibatch_size or cfg.prompts_per_step * G
    opt_steps_per_batch = cfg.epochs * (cfg.prompts_per_step * G // mb_size)
    on_policy = opt_steps_per_batch == 1  # then old log-probs are the current ones, detached
    opt, sched = make_optimizer(policy, cfg.lr, cfg.weight_decay, cfg.warmup_steps,
                                cfg.steps * opt_steps_per_batch, cfg.lr_schedule)
    for step in run.steps(opt, sched):
        # -------------------------------------------------------------- rollout + reward
        t0, timer = time.perf_counter(), {"rollout": 0.0, "reward": 0.0, "tokens": 0}
        examples = [task.train[i] for i in prompt_order(len(task.train), cfg.seed, step, cfg.prompts_per_step)]
        roll, texts, rewards, parts = run.rollout_and_score(examples, cfg.seed * 1_000_003 + step, timer)  # (N,)
        first_rewards, refills = rewards, 0
        while cfg.dynamic_sampling:  # DAPO eq. 11: keep only groups whose rewards differ; refill the batch
            keep = informative_groups(rewards, G)
            if len(keep) >= cfg.prompts_per_step or refills == cfg.dynamic_sampling:
                if keep:  # a full batch, or the informative part of it when the refills ran out
                    keep = keep[:cfg.prompts_per_step]
                    examples = [examples[g] for g in keep]
                    roll, rewards = roll.groups(keep), rewards.view(-1, G)[keep].reshape(-1)
                    texts = [texts[g * G + j] for g in keep for j in range(G)]
                break
            refills += 1
            more = [task.train[i] for i in random.Random(cfg.seed * 9_973 + step * 101 + refills).sample(
                range(len(task.train)), cfg.prompts_per_step)]
            r2, t2, rw2, _ = run.rollout_and_score(more, cfg.seed * 1_000_003 + step + refills * 7_777_777, timer)
            examples, roll, texts, rewards = examples + more, roll + r2, texts + t2, torch.cat([rewards, rw2])
        batch = len(roll.completion_ids)
        lengths = [len(c) for c in roll.completion_ids]
        t2 = time.perf_counter()

        # -------------------------------------------------------------- advantage
        shaped = rewards
        if cfg.overlong == "soft":  # DAPO eq. 13: a length penalty on top of the task reward
            buffer = cfg.overlong_buffer or max(1, cfg.max_new_tokens // 4)
            shaped = shaped + torch.tensor([overlong_penalty(n, cfg.max_new_tokens, buffer) for n in lengths])
        kl_seq = torch.zeros(batch)
        if ref is not None and cfg.kl_placement == "reward":  # detached KL penalty folded into the reward
            kl_seq = sequence_kl(ref, roll, cfg, pad_id, device)  # (N,)
            shaped = shaped - cfg.kl_coef * kl_seq
        adv, adv_stats = ESTIMATORS[cfg.adv_estimator](shaped, G, cfg.scale_adv_by_std)  # (N,)

        # -------------------------------------------------------------- update
        sums: dict = {}
        shuffle = torch.Generator().manual_seed(cfg.seed * 7_919 + step)
        for _epoch in range(cfg.epochs):
            perm = list(range(batch)) if on_policy else torch.randperm(batch, generator=shuffle).tolist()
            for mb_start in range(0, batch, mb_size):
                stats = backward_minibatch(policy, ref, roll, adv, perm[mb_start:mb_start + mb_size], cfg, on_policy,
                                           pad_id, device)
                stats["grad_norm"] = optimizer_step(policy, opt, sched, cfg.grad_clip)
                merge_stats(sums, stats)
        t3 = time.perf_counter()

        # -------------------------------------------------------------- log / eval / checkpoint
        metrics = {
            "step": step + 1, **reward_metrics(first_rewards, parts, G),
            "reward/trained_mean": rewards.mean().item(), "reward/shaped_mean": shaped.mean().item(),
            "reward/kl_penalty": kl_seq.mean().item(), "rollout/refills": refills, "rollout/groups": batch // G,
            "rollout/informative_groups": len(informative_groups(rewards, G)),
            **rollout_metrics(roll), **update_metrics(sums, opt_steps_per_batch), "optim/lr": sched.get_last_lr()[0],
            "reward/errors": timer.get("reward_errors", 0),
            "time/rollout": timer["rollout"], "time/reward": timer["reward"], "time/update": t3 - t2,
            "time/step": t3 - t0, "perf/rollout_tokens_per_s": timer["tokens"] / timer["rollout"],
            "perf/update_tokens_per_s": sums["tokens"] / max(t3 - t2, 1e-9),
        }
        run.end_step(step, metrics, examples, texts, rewards, roll, opt, sched)

    # ------------------------------------------------------------------ finish
    return run.finish()


def reward_metrics(rewards: torch.Tensor, parts: dict, G: int) -> dict:
    out = {"reward/mean": rewards.mean().item(), "reward/std": rewards.std(correction=0).item(),
           "reward/acc": (next(iter(parts.values())) >= 1).float().mean().item(),  # of the first rule part
           "reward/frac_groups_with_variance": len(informative_groups(rewards, G)) / (len(rewards) // G)}
    out.update({f"reward/{k}_mean": v.mean().item() for k, v in parts.items()})
    return out


def rollout_metrics(roll) -> dict:
    lengths = [len(c) for c in roll.completion_ids]
    return {"rollout/len_mean": sum(lengths) / len(lengths), "rollout/len_max": max(lengths),
            "rollout/truncated_frac": sum(roll.truncated) / len(lengths)}


def update_metrics(sums: dict, opt_steps: int) -> dict:
    """Per-token means of the sums `backward_minibatch` returns, over all minibatches of the step."""
    tt, any_tokens = max(sums["tokens"], 1), sums["tokens"] > 0
    return {"loss/policy": sums["loss"] / opt_steps, "loss/kl": sums["kl"] / tt,
            "policy/entropy": sums["entropy"] / tt, "policy/clip_frac": sums["clipped"] / tt,
            "policy/ratio_mean": sums["ratio"] / tt if any_tokens else 1.0,
            "policy/ratio_min": sums["ratio_min"] if any_tokens else 1.0,
            "policy/ratio_max": sums["ratio_max"] if any_tokens else 1.0,
            "policy/sampler_logp_diff": sums["logp_diff"] / tt, "policy/approx_kl": sums["approx_kl"] / tt,
            "policy/trained_tokens": sums["tokens"], "optim/grad_norm": sums["grad_norm"] / opt_steps}

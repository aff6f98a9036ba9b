"""GRPO: group-relative policy optimisation with verifiable rewards, in one visible loop.

    nanorl train                                   # SmolLM2-135M-Instruct, two-digit addition, CPU
    nanorl train --model tiny --steps 5            # smoke run on a random 2-layer model
    python -c "from nanorl import GRPOConfig, train; train(GRPOConfig(steps=10))"

Each step: rollout (sample G completions for each of P prompts) -> reward -> group-relative
advantage -> clipped policy-gradient update (DeepSeekMath, arXiv 2402.03300, eq. 3).
The variants (Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++; `--algo`, config.PRESETS) are settings of
this same loop: an advantage estimator, a loss normaliser, clip ranges, a ratio level, dynamic
sampling and an overlong rule, each one small function. PPO, with its critic, is its own loop (ppo.py);
the update both share is update.py.

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
from pathlib import Path

import torch

from nanorl import checkpoint, distributed, online
from nanorl.advantages import ESTIMATORS
from nanorl.config import GRPOConfig
from nanorl.data import chunks
from nanorl.errors import ConfigError
from nanorl.learner import make_optimizer, optimizer_step
from nanorl.logger import make_logger
from nanorl.logprobs import token_logprobs
from nanorl.losses import kl_penalty
from nanorl.models import stop_token_ids
from nanorl.online import informative_groups
from nanorl.seeds import derive_seed
from nanorl.update import learner_logprobs, merge_stats, policy_backward, rows_batch, update_metrics


@torch.no_grad()
def sequence_kl(ref, roll, cfg: GRPOConfig, pad_id: int, device, backend) -> torch.Tensor:
    """Per-sequence sum of the per-token KL estimate between the rollout policy and the reference (N,).

    With kl_placement "reward" this sum is subtracted from the sequence's reward, so every token of a
    completion is penalised by the whole completion's KL. Deliberate: the GRPO family's advantages are one
    number per sequence, computed from rewards that must be comparable within a group, so the KL joins the
    reward at the sequence's level. The per-token form (token t pays the KL from t onward, as REINFORCE++ and
    PPO-RLHF do) needs per-token advantages: that is `nanorl ppo` (per-token k1 in the reward, GAE; with
    gae_lambda = gamma = 1 its advantages are exactly those returns-to-go minus the critic's baseline)."""
    out = []
    for idx in chunks(range(len(roll.completion_ids)), cfg.micro_batch_size):
        b = rows_batch(roll, idx, pad_id, device)
        ref_logp, _ = token_logprobs(ref, b, cfg.temperature, backend=backend)  # (b, C)
        out.append((kl_penalty(b.extra["old"], ref_logp, cfg.kl_estimator) * b.loss_mask).sum(-1).cpu())
    return torch.cat(out)


def overlong_penalty(length: int, max_len: int, buffer: int) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13): 0 up to max_len - buffer tokens,
    then a linear ramp down to -1 at max_len (and -1 beyond). Added to the task reward."""
    return max(-1.0, min(0.0, (max_len - buffer - length) / buffer))  # the ramp, clamped to [-1, 0]


def overlong_rule(cfg: GRPOConfig, roll) -> tuple[torch.Tensor, list[bool]]:
    """The one place `overlong` is read -> (a reward penalty (N,), zeros unless soft; which rows may train).
    soft: DAPO eq. 13, a penalty ramping 0 -> -1 over the last `overlong_buffer` tokens; filter: DAPO's
    overlong filtering, truncated completions carry no loss at all (nor count in its normaliser)."""
    keep = [not t for t in roll.truncated] if cfg.overlong == "filter" else [True] * len(roll.truncated)
    if cfg.overlong == "soft":
        buffer = cfg.overlong_buffer or max(1, cfg.max_new_tokens // 4)
        lengths = [roll.model_tokens(i) for i in range(len(keep))]  # an episode's tool tokens do not count
        return torch.tensor([overlong_penalty(n, cfg.max_new_tokens, buffer) for n in lengths]), keep
    return torch.zeros(len(keep)), keep


def train(
    cfg, task=None, *, model=None, tokenizer=None, reward_funcs=None, callbacks=(), tools=None, environment_factory=None
) -> dict:
    """From Python, besides the config: a Task or a datasets.Dataset, reward functions (nanorl's or TRL's form),
    a model object (a PreTrainedModel or PeftModel) with its tokenizer, callbacks fn(step, metrics), and TRL's
    `tools=[fn, ...]` and `environment_factory=Class` (or {name: Class}) for episodes (agents/)."""
    # ------------------------------------------------------------------ setup
    if not isinstance(cfg, GRPOConfig):
        raise ConfigError(f"nanorl.grpo.train takes a GRPOConfig, got {type(cfg).__name__} (PPO: nanorl.ppo.train)")
    t_start, out, ckpt = time.perf_counter(), Path(cfg.out_dir), Path(cfg.out_dir) / "checkpoint"
    cfg, device, backend, dtype, task, resuming, agent = online.prepare(
        cfg, task, ckpt, model, reward_funcs, tools, environment_factory
    )  # seeds, task, resume?, tools
    policy, tok, ref, rm = online.load_models(
        cfg, device, dtype, str(ckpt) if resuming else cfg.model, model, tokenizer
    )
    pad_id, group_size = tok.pad_token_id, cfg.samples_per_prompt
    sampler = online.make_sampler(cfg, policy, tok, stop_token_ids(policy, tok), backend)
    online.check_context(cfg, policy, tok, task)
    logger = make_logger(out, cfg.report_to, append=resuming, total_steps=cfg.steps, config=cfg, callbacks=callbacks)
    online.describe(
        cfg, cfg.algo, task, {"policy": policy, "reference": ref, "reward model": rm and rm[0]}, device, backend, out
    )
    kl_in_reward = ref is not None and cfg.kl_placement == "reward"  # else the KL is a loss term (if any)
    loss_ref = None if kl_in_reward else ref  # the reference of a KL loss term (None: no term)
    mb_size = cfg.minibatch_size or cfg.prompts_per_step * group_size
    opt_steps_per_batch = cfg.epochs * (cfg.prompts_per_step * group_size // mb_size)
    on_policy = opt_steps_per_batch == 1  # then old log-probs are the current ones, detached
    opt, sched = make_optimizer(policy, cfg, cfg.steps * opt_steps_per_batch)
    start = checkpoint.load_state(ckpt, opt, sched, policy)["step"] if resuming else 0
    logger.rewind(start)  # resumed: lines the stopped run wrote after its checkpoint are redone below

    def evaluate(at: int) -> dict:  # held-out greedy accuracy (and pass@k) of the policy after step `at`
        return online.run_eval(sampler, tok, task, cfg, logger, out, at, agent)

    def save(done: int) -> None:  # a resumable checkpoint after step `done`
        checkpoint.save(ckpt, policy, tok, opt, sched, done, keep_last=cfg.keep_last)

    first, last = checkpoint.first_eval(resuming, out, evaluate, start, cfg.steps)
    bad_steps = 0  # steps in a row whose updates were skipped for a non-finite gradient
    for step in checkpoint.stoppable(online.progress(start, cfg, cfg.algo), save, ckpt):  # SIGINT/SIGTERM: save, stop
        # -------------------------------------------------------------- rollout
        t0, timer = time.perf_counter(), {"rollout": 0.0, "reward": 0.0, "tokens": 0}
        examples = online.step_examples(task, cfg, step)  # this rank's share of the step's prompts (torchrun)
        roll, texts = online.rollout(sampler, tok, examples, cfg, derive_seed(cfg.seed, step, "rollout"), timer, agent)

        # -------------------------------------------------------------- reward
        rewards, parts = online.reward(task, rm, examples, texts, roll, cfg, timer, device, backend, step, agent)
        first_rewards, refills = rewards, 0
        while cfg.dynamic_sampling:  # DAPO eq. 11: keep only groups whose rewards differ; refill the batch
            keep = informative_groups(rewards, group_size)
            if len(keep) >= cfg.prompts_per_step or refills == cfg.dynamic_sampling:
                if keep:  # a full batch, or the informative part of it when the refills ran out
                    keep = keep[: cfg.prompts_per_step]
                    examples = [examples[g] for g in keep]
                    roll, rewards = roll.groups(keep), rewards.view(-1, group_size)[keep].reshape(-1)
                    texts = [texts[g * group_size + j] for g in keep for j in range(group_size)]
                break
            refills += 1
            draw = random.Random(derive_seed(cfg.seed, step, "refill", refills))
            more = [task.train[i] for i in draw.sample(range(len(task.train)), cfg.prompts_per_step)]
            seed = derive_seed(cfg.seed, step, "rollout", refills)
            more_roll, more_texts = online.rollout(sampler, tok, more, cfg, seed, timer, agent)
            more_rewards, _ = online.reward(
                task, rm, more, more_texts, more_roll, cfg, timer, device, backend, step, agent
            )
            examples, roll, texts = examples + more, roll + more_roll, texts + more_texts
            rewards = torch.cat([rewards, more_rewards])
        batch = len(roll.completion_ids)
        t2 = time.perf_counter()

        # -------------------------------------------------------------- advantage
        penalty, trainable = overlong_rule(cfg, roll)
        shaped = rewards + penalty  # (N,)
        kl_seq = torch.zeros(batch)
        if kl_in_reward:  # detached KL penalty folded into the reward
            kl_seq = sequence_kl(ref, roll, cfg, pad_id, device, backend)  # (N,)
            shaped = shaped - cfg.kl_coef * kl_seq
        lengths = torch.tensor(
            [roll.model_tokens(i) for i in range(batch)]
        )  # (N,) model tokens: estimators weigh by them
        everyone = distributed.gather  # this rank's rows -> every rank's: the global batch (one process: the same)
        adv = ESTIMATORS[cfg.adv_estimator](
            everyone(shaped),
            group_size,
            cfg.scale_adv_by_std,
            lengths=everyone(lengths),
            std_correction=cfg.std_correction,
        )  # (N_all,)
        n_all, mine = len(adv), distributed.share(len(adv))  # the global batch's size; this rank's rows of it
        adv = adv[mine]  # (N,)

        # -------------------------------------------------------------- update
        sums: dict = {}
        learner_old = None  # pi_old of an off-policy update that corrects for the sampler: the learner's own
        if cfg.is_mode != "none" and not on_policy:
            learner_old = learner_logprobs(policy, roll, cfg, pad_id, device, backend)
        shuffle = torch.Generator().manual_seed(derive_seed(cfg.seed, step, "shuffle"))
        for _epoch in range(cfg.epochs):  # minibatches of the global batch; each rank trains the rows it holds
            perm = list(range(n_all)) if on_policy else torch.randperm(n_all, generator=shuffle).tolist()
            for part in chunks(perm, mb_size):
                mb = [i - mine.start for i in part if mine.start <= i < mine.stop and trainable[i - mine.start]]
                stats = policy_backward(
                    policy, roll, adv, mb, cfg, on_policy, pad_id, device, backend, loss_ref, learner_old
                )
                grad_norm = optimizer_step(policy, opt, sched, cfg.grad_clip)  # NaN / inf: the update is skipped
                merge_stats(sums, stats, grad_norm)
        timer["sync"] = time.perf_counter()
        sampler.sync_weights(policy)  # an engine with its own copy of the weights loads the new ones (vLLM)
        t3 = time.perf_counter()
        timer["sync"] = t3 - timer["sync"]

        # -------------------------------------------------------------- log / eval / checkpoint
        first_rewards, rewards, shaped, kl_seq = map(everyone, (first_rewards, rewards, shaped, kl_seq))  # global
        metrics = {
            **online.reward_metrics(
                first_rewards, {k: everyone(v) for k, v in parts.items()}, group_size, task.acc_threshold
            ),
            "reward/trained_mean": rewards.mean().item(),
            "reward/shaped_mean": shaped.mean().item(),
            "reward/kl_penalty": kl_seq.mean().item(),
            "rollout/refills": refills,
            "rollout/groups": len(rewards) // group_size,
            "rollout/informative_groups": len(informative_groups(rewards, group_size)),
            **online.rollout_metrics(everyone(lengths), everyone(torch.tensor(roll.truncated))),
            **update_metrics(sums, opt_steps_per_batch),
            "optim/lr": sched.get_last_lr()[0],
            "reward/errors": distributed.reduce(timer.get("reward_errors", 0)),
            **online.time_metrics(timer, t0, t2, t3, sums["tokens"], t_start),
            **(agent.metrics(roll) if agent else {}),  # episodes: turns, tool calls, model and tool tokens
        }
        samples = online.sample_records(examples, texts, rewards, roll, group_size, cfg.log_completions)
        last, bad_steps = online.end_of_step(step + 1, metrics, samples, cfg, logger, evaluate, save, last, bad_steps)

    # ------------------------------------------------------------------ finish
    return online.finish(cfg, out, policy, tok, first, last, t_start, logger)

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
   kl_coef = 0: their gradient is exactly 0, and the token normaliser still counts them.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from nanorl import checkpoint
from nanorl.advantages import ESTIMATORS
from nanorl.config import GRPOConfig, to_dict, validate
from nanorl.data import collate, render_prompt
from nanorl.evaluate import evaluate
from nanorl.learner import make_optimizer, optimizer_step
from nanorl.log import RunLog
from nanorl.losses import kl_penalty, loss_weights, policy_loss
from nanorl.rewards import overlong_penalty
from nanorl.models import load_model, resolve_device, resolve_dtype, stop_token_ids, token_logprobs
from nanorl.sampling import SamplingParams, generate
from nanorl.tasks import Task, get_task


def prompt_order(n_train: int, seed: int, step: int, count: int) -> list[int]:
    """Indices of the training prompts for `step`: a seeded shuffle per pass over the split."""
    out = []
    for k in range(step * count, (step + 1) * count):
        epoch, i = divmod(k, n_train)
        out.append(random.Random(seed * 100_003 + epoch).sample(range(n_train), n_train)[i])
    return out


def score(task: Task, example, completion: str) -> float:
    try:
        return float(task.reward(example.prompt, completion, **example.fields))
    except Exception as e:  # name the input that broke the user's reward
        raise RuntimeError(f"reward of task '{task.name}' failed on prompt {example.prompt!r} "
                           f"with completion {completion!r}: {e!r}") from e


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


def backward_minibatch(policy, ref, roll, adv, mb: list[int], cfg: GRPOConfig, on_policy: bool, pad_id: int,
                       device) -> dict:
    """Accumulate the gradient of one minibatch (rows `mb` of the rollout), micro-batch by micro-batch.

    The loss weights count tokens and sequences of the whole minibatch (`losses.loss_weights`), so the
    gradient is the same for any micro_batch_size. Rows with zero advantage are skipped when there is
    no KL term: their loss is exactly 0 (the counts still include them). Returns sums for metrics.
    """
    if cfg.overlong == "filter":  # DAPO overlong filtering: truncated completions carry no loss at all
        mb = [i for i in mb if not roll.truncated[i]]
    n_tokens, n_seqs = sum(len(roll.completion_ids[i]) for i in mb), len(mb)  # counts of the whole minibatch
    kl_in_loss = ref is not None and cfg.kl_placement == "loss"
    rows = [i for i in mb if adv[i] != 0 or kl_in_loss]
    rows.sort(key=lambda i: len(roll.completion_ids[i]))  # similar lengths share a micro-batch: less padding
    stats = {"loss": 0.0, "tokens": 0, "ratio": 0.0, "clipped": 0.0, "entropy": 0.0, "kl": 0.0,
             "logp_diff": 0.0, "ratio_min": float("inf"), "ratio_max": float("-inf")}
    for start in range(0, len(rows), cfg.micro_batch_size):
        idx = rows[start:start + cfg.micro_batch_size]
        mb_batch = rows_batch(roll, idx, pad_id, device)
        mask, sampler_logp = mb_batch.loss_mask, mb_batch.extra["old"]  # (b, C)
        logp, entropy = token_logprobs(policy, mb_batch, cfg.temperature, with_entropy=True)  # (b, C)
        old = logp.detach() if on_policy else sampler_logp  # on-policy: ratio exactly 1, no extra forward
        per_token, st = policy_loss(logp, old, adv[idx].to(device)[:, None], mask, cfg.clip_low, cfg.clip_high,
                                    cfg.ratio_level)  # (b, C)
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
                            ("kl", kl.detach()), ("logp_diff", (logp.detach() - sampler_logp).abs())):
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
    validate(cfg)
    t_start = time.perf_counter()
    out = Path(cfg.out_dir)
    device, G = resolve_device(cfg.device), cfg.samples_per_prompt
    dtype = resolve_dtype(cfg.dtype, device)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    task = task or get_task(cfg.task, reward=cfg.reward, digits=cfg.digits, operators=cfg.operators,
                            eval_size=cfg.eval_size)
    ckpt_dir = out / "checkpoint"
    resuming = cfg.resume and (ckpt_dir / "trainer_state.pt").is_file()
    policy, tok = load_model(str(ckpt_dir) if resuming else cfg.model, device, dtype)
    policy.eval()  # no dropout: rollout and update see the same function
    ref = None
    if cfg.kl_coef > 0:  # the reference model exists only when it is used
        ref, _ = load_model(cfg.model, device, dtype)
        ref.eval().requires_grad_(False)
    batch = cfg.prompts_per_step * G
    mb_size = cfg.minibatch_size or batch
    opt_steps_per_batch = cfg.epochs * (batch // mb_size)
    on_policy = opt_steps_per_batch == 1  # then old log-probs are the current ones, detached
    opt, sched = make_optimizer(policy, cfg.lr, cfg.weight_decay, cfg.warmup_steps,
                                cfg.steps * opt_steps_per_batch, cfg.lr_schedule)
    start_step = checkpoint.load_state(ckpt_dir, opt, sched)["step"] if resuming else 0
    stops, pad_id = stop_token_ids(policy, tok), tok.pad_token_id
    params = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k)
    context = getattr(policy.config, "max_position_embeddings", None)
    longest = max(len(render_prompt(tok, ex.prompt, cfg.system_prompt)) for ex in task.train[:1000] + task.eval)
    if context and longest + cfg.max_new_tokens > context:
        raise ValueError(f"a prompt of {longest} tokens + max_new_tokens {cfg.max_new_tokens} exceeds the "
                         f"model's context of {context} tokens")
    log = RunLog(out, append=resuming)
    (out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    print(f"[nanorl] GRPO config: {json.dumps(to_dict(cfg))}")
    print(f"[nanorl] task '{task.name}': {len(task.train)} train / {len(task.eval)} held-out prompts; "
          f"model {cfg.model} ({sum(p.numel() for p in policy.parameters()) / 1e6:.0f}M params) on {device} {dtype}")

    def run_eval(step: int) -> dict:
        metrics, samples = evaluate(policy, tok, task, cfg.max_new_tokens, cfg.eval_k, cfg.temperature,
                                    cfg.system_prompt)
        log.write("eval", {"step": step, **metrics})
        (out / "eval_samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
        tqdm.write(f"[nanorl] step {step} eval: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
        return metrics

    def rollout_and_score(examples, seed: int, timer: dict):
        """Sample G completions per example and score them with the task's reward."""
        t = time.perf_counter()
        prompts = [render_prompt(tok, ex.prompt, cfg.system_prompt) for ex in examples]
        roll = generate(policy, prompts, G, params, stops, seed=seed, pad_id=pad_id)
        timer["rollout"] += time.perf_counter() - t
        timer["tokens"] += sum(len(c) for c in roll.completion_ids)
        t = time.perf_counter()
        texts = [tok.decode(c, skip_special_tokens=True) for c in roll.completion_ids]
        rewards = torch.tensor([score(task, examples[i // G], texts[i]) for i in range(len(texts))])  # (N,)
        timer["reward"] += time.perf_counter() - t
        return roll, texts, rewards

    # on resume the "before" numbers are the first eval of the original run
    prior = (out / "eval.jsonl").read_text().splitlines() if resuming else []
    first_eval = json.loads(prior[0]) if prior else run_eval(start_step)
    last_eval = first_eval
    bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, desc="grpo",
               dynamic_ncols=True, disable=None)
    for step in bar:
        # -------------------------------------------------------------- rollout + reward
        t0, timer = time.perf_counter(), {"rollout": 0.0, "reward": 0.0, "tokens": 0}
        examples = [task.train[i] for i in prompt_order(len(task.train), cfg.seed, step, cfg.prompts_per_step)]
        roll, texts, rewards = rollout_and_score(examples, cfg.seed * 1_000_003 + step, timer)  # rewards (N,)
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
            r2, t2, rw2 = rollout_and_score(more, cfg.seed * 1_000_003 + step + refills * 7_777_777, timer)
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
        tt = max(sums["tokens"], 1)
        metrics = {
            "step": step + 1,
            "reward/mean": first_rewards.mean().item(), "reward/std": first_rewards.std(correction=0).item(),
            "reward/acc": (first_rewards >= 1).float().mean().item(),
            "reward/frac_groups_with_variance": len(informative_groups(first_rewards, G)) / cfg.prompts_per_step,
            "reward/trained_mean": rewards.mean().item(), "reward/shaped_mean": shaped.mean().item(),
            "reward/kl_penalty": kl_seq.mean().item(), "rollout/refills": refills, "rollout/groups": batch // G,
            "rollout/informative_groups": len(informative_groups(rewards, G)),
            "rollout/len_mean": sum(lengths) / batch, "rollout/len_max": max(lengths),
            "rollout/truncated_frac": sum(roll.truncated) / batch,
            "loss/policy": sums["loss"] / opt_steps_per_batch, "loss/kl": sums["kl"] / tt,
            "policy/entropy": sums["entropy"] / tt, "policy/clip_frac": sums["clipped"] / tt,
            "policy/ratio_mean": sums["ratio"] / tt if sums["tokens"] else 1.0,
            "policy/ratio_min": sums["ratio_min"] if sums["tokens"] else 1.0,
            "policy/ratio_max": sums["ratio_max"] if sums["tokens"] else 1.0,
            "policy/sampler_logp_diff": sums["logp_diff"] / tt, "policy/trained_tokens": sums["tokens"],
            "optim/grad_norm": sums["grad_norm"] / opt_steps_per_batch, "optim/lr": sched.get_last_lr()[0],
            "time/rollout": timer["rollout"], "time/reward": timer["reward"], "time/update": t3 - t2,
            "time/step": t3 - t0, "perf/rollout_tokens_per_s": timer["tokens"] / timer["rollout"],
            "perf/update_tokens_per_s": sums["tokens"] / max(t3 - t2, 1e-9),
            "time/elapsed": time.perf_counter() - t_start,
        }
        for i in range(0, batch, G * max(1, cfg.prompts_per_step // 2)):  # a couple of samples per step
            log.write("samples", {"step": step + 1, "prompt": examples[i // G].prompt, "completion": texts[i],
                                  "reward": rewards[i].item(), "truncated": roll.truncated[i]})
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            last_eval = run_eval(step + 1)
            metrics.update(last_eval)
        log.write("metrics", metrics)
        bar.set_postfix(reward=f"{metrics['reward/mean']:.2f}", len=f"{metrics['rollout/len_mean']:.0f}",
                        s=f"{metrics['time/step']:.1f}")
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
            checkpoint.save(ckpt_dir, policy, tok, opt, sched, step + 1)

    # ------------------------------------------------------------------ finish
    checkpoint.save(out / "model", policy, tok)
    wall = time.perf_counter() - t_start
    result = {"steps": cfg.steps, "wall_s": wall, "before": first_eval, "after": last_eval}
    (out / "results.json").write_text(json.dumps(result, indent=2))
    log.close()
    before = f"{first_eval['eval/greedy_acc']:.1%} -> " if first_eval else ""
    print(f"[nanorl] done: held-out greedy accuracy {before}{last_eval.get('eval/greedy_acc', float('nan')):.1%} "
          f"in {cfg.steps} steps, {wall / 60:.1f} min wall time; model saved to {out / 'model'}")
    sys.stdout.flush()
    return result

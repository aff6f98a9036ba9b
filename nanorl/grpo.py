"""GRPO: group-relative policy optimisation with verifiable rewards, in one visible loop.

    nanorl train                                   # SmolLM2-135M-Instruct, two-digit addition, CPU
    nanorl train --model tiny --steps 5            # smoke run on a random 2-layer model
    python -c "from nanorl import GRPOConfig, train; train(GRPOConfig(steps=10))"

Each step: rollout (sample G completions for each of P prompts) -> reward -> group-relative
advantage -> clipped policy-gradient update (DeepSeekMath, arXiv 2402.03300, eq. 3).

Deviations from the paper, each deliberate:
1. Token-level loss with one global normaliser per minibatch (DAPO, arXiv 2503.14476) instead of a
   per-sequence mean, so long and short completions weigh by their tokens and micro-batching does
   not change the gradient.
2. kl_coef defaults to 0 (no reference model at all), as in DAPO and Dr. GRPO; with kl_coef > 0 the
   k3 estimator of the paper's eq. 4 is added to the loss.
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
    rows = [i for i in mb if adv[i] != 0 or ref is not None]
    rows.sort(key=lambda i: len(roll.completion_ids[i]))  # similar lengths share a micro-batch: less padding
    stats = {"loss": 0.0, "tokens": 0, "ratio": 0.0, "clipped": 0.0, "entropy": 0.0, "kl": 0.0,
             "logp_diff": 0.0, "ratio_min": float("inf"), "ratio_max": float("-inf")}
    for start in range(0, len(rows), cfg.micro_batch_size):
        idx = rows[start:start + cfg.micro_batch_size]
        mb_batch = collate([roll.prompt_ids[i] for i in idx], [roll.completion_ids[i] for i in idx], pad_id,
                           device, {"old": [roll.logprobs[i] for i in idx]})
        mask, sampler_logp = mb_batch.loss_mask, mb_batch.extra["old"]  # (b, C)
        logp, entropy = token_logprobs(policy, mb_batch, cfg.temperature, with_entropy=True)  # (b, C)
        old = logp.detach() if on_policy else sampler_logp  # on-policy: ratio exactly 1, no extra forward
        per_token, st = policy_loss(logp, old, adv[idx].to(device)[:, None], mask, cfg.clip_low, cfg.clip_high,
                                    cfg.ratio_level)  # (b, C)
        kl = torch.zeros_like(logp)
        if ref is not None:
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

    # on resume the "before" numbers are the first eval of the original run
    prior = (out / "eval.jsonl").read_text().splitlines() if resuming else []
    first_eval = json.loads(prior[0]) if prior else run_eval(start_step)
    last_eval = first_eval
    bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, desc="grpo",
               dynamic_ncols=True, disable=None)
    for step in bar:
        # -------------------------------------------------------------- rollout
        t0 = time.perf_counter()
        examples = [task.train[i] for i in prompt_order(len(task.train), cfg.seed, step, cfg.prompts_per_step)]
        prompts = [render_prompt(tok, ex.prompt, cfg.system_prompt) for ex in examples]
        roll = generate(policy, prompts, G, params, stops, seed=cfg.seed * 1_000_003 + step, pad_id=pad_id)
        lengths = [len(c) for c in roll.completion_ids]
        t1 = time.perf_counter()

        # -------------------------------------------------------------- reward
        texts = [tok.decode(c, skip_special_tokens=True) for c in roll.completion_ids]
        rewards = torch.tensor([score(task, examples[i // G], texts[i]) for i in range(batch)])  # (N,)
        t2 = time.perf_counter()

        # -------------------------------------------------------------- advantage
        adv, adv_stats = ESTIMATORS[cfg.adv_estimator](rewards, G, cfg.scale_adv_by_std)  # (N,)

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
            "reward/mean": rewards.mean().item(), "reward/std": rewards.std(correction=0).item(),
            "reward/acc": (rewards >= 1).float().mean().item(),
            "reward/frac_groups_with_variance": adv_stats["frac_groups_with_variance"],
            "rollout/len_mean": sum(lengths) / batch, "rollout/len_max": max(lengths),
            "rollout/truncated_frac": sum(roll.truncated) / batch,
            "loss/policy": sums["loss"] / opt_steps_per_batch, "loss/kl": sums["kl"] / tt,
            "policy/entropy": sums["entropy"] / tt, "policy/clip_frac": sums["clipped"] / tt,
            "policy/ratio_mean": sums["ratio"] / tt if sums["tokens"] else 1.0,
            "policy/ratio_min": sums["ratio_min"] if sums["tokens"] else 1.0,
            "policy/ratio_max": sums["ratio_max"] if sums["tokens"] else 1.0,
            "policy/sampler_logp_diff": sums["logp_diff"] / tt, "policy/trained_tokens": sums["tokens"],
            "optim/grad_norm": sums["grad_norm"] / opt_steps_per_batch, "optim/lr": sched.get_last_lr()[0],
            "time/rollout": t1 - t0, "time/reward": t2 - t1, "time/update": t3 - t2, "time/step": t3 - t0,
            "perf/rollout_tokens_per_s": sum(lengths) / (t1 - t0),
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

"""The updates of the online loops: rollout rows to micro-batches, the masked clipped-surrogate backward of one
minibatch of the policy (GRPO's family and PPO), PPO's clipped value backward of the critic, and the update's
metrics. The loops (grpo.py, ppo.py) decide the advantages and which rows train; this file turns them into gradients.

    stats = policy_backward(policy, roll, adv, rows, cfg, on_policy=True, pad_id=pad, device=dev, backend=be)
    grad_norm = optimizer_step(policy, opt, sched, cfg.grad_clip)   # NaN / inf: the update is skipped
    merge_stats(sums, stats, grad_norm)
    value_backward(critic, roll, rows, old_values, returns, mask, cfg, pad, dev, be, value_sums)   # PPO
    metrics = update_metrics(sums, optimizer_steps)
"""

from __future__ import annotations

import math

import torch

from nanorl import distributed
from nanorl.backends import Backend
from nanorl.data import chunks, collate
from nanorl.logprobs import AUTO, token_logprobs
from nanorl.losses import kl_penalty, loss_weights, mismatch_weights, policy_loss, value_loss


def rows_batch(roll, idx, pad_id: int, device, learner_old: list[torch.Tensor] | None = None):
    """A training Batch of rollout rows `idx`, with the sampler's log-probs as extra["old"] (and, when given, the
    learner's own as extra["learner_old"])."""
    per_token = {"old": [roll.logprobs[i] for i in idx]}
    if learner_old is not None:
        per_token["learner_old"] = [learner_old[i] for i in idx]
    if roll.model_mask is not None:  # an episode's tool and environment tokens: no loss, no count
        per_token["model"] = [roll.model_mask[i] for i in idx]
    b = collate([roll.prompt_ids[i] for i in idx], [roll.completion_ids[i] for i in idx], pad_id, device, per_token)
    if roll.model_mask is not None:
        b.loss_mask = b.loss_mask * b.extra.pop("model")  # (b, C)
    return b


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

    def cost(mbs):
        return sum(
            len({key(i) for i in mb}) * max(len(roll.prompt_ids[i]) for i in mb) + len(mb) * max(map(length, mb))
            for mb in mbs
        )

    return min(chunks(by_length, size), chunks(by_group, size), key=cost)


@torch.no_grad()
def learner_logprobs(policy, roll, cfg, pad_id: int, device, backend: Backend = AUTO) -> list[torch.Tensor]:
    """The learner's own log-probs of every rollout token before the update (pi_old for an off-policy update
    whose sampler may disagree with the learner, cfg.is_mode): one no-grad forward, (N,) tensors of (len,)."""
    out = []
    for idx in chunks(list(range(len(roll.completion_ids))), cfg.micro_batch_size):
        logp, _ = token_logprobs(policy, rows_batch(roll, idx, pad_id, device), cfg.temperature, backend=backend)
        out += [logp[j, : len(roll.completion_ids[i])].cpu() for j, i in enumerate(idx)]
    return out


def policy_backward(
    policy, roll, adv, mb: list[int], cfg, on_policy, pad_id, device, backend=AUTO, ref=None, learner_old=None
) -> dict:
    """Accumulate the gradient of one minibatch (rows `mb` of the rollout), micro-batch by micro-batch.
    `adv` is (N,) per sequence (GRPO family) or (N, C) per token (PPO). `ref` is given when the KL to the
    reference model is a loss term (cfg.kl_coef * the cfg.kl_estimator estimate, per token). cfg.loss_agg and
    cfg.ratio_level choose the normaliser and the ratio's level (PPO, without them: per token).
    pi_old is the learner's current log-probs, detached, on-policy; else `learner_old` when given (see
    learner_logprobs), else the sampler's. With cfg.is_mode each token's loss is weighted by the truncated or
    masked ratio pi_old / pi_sampler (losses.mismatch_weights); cfg.entropy_coef adds an entropy bonus.

    The loss weights count tokens and sequences of the whole minibatch (`losses.loss_weights`), so the
    gradient is the same for any micro_batch_size. Rows with zero advantage are skipped when there is
    no KL term: their loss is exactly 0 (the counts still include them). Returns sums for metrics.
    """
    loss_agg, ratio_level = getattr(cfg, "loss_agg", "token"), getattr(cfg, "ratio_level", "token")  # PPO: per token
    n_tokens = distributed.reduce(sum(roll.model_tokens(i) for i in mb))  # counts of the whole minibatch,
    n_seqs = distributed.reduce(len(mb))  # every rank's rows of it (torchrun)
    rows = [i for i in mb if bool((adv[i] != 0).any()) or ref is not None or cfg.entropy_coef > 0]
    stats = dict.fromkeys("loss ratio clipped entropy kl logp_diff approx_kl dual_clipped is_ratio is_cut".split(), 0.0)
    stats.update(tokens=0, ratio_min=float("inf"), ratio_max=float("-inf"))
    for idx, weight in distributed.even(policy, micro_batches(rows, roll, cfg.micro_batch_size), [0]):  # FSDP
        mb_batch = rows_batch(roll, idx, pad_id, device, learner_old)
        mask, sampler_logp = mb_batch.loss_mask, mb_batch.extra["old"]  # (b, C)
        logp, entropy = token_logprobs(policy, mb_batch, cfg.temperature, with_entropy=True, backend=backend)  # (b, C)
        old = logp.detach() if on_policy else mb_batch.extra.get("learner_old", sampler_logp)  # (b, C)
        # on-policy: ratio exactly 1, no extra forward; off-policy: the learner's own pi_old, else the sampler's
        a = adv[idx][:, : logp.shape[1]] if adv.dim() == 2 else adv[idx][:, None]  # (b, C) per token, or (b, 1)
        per_token, st = policy_loss(
            logp, old, a.to(device), mask, cfg.clip_low, cfg.clip_high, ratio_level, cfg.clip_ratio_c
        )
        if cfg.is_mode != "none":  # sampler / learner mismatch correction
            weights, is_st = mismatch_weights(old, sampler_logp, mask, cfg.is_mode, cfg.is_cap)
            per_token, st = per_token * weights, {**st, **is_st}
        if cfg.entropy_coef > 0:  # entropy bonus: minimising -coef * H raises the entropy
            per_token = per_token - cfg.entropy_coef * entropy
        kl = torch.zeros_like(logp)
        if ref is not None:
            with torch.no_grad():
                ref_logp, _ = token_logprobs(ref, mb_batch, cfg.temperature, backend=backend)
            kl = kl_penalty(logp, ref_logp, cfg.kl_estimator)
            per_token = per_token + cfg.kl_coef * kl
        loss = weight * (loss_weights(mask, loss_agg, n_tokens, n_seqs, cfg.max_new_tokens) * per_token).sum()
        loss.backward()
        if not weight:  # a filler micro-batch (distributed.even): no gradient, no statistics
            continue
        m = mask.bool()
        stats["loss"] += loss.item()
        stats["tokens"] += int(m.sum())
        for name, value in (
            ("ratio", st["ratio"]),
            ("clipped", st["clipped"]),
            ("entropy", entropy.detach()),
            ("kl", kl.detach()),
            ("logp_diff", (logp.detach() - sampler_logp).abs()),
            ("approx_kl", st["ratio"] - 1 - st["ratio"].log()),  # k3 of pi_old || pi
            ("dual_clipped", st["dual_clipped"]),
            ("is_ratio", st.get("is_ratio", torch.ones_like(logp))),
            ("is_cut", st.get("is_cut", torch.zeros_like(logp))),
        ):
            stats[name] += value[m].sum().item()
        stats["ratio_min"] = min(stats["ratio_min"], st["ratio"][m].min().item())
        stats["ratio_max"] = max(stats["ratio_max"], st["ratio"][m].max().item())
    return {k: distributed.reduce(v, k[6:] if k in ("ratio_min", "ratio_max") else "sum") for k, v in stats.items()}


def value_backward(
    critic, roll, mb: list[int], old_values, returns, mask, cfg, pad_id: int, device, backend: Backend, sums: dict
) -> None:
    """PPO's critic: accumulate the gradient of the clipped value loss (losses.value_loss) of one minibatch (rows
    `mb`), normalised by the global minibatch's tokens. old_values, returns, mask: (n, C) of this rank's rows.
    Adds this rank's loss and number of clipped values to sums["loss"] and sums["clipped"]."""
    from nanorl.reward_model import token_values  # the critic is a value head (reward_model.py): PPO only

    n_tokens = distributed.reduce(int(mask[mb].sum()))  # the critic's normaliser: the global minibatch's tokens
    for idx, w in distributed.even(critic, chunks(mb, cfg.micro_batch_size), [0]):  # FSDP: fillers of weight 0
        v = token_values(
            critic, [roll.prompt_ids[i] for i in idx], [roll.completion_ids[i] for i in idx], pad_id, device, backend
        )  # (b, c)
        c = v.shape[1]
        vl, vst = value_loss(v, old_values[idx, :c].to(device), returns[idx, :c].to(device), cfg.value_clip)
        m = mask[idx, :c].to(device) * w
        loss = (vl * m).sum() / n_tokens
        loss.backward()
        sums["loss"] += loss.item()
        sums["clipped"] += (vst["clipped"] * m).sum().item()


def merge_stats(total: dict, new: dict, grad_norm: float) -> None:
    """Add a minibatch's stats and its optimizer step's gradient norm (non-finite: a skipped update) to `total`."""
    for k, v in {**new, "grad_norm": grad_norm, "skipped": int(not math.isfinite(grad_norm))}.items():
        if k in ("ratio_min", "ratio_max"):
            total[k] = (min if k == "ratio_min" else max)(total.get(k, v), v)
        else:
            total[k] = total.get(k, 0) + v


def update_metrics(sums: dict, opt_steps: int) -> dict:
    """Per-token means of the sums `policy_backward` returns, over all minibatches of the step."""
    tt, any_tokens = max(sums["tokens"], 1), sums["tokens"] > 0
    return {
        "loss/policy": sums["loss"] / opt_steps,
        "loss/kl": sums["kl"] / tt,
        "policy/entropy": sums["entropy"] / tt,
        "policy/clip_frac": sums["clipped"] / tt,
        "policy/ratio_mean": sums["ratio"] / tt if any_tokens else 1.0,
        "policy/ratio_min": sums["ratio_min"] if any_tokens else 1.0,
        "policy/ratio_max": sums["ratio_max"] if any_tokens else 1.0,
        "policy/sampler_logp_diff": sums["logp_diff"] / tt,
        "policy/approx_kl": sums["approx_kl"] / tt,
        "policy/dual_clip_frac": sums["dual_clipped"] / tt,
        "policy/is_ratio_mean": sums["is_ratio"] / tt if any_tokens else 1.0,
        "policy/is_cut_frac": sums["is_cut"] / tt,
        "policy/trained_tokens": sums["tokens"],
        "optim/grad_norm": sums["grad_norm"] / opt_steps,
        "optim/skipped_updates": sums["skipped"],
    }

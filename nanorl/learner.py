"""Optimiser machinery shared by every loop: AdamW, warmup + schedule, clipping, one step."""

from __future__ import annotations

import math

import torch

from nanorl import distributed


def make_optimizer(model, cfg, total_steps: int, lr: float = 0.0):
    """AdamW over the trainable parameters at peak lr (cfg.lr unless given) and its schedule (lr_factor) -> both."""
    params, betas = [p for p in model.parameters() if p.requires_grad], (cfg.adam_beta1, cfg.adam_beta2)
    # fused: one kernel over all parameters; on 2 CPU cores a step over 135M parameters takes 0.06 s
    # instead of 0.3-2 s with the default foreach implementation (notes/LOG.md)
    opt = torch.optim.AdamW(params, lr or cfg.lr, betas, cfg.adam_epsilon, cfg.weight_decay, fused=True)
    allocate_state(opt)
    schedule = (cfg.warmup_steps, total_steps, cfg.lr_schedule, cfg.lr_min_ratio)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, *schedule))


def allocate_state(opt) -> None:
    """Create AdamW's two moments now, before any activation exists, and keep them. Allocated lazily,
    they land where the first step's activations were, so the second step's activations fault in fresh
    pages: its backward took 12.6 s instead of 8.6 s here (notes/LOG.md). One step with zero gradients
    at lr 0 creates the state without changing a weight, then the step counters go back to 0 and the
    gradients are freed (they exist only from a step's first backward to its update)."""
    lrs = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
        for p in g["params"]:
            p.grad = torch.zeros_like(p)
    opt.step()
    for g, lr in zip(opt.param_groups, lrs):
        g["lr"] = lr
        for p in g["params"]:
            opt.state[p]["step"].zero_()
    opt.zero_grad(set_to_none=True)


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str, floor: float) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warmup, then constant,
    cosine or linear decay to `floor`."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0 - (1 - floor) * progress


def optimizer_step(model, opt, sched, grad_clip: float) -> float:
    """Clip the global grad norm, step, advance the schedule, free the gradients (set to None: the
    rollout of the next step runs without them, 0.5 GiB less for the 135M model). Returns the pre-clip norm.
    A NaN or infinite norm (a non-finite loss or gradient anywhere) skips the update: the weights and AdamW's
    state stay as they were, the schedule still advances, and the caller sees the non-finite norm."""
    distributed.all_reduce_grads(model)  # under torchrun: every rank's gradient summed, before anything reads it
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    norm = getattr(norm, "full_tensor", lambda: norm)().item()  # FSDP: a DTensor, the norm over every shard
    if math.isfinite(norm):
        opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return norm


def count_bad_steps(skipped: int, bad: int, limit: int, step: int) -> int:
    """Steps in a row with updates skipped for a non-finite gradient (optimizer_step); after `limit` of them
    the run stops: the weights are those of the last good update, and every checkpoint written is intact."""
    bad = bad + 1 if skipped else 0
    if limit and bad >= limit:
        raise RuntimeError(
            f"{bad} steps in a row (up to step {step}) had a NaN or infinite loss or gradient; their "
            f"updates were skipped and the run stops here (max_bad_steps {limit}). Look for a reward "
            f"or a learning rate that is not finite, or lower the learning rate."
        )
    return bad

"""Losses: pure per-token functions plus the one normalizer, each documented against its paper.

All tensors are (B, C): B sequences, C completion positions; `mask` is 1 on completion tokens.
Per-token losses are summed and divided by one *global* token count (the whole minibatch, not the
micro-batch), so the gradient does not depend on how a minibatch is split for accumulation (DAPO's
"token-level" loss, arXiv 2503.14476 sec. 3.3).
"""

from __future__ import annotations

import torch


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_eps: float):
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) as a per-token loss to minimise.

    loss_t = max(-A * r_t, -A * clip(r_t, 1 - eps, 1 + eps)),  r_t = exp(logp_t - old_logp_t).
    Clipping binds only outside [1 - eps, 1 + eps] and only in the direction the sign of A rewards:
    r > 1 + eps for A > 0, r < 1 - eps for A < 0. There the gradient is zero.
    logp, old_logp (B, C); adv (B, 1) or (B, C). Returns loss (B, C) and per-token stats (B, C).
    """
    ratio = torch.exp(logp - old_logp)  # (B, C)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    loss = torch.maximum(unclipped, clipped)  # (B, C)
    stats = {"ratio": ratio.detach(), "clipped": (clipped > unclipped).float().detach()}
    return loss, stats


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || pi_ref) per token (Schulman, "Approximating KL divergence", 2020;
    GRPO eq. 4): exp(ref - logp) - (ref - logp) - 1 >= 0, and 0 where the two agree.
    The log-ratio is clamped to [-20, 20] so one token cannot overflow the loss."""
    log_ratio = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.exp(log_ratio) - log_ratio - 1.0


def token_sum(per_token: torch.Tensor, mask: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Sum of per-token values over the mask, divided by the global token count of the minibatch."""
    return (per_token * mask).sum() / max(n_tokens, 1)

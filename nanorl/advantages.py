"""Advantages: pure functions from rewards to per-sequence advantages, each returning (values, stats).

GRPO (DeepSeekMath, arXiv 2402.03300, eq. 3 / sec. 4.1.2): the advantage of sample i in a group of G
samples of one prompt is (r_i - mean(r)) / std(r). Dr. GRPO (arXiv 2503.20783) drops the division by
std, which up-weights nearly-solved and nearly-hopeless prompts in the original.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, scale_by_std: bool = True, eps: float = 1e-6):
    """rewards (N,) ordered group by group -> advantages (N,), stats.

    std is the population std of the group (correction 0). A group whose rewards are all equal has
    r_i - mean = 0 exactly, so its advantages are 0 (never NaN) and it contributes no gradient.
    """
    r = rewards.float().view(-1, group_size)  # (G_count, G)
    centered = r - r.mean(dim=1, keepdim=True)  # (G_count, G)
    std = r.std(dim=1, correction=0, keepdim=True)  # (G_count, 1)
    adv = centered / (std + eps) if scale_by_std else centered
    has_var = (std.squeeze(1) > 0).float()
    stats = {"frac_groups_with_variance": has_var.mean().item(), "adv_abs_mean": adv.abs().mean().item()}
    return adv.view(-1), stats

"""Advantages: pure functions from rewards to advantages, per sequence (GRPO family) or per token (GAE).

rewards (N,) are ordered group by group: sample i belongs to prompt i // group_size.

- GRPO (DeepSeekMath, arXiv 2402.03300, sec. 4.1.2): A_i = (r_i - mean(r_group)) / std(r_group).
- Dr. GRPO (arXiv 2503.20783, sec. 3.1): A_i = r_i - mean(r_group); the std division up-weights
  nearly-solved and nearly-hopeless prompts.
- RLOO (Ahmadian et al. 2024, arXiv 2402.14740, eq. 4): A_i = r_i - mean_{j != i} r_j, a baseline
  that does not contain the sample itself, so the estimate stays unbiased.
- REINFORCE++ (arXiv 2501.03262, sec. 3.2): the advantage of every token is the return (here the sequence's
  reward), whitened over all tokens of the batch: mean and std weigh each sequence by its length.
- REINFORCE++-baseline (verl `reinforce_plus_plus_baseline`, OpenRLHF `reinforce_baseline`): subtract the
  group mean, then whiten over the batch's tokens as REINFORCE++ does.

Every estimator takes the same arguments: rewards (N,), the group size, whether to divide by a std, and
`lengths` (N,) (the token-level estimators weigh by them) and `std_correction` (0: the population std, as
nanorl has always used; 1: the sample std with Bessel's correction, TRL's and verl's choice).
"""

from __future__ import annotations

import torch


def _centre(r: torch.Tensor, baseline: torch.Tensor) -> torch.Tensor:
    """r - baseline, exactly 0 where all rewards of the row are equal (a float mean of 0.3s is not 0.3)."""
    flat = r.amax(dim=-1, keepdim=True) == r.amin(dim=-1, keepdim=True)
    return torch.where(flat, torch.zeros_like(r), r - baseline)


def group_advantages(rewards, group_size: int, scale_by_std=True, eps=1e-6, lengths=None, std_correction=0):
    """GRPO / Dr. GRPO. A group whose rewards are all equal gets advantage 0 exactly (never NaN)."""
    r = rewards.float().view(-1, group_size)  # (groups, group_size)
    centered = _centre(r, r.mean(dim=1, keepdim=True))
    adv = centered / (r.std(dim=1, correction=std_correction, keepdim=True) + eps) if scale_by_std else centered
    return adv.view(-1)  # (N,)


def rloo_advantages(rewards, group_size: int, scale_by_std=False, eps=1e-6, lengths=None, std_correction=0):
    """RLOO: each sample's baseline is the mean reward of the *other* group_size - 1 samples of its group."""
    if group_size < 2:
        raise ValueError("config key 'samples_per_prompt': RLOO needs at least 2 samples per prompt")
    r = rewards.float().view(-1, group_size)  # (groups, group_size)
    baseline = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)  # (groups, group_size) excludes sample i
    adv = _centre(r, baseline)
    if scale_by_std:
        adv = adv / (r.std(dim=1, correction=std_correction, keepdim=True) + eps)
    return adv.view(-1)  # (N,)


def token_whiten(x: torch.Tensor, lengths: torch.Tensor, scale_by_std=True, eps=1e-6, std_correction=0):
    """Whiten per-sequence values x (N,) as if repeated over each sequence's tokens (lengths (N,)): the mean
    and std of the batch's tokens, so a long sequence weighs by its length. Equal values give exactly 0."""
    w = lengths.float()  # (N,) tokens of each sequence
    mean = (w * x).sum() / w.sum()
    adv = _centre(x, mean)
    if scale_by_std:
        adv = adv / (((w * (x - mean) ** 2).sum() / (w.sum() - std_correction).clamp(min=1)).sqrt() + eps)
    return adv


def batch_advantages(rewards, group_size: int, scale_by_std=True, eps=1e-6, lengths=None, std_correction=0):
    """REINFORCE++: the reward whitened over every token of the batch (arXiv 2501.03262, eq. 10-11).
    With lengths [10, 1, 1, 1] and rewards [1, 0, 0, 0] the long sequence gets 0.55, not the 1.73 a
    per-sequence normalisation gives. Without `lengths` every sequence counts as one token."""
    r = rewards.float()
    return token_whiten(r, torch.ones_like(r) if lengths is None else lengths, scale_by_std, eps, std_correction)


def group_batch_advantages(rewards, group_size: int, scale_by_std=True, eps=1e-6, lengths=None, std_correction=0):
    """REINFORCE++-baseline: subtract the group mean, then whiten over the batch's tokens. Groups with equal
    rewards get the shift of that whitening, not 0: they are trained, as in verl and OpenRLHF."""
    r = rewards.float().view(-1, group_size)  # (groups, group_size)
    centred = _centre(r, r.mean(dim=1, keepdim=True)).view(-1)  # (N,)
    return batch_advantages(centred, group_size, scale_by_std, eps, lengths, std_correction)


ESTIMATORS = {
    "group": group_advantages,
    "rloo": rloo_advantages,
    "batch": batch_advantages,
    "group_batch": group_batch_advantages,
}


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438, eq. 16), per token.

    rewards, values, mask: (B, C); values[t] = V(state before token t); the state after the last
    token is terminal (value 0). delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}.
    Returns advantages and returns A + V, both (B, C) and 0 on padding.
    """
    B, C = rewards.shape
    adv = torch.zeros_like(rewards)
    next_value, next_adv = torch.zeros(B, dtype=rewards.dtype), torch.zeros(B, dtype=rewards.dtype)
    for t in reversed(range(C)):  # padding has mask 0: it neither contributes nor passes values back
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_adv = (delta + gamma * lam * next_adv) * m
        next_value = values[:, t] * m
        adv[:, t] = next_adv
    return adv, (adv + values) * mask


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked entries of the whole batch (PPO advantage normalisation)."""
    n = mask.sum().clamp(min=1)
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / n
    return (x - mean) * torch.rsqrt(var + eps) * mask

"""Losses: pure per-token functions plus the weights that aggregate them, each cited to its paper.

All tensors are (B, C): B sequences, C completion positions; `mask` is 1 on completion tokens.
The minibatch loss is sum(weights * per_token_loss); the weights divide by counts of the *whole*
minibatch (never the micro-batch), so the gradient is the same however the minibatch is split.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MAX_LOG_RATIO = 20.0  # exp(20) = 4.9e8: any log-ratio beyond it is clamped (as verl and OpenRLHF do)


def policy_loss(logp, old_logp, adv, mask, clip_low: float, clip_high: float, ratio_level="token", clip_ratio_c=0.0):
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) as a per-token loss to minimise.

    loss_t = max(-A * r_t, -A * clip(r_t, 1 - clip_low, 1 + clip_high)),  r_t = exp(logp_t - old_logp_t).
    Clipping binds only outside the range and only in the direction the sign of A rewards:
    r > 1 + clip_high for A > 0, r < 1 - clip_low for A < 0; there the gradient is zero.
    clip_low != clip_high is DAPO's "clip-higher" (arXiv 2503.14476, eq. 10).
    ratio_level="sequence" is GSPO (arXiv 2507.18071, eq. 7): one ratio per sequence,
    s_i = exp(mean_t(logp_t - old_logp_t)), the length-normalised sequence likelihood ratio.
    clip_ratio_c > 1 is dual-clip PPO (Ye et al. 2020, arXiv 1912.09729, eq. 5; verl's clip_ratio_c): for
    A < 0 the loss is at most -A * c, so a token whose ratio has grown huge cannot dominate the step.
    The log-ratio is clamped to +-MAX_LOG_RATIO first: the loss and its gradient stay finite at any gap
    between the policies, and values inside the bound are unchanged.
    logp, old_logp, mask (B, C); adv (B, 1) or (B, C). Returns loss (B, C) and per-token stats (B, C).
    """
    log_ratio = logp - old_logp  # (B, C)
    if ratio_level == "sequence":
        seq = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # (B, 1)
        log_ratio = seq.expand_as(logp)
    ratio = torch.exp(torch.clamp(log_ratio, -MAX_LOG_RATIO, MAX_LOG_RATIO))  # (B, C)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)  # (B, C)
    dual = torch.zeros_like(loss, dtype=torch.bool)
    if clip_ratio_c > 0:
        bound = -adv * clip_ratio_c  # (B, 1) or (B, C)
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(dual, bound.expand_as(loss), loss)
    stats = {"ratio": ratio.detach(), "clipped": (clipped > unclipped).float().detach(), "dual_clipped": dual.float()}
    return loss, stats


def mismatch_weights(learner_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, mode: str, cap: float):
    """Importance weights that correct for a sampler whose log-probs differ from the learner's (bf16 or
    another kernel or engine): rho = pi_learner_old / pi_sampler per token (token_*) or, as the product over
    the completion, per sequence (sequence_*). *_truncate: min(rho, cap), truncated importance sampling
    (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"; TRL's
    vllm_importance_sampling_mode). *_mask: rho inside the band [1 / cap, cap], else 0 (the token or the whole
    sequence leaves the loss; masked IS, as TRL and verl's rollout correction do). All (B, C) -> weights
    (B, C) without gradient, and per-token stats: rho, and where it was truncated or masked."""
    log_rho = torch.clamp((learner_logp - sampler_logp) * mask, -MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, C)
    if mode.startswith("sequence"):
        log_rho = torch.clamp(log_rho.sum(-1, keepdim=True), -MAX_LOG_RATIO, MAX_LOG_RATIO).expand_as(mask)
    rho = torch.exp(log_rho).detach()  # (B, C)
    if mode.endswith("truncate"):
        cut = rho > cap
        weights = torch.clamp(rho, max=cap)
    elif mode.endswith("mask"):
        cut = (rho > cap) | (rho < 1.0 / cap)
        weights = torch.where(cut, torch.zeros_like(rho), rho)
    else:
        raise ValueError(
            f"config key 'is_mode': expected none|token_truncate|token_mask|sequence_truncate|"
            f"sequence_mask, got {mode!r}"
        )
    return weights, {"is_ratio": rho, "is_cut": cut.float()}


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimators of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL
    divergence", 2020), with log r = ref_logp - logp:
      k1 = -log r                  unbiased, can be negative
      k2 = (log r)^2 / 2           biased, >= 0; as a loss its gradient on-policy is the reverse-KL gradient
      k3 = r - 1 - log r           unbiased, >= 0 (GRPO eq. 4); as a loss its gradient is biased
                                   (arXiv 2510.01555); k1 placed in the reward is the exact alternative
    All are 0 where the policies agree. log r is clamped to [-20, 20] so no token can overflow the loss."""
    log_r = torch.clamp(ref_logp - logp, -20.0, 20.0)
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r**2
    if kind == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"config key 'kl_estimator': expected k1|k2|k3, got {kind!r}")


def loss_weights(mask: torch.Tensor, mode: str, n_tokens: int, n_seqs: int, max_len: int) -> torch.Tensor:
    """Per-token weights (B, C) that turn a per-token loss into the minibatch loss.

    token:    1 / (tokens in the minibatch)                    DAPO token-level loss (arXiv 2503.14476, eq. 12)
    sequence: 1 / (len_i * sequences in the minibatch)         GRPO's per-sequence mean (arXiv 2402.03300, eq. 3)
    constant: 1 / (max_new_tokens * sequences in the minibatch) Dr. GRPO (arXiv 2503.20783, eq. 3)
    n_tokens, n_seqs are counts of the whole minibatch, so micro-batching does not change the gradient.
    """
    if mode == "token":
        return mask / max(n_tokens, 1)
    if mode == "sequence":
        return mask / (mask.sum(-1, keepdim=True).clamp(min=1) * max(n_seqs, 1))
    if mode == "constant":
        return mask / (max_len * max(n_seqs, 1))
    raise ValueError(f"config key 'loss_agg': expected token|sequence|constant, got {mode!r}")


def dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta: float, kind="sigmoid", label_smoothing=0.0):
    """Preference losses on sequence log-probs, all (B,) -> loss (B,) and stats.

    h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l)), the implicit reward margin / beta.
      sigmoid: -log sigmoid(beta h)  DPO (Rafailov et al. 2023, arXiv 2305.18290, eq. 7); with label
               smoothing eps: -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h) (conservative DPO)
      ipo:     (h - 1 / (2 beta))^2   IPO (Azar et al. 2023, arXiv 2310.12036, eq. 17)
      hinge:   max(0, 1 - beta h)     SLiC-HF (Zhao et al. 2023, arXiv 2305.10425)
    The implicit rewards beta (log pi - log ref) of chosen and rejected are returned for metrics.
    """
    h = (chosen - ref_chosen) - (rejected - ref_rejected)  # (B,)
    if kind == "sigmoid":
        loss = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif kind == "ipo":
        loss = (h - 1 / (2 * beta)) ** 2
    elif kind == "hinge":
        loss = torch.relu(1 - beta * h)
    else:
        raise ValueError(f"config key 'loss': expected sigmoid|ipo|hinge, got {kind!r}")
    r_w, r_l = beta * (chosen - ref_chosen).detach(), beta * (rejected - ref_rejected).detach()
    return loss, {"chosen_reward": r_w, "rejected_reward": r_l, "margin": r_w - r_l, "acc": (r_w > r_l).float()}


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float):
    """Clipped value loss (the PPO implementations' form, e.g. Huang et al. 2022, "The 37 implementation
    details of PPO", item 9): 0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), per token (B, C).
    clip = 0 turns clipping off."""
    unclipped = (values - returns) ** 2
    if clip <= 0:
        return 0.5 * unclipped, {"clipped": torch.zeros_like(values)}
    v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
    clipped = (v_clip - returns) ** 2
    # clipping is active where the clamp binds and the clipped loss is the larger: read from the clamp, since
    # old + (V - old) can differ from V by rounding where the clamp does not bind
    active = ((values - old_values).abs() > clip) & (clipped > unclipped)
    return 0.5 * torch.maximum(unclipped, clipped), {"clipped": active.float().detach()}

"""The sampler: batched decoding with a KV cache, one prefill per prompt shared by its whole group.

    rollouts = generate(model, [prompt_ids, ...], n=8, params=SamplingParams(max_new_tokens=32),
                        stop_ids=[2], seed=123)

Why not `model.generate`? Three reasons. (1) A group of n samples of one prompt shares its prompt, so
we prefill each prompt once and repeat its KV cache n times (`batch_repeat_interleave`). (2) Finished
rows are dropped from the batch, so late steps cost only what is still running. (3) Only the settings
given here shape the distribution: generation-config defaults shipped with a model (top-k, repetition
penalty, ...) are never applied behind the caller's back.

The log-prob recorded for each token is under the policy softmax(logits / temperature), before any
top-k / top-p truncation, so it is exactly what `token_logprobs` computes for the same sequence.
"""

from __future__ import annotations


from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nanorl.models import cache_kwarg, fast_forward


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0


@dataclass
class Rollouts:
    """N = len(prompts) * n samples, ordered group by group (sample i belongs to group i // n)."""

    prompt_ids: list[list[int]]  # (N, prompt length)
    completion_ids: list[list[int]]  # (N, completion length), including the stop token if one was sampled
    logprobs: list[torch.Tensor]  # (N,) tensors of (completion length,), sampler log-probs
    truncated: list[bool]  # hit max_new_tokens without a stop token
    n: int  # group size

    def groups(self, idx: list[int]) -> "Rollouts":
        """The rollouts of groups `idx` (in that order)."""
        rows = [g * self.n + j for g in idx for j in range(self.n)]
        return Rollouts(*([getattr(self, f)[i] for i in rows] for f in
                          ("prompt_ids", "completion_ids", "logprobs", "truncated")), n=self.n)

    def __add__(self, other: "Rollouts") -> "Rollouts":
        return Rollouts(self.prompt_ids + other.prompt_ids, self.completion_ids + other.completion_ids,
                        self.logprobs + other.logprobs, self.truncated + other.truncated, self.n)


def left_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids and attention mask with every row right-aligned."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s)
            mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)


def sample_token(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator):
    """logits (A, V) -> (token ids (A,), policy log-probs of those tokens (A,))."""
    if params.temperature == 0:
        logp = F.log_softmax(logits.float(), dim=-1)
        token = logp.argmax(-1)
        return token, logp.gather(-1, token[:, None]).squeeze(-1)
    logp = F.log_softmax(logits.float() / params.temperature, dim=-1)  # (A, V) the policy
    masked = logp
    if params.top_k > 0:
        kth = torch.topk(masked, min(params.top_k, masked.shape[-1]), dim=-1).values[:, -1:]
        masked = masked.masked_fill(masked < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logp, order = masked.sort(dim=-1, descending=True)
        cum = sorted_logp.exp().cumsum(-1)
        drop_sorted = cum - sorted_logp.exp() >= params.top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        masked = masked.masked_fill(drop, float("-inf"))
    # Inverse-CDF sampling: one uniform number per row. torch.multinomial draws an exponential for every
    # vocabulary entry instead (49k per row), which took a fifth of the rollout time on CPU (notes/LOG.md).
    cdf = (masked - masked.amax(-1, keepdim=True)).exp().cumsum(-1)  # (A, V) unnormalised
    u = torch.rand(len(cdf), 1, generator=gen, device=cdf.device) * cdf[:, -1:]  # (A, 1) in [0, total)
    token = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)  # zero-width bins never win
    return token, logp.gather(-1, token[:, None]).squeeze(-1)


@torch.no_grad()
def generate(model, prompts: list[list[int]], n: int, params: SamplingParams, stop_ids: list[int],
             seed: int, pad_id: int = 0) -> Rollouts:
    """Sample n completions for each prompt; deterministic for a given seed, model and device."""
    with fast_forward(model, pack_weights=True):
        return _generate(model, prompts, n, params, stop_ids, seed, pad_id)


def _generate(model, prompts, n, params, stop_ids, seed, pad_id) -> Rollouts:
    from transformers import DynamicCache

    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    stops = torch.tensor(stop_ids, device=device)

    # --- prefill: each distinct prompt once, then repeat its cache for the n samples of its group
    ids, mask = left_pad(prompts, pad_id, device)  # (P, Lp)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    cache_kw = cache_kwarg(model)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                **{cache_kw: cache})
    if n > 1:
        cache.batch_repeat_interleave(n)
    logits = out.logits[:, -1].repeat_interleave(n, 0)  # (N, V)
    mask = mask.repeat_interleave(n, 0)  # (N, Lp)
    next_pos = pos[:, -1].repeat_interleave(n, 0) + 1  # (N,)

    N = len(prompts) * n
    alive = torch.arange(N, device=device)  # rows of the full batch still generating
    tokens: list[list[int]] = [[] for _ in range(N)]
    logps: list[list[float]] = [[] for _ in range(N)]
    truncated = [True] * N

    # --- decode: one token per step for the rows still alive
    for t in range(params.max_new_tokens):
        token, lp = sample_token(logits, params, gen)  # (A,), (A,)
        done = torch.isin(token, stops)
        for row, tk, l, d in zip(alive.tolist(), token.tolist(), lp.tolist(), done.tolist()):
            tokens[row].append(tk)
            logps[row].append(l)
            if d:
                truncated[row] = False
        if t == params.max_new_tokens - 1:
            break
        if done.any():  # drop finished rows from the batch and the cache
            keep = (~done).nonzero().squeeze(-1)
            if keep.numel() == 0:
                break
            cache.batch_select_indices(keep)
            alive, token, mask, next_pos = alive[keep], token[keep], mask[keep], next_pos[keep]
        mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=1)
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                    use_cache=True, **{cache_kw: cache})
        logits = out.logits[:, -1]
        next_pos = next_pos + 1

    return Rollouts(prompt_ids=[list(p) for p in prompts for _ in range(n)], completion_ids=tokens,
                    logprobs=[torch.tensor(x) for x in logps], truncated=truncated, n=n)

"""The sampler: batched decoding with a KV cache, one prefill per prompt shared by its whole group.

    sampler = LocalSampler(model, stop_ids=[2], pad_id=0)           # what the loops call (the Sampler interface)
    rollouts = sampler.generate([prompt_ids, ...], group_size=8, params=SamplingParams(max_new_tokens=32), seed=123)

Why not `model.generate`? Four reasons. (1) A group of group_size samples of one prompt shares its prompt, so
we prefill each prompt once and its KV cache serves all group_size samples. (2) Finished rows are dropped from
the batch, so late steps cost only what is still running. (3) On CPU, Llama-family models decode with
backends/decode.py's step (the backend decides, backends/__init__.py) (C++ kernels for attention and the small
ops), 1.3-1.4x the tokens/s of their
transformers forward (benchmarks/decode.py); other models run their own (`ModelStep`). (4) Only the
settings given here shape the distribution: generation-config defaults shipped with a model (top-k,
repetition penalty, ...) are never applied behind the caller's back.

The log-prob recorded for each token is under the policy softmax(logits / temperature), before any
top-k / top-p truncation, so it is exactly what `token_logprobs` computes for the same sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from nanorl import distributed
from nanorl.backends import Backend
from nanorl.data import left_pad, render_prompt
from nanorl.logprobs import AUTO, cache_kwarg, select_cache_rows
from nanorl.seeds import derive_seed


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # > 1: tokens already in the prompt or the completion made less likely


@dataclass
class Rollouts:
    """N = len(prompts) * group_size samples, ordered group by group (sample i belongs to group i // group_size)."""

    prompt_ids: list[list[int]]  # (N, prompt length)
    completion_ids: list[list[int]]  # (N, completion length), including the stop token if one was sampled
    logprobs: list[torch.Tensor]  # (N,) tensors of (completion length,), sampler log-probs
    truncated: list[bool]  # hit max_new_tokens without a stop token
    group_size: int  # samples per prompt, rows i of a group: g * group_size + j
    # Episodes with tools (agents/): (N,) tensors of (completion length,), 1 on the tokens the model wrote, 0 on
    # tool and environment tokens (never trained; their log-probs are 0). None: every token is the model's.
    model_mask: list[torch.Tensor] | None = None
    episodes: list[dict] | None = None  # (N,) what an episode was: its messages, tool calls, failures, turns

    def model_tokens(self, i: int) -> int:
        """How many tokens of row i the model wrote (what the loss trains and its normalisers count)."""
        return len(self.completion_ids[i]) if self.model_mask is None else int(self.model_mask[i].sum())

    def groups(self, idx: list[int]) -> "Rollouts":
        """The rollouts of groups `idx` (in that order)."""
        rows = [g * self.group_size + j for g in idx for j in range(self.group_size)]
        rows_of = {f: getattr(self, f) and [getattr(self, f)[i] for i in rows] for f in ROWS}
        return Rollouts(**rows_of, group_size=self.group_size)

    def __add__(self, other: "Rollouts") -> "Rollouts":
        both = {f: getattr(self, f) and getattr(self, f) + getattr(other, f) for f in ROWS}  # None stays None
        return Rollouts(**both, group_size=self.group_size)


ROWS = ("prompt_ids", "completion_ids", "logprobs", "truncated", "model_mask", "episodes")  # one entry per row


def sample_token(logits: torch.Tensor, params: SamplingParams, u: torch.Tensor | None, seen=None):
    """logits (A, V) and one uniform number in [0, 1) per row u (A, 1) -> (token ids (A,), policy log-probs of
    those tokens (A,)). Greedy (temperature 0) needs no u. `seen` (A, V): the tokens of each row's prompt and
    completion so far, for the repetition penalty."""
    z = logits.float() if params.temperature in (0, 1) else logits.float() / params.temperature  # (A, V)
    probs = torch.softmax(z, dim=-1)  # (A, V) the policy
    if seen is not None:  # CTRL's repetition penalty (arXiv 1909.05858) before the temperature, as transformers, vLLM
        x, r = logits.float(), params.repetition_penalty
        z = torch.where(seen, torch.where(x > 0, x / r, x * r), x) / (params.temperature or 1.0)  # (A, V)
    if params.temperature == 0:
        token = z.argmax(-1)
        return token, probs.gather(-1, token[:, None]).squeeze(-1).log()
    weights = probs if seen is None else torch.softmax(z, dim=-1)  # truncated as vLLM does: min-p, top-k, top-p
    if params.min_p > 0:  # min-p (arXiv 2407.01082): tokens under min_p x the most likely one's probability
        weights = weights.masked_fill(weights < params.min_p * weights.max(-1, keepdim=True).values, 0.0)
    if params.top_k > 0:
        kth = torch.topk(weights, min(params.top_k, weights.shape[-1]), dim=-1).values[:, -1:]
        weights = weights.masked_fill(weights < kth, 0.0)
    if params.top_p < 1.0:
        sorted_p, order = weights.sort(dim=-1, descending=True)
        mass = sorted_p.cumsum(-1) - sorted_p  # (A, V) before each token; keep the smallest prefix reaching top_p
        drop_sorted = mass >= params.top_p * (sorted_p[:, -1:] + mass[:, -1:])  # of what min-p and top-k left
        weights = weights.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), 0.0)
    token = inverse_cdf(weights, u)
    return token, probs.gather(-1, token[:, None]).squeeze(-1).log()  # log of the untruncated policy


def inverse_cdf(w: torch.Tensor, u: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Rows of weights w (A, V) >= 0 and uniforms u (A, 1) in [0, 1) -> (A,) the first index whose running
    sum passes u * total: an exact draw from w / w.sum(-1). torch.multinomial draws an exponential for every
    entry (49k per row; a fifth of the rollout on CPU once); a cumsum over the vocabulary was the next
    slowest pass, so two levels: block sums, then a running sum inside the one block that holds the draw."""
    A, V = w.shape
    nb = -(-V // block)
    if nb * block != V:
        w = F.pad(w, (0, nb * block - V))  # zero weights never win
    blocks = w.view(A, nb, block)
    sums = blocks.sum(-1)  # (A, nb)
    cdf = sums.cumsum(-1)  # (A, nb)
    target = u * cdf[:, -1:]  # (A, 1) in [0, total)
    b = torch.minimum(torch.searchsorted(cdf, target, right=True), _last_positive(cdf))  # (A, 1) the block
    inner = blocks.gather(1, b[:, :, None].expand(A, 1, block)).squeeze(1).cumsum(-1)  # (A, block)
    rest = target - (cdf.gather(-1, b) - sums.gather(-1, b))  # (A, 1) what is left to pass inside the block
    j = torch.minimum(torch.searchsorted(inner, rest, right=True), _last_positive(inner))  # (A, 1)
    return (b * block + j).squeeze(-1)


def _last_positive(cum: torch.Tensor) -> torch.Tensor:
    """(A, 1) index of the last entry with positive weight, from running sums (A, K): where the sum stops
    growing. Rounding can leave a target a hair above the total; such a draw takes this entry."""
    return (cum < cum[:, -1:]).sum(-1, keepdim=True)


class Sampler(Protocol):
    """What the loops call for rollouts and evaluation. Another engine (an inference server, vLLM) plugs in by
    implementing these two methods; the loops do not change."""

    def generate(
        self, prompts: list[list[int]], group_size: int, params: SamplingParams, seed: int | list[int]
    ) -> Rollouts:
        """group_size completions of each prompt (token ids), with the policy's log-prob of every sampled token. `seed`:
        one per prompt (a prompt's draws then do not depend on the batch it is in: data parallel ranks sample
        what one process would), or an int s meaning derive_seed(s, i, "prompt") for prompt i."""

    def sync_weights(self, model) -> None:
        """Called after each update with the trained model: an engine holding its own copy loads it here."""


class LocalSampler:
    """Samples from the training model itself, in this process (so `sync_weights` has nothing to copy)."""

    def __init__(self, model, stop_ids: list[int], pad_id: int, backend: Backend = AUTO):
        self.model, self.stop_ids, self.pad_id, self.backend = model, stop_ids, pad_id, backend
        self.prefill = prefill_prompts  # agents/prefixes.py swaps in one that reuses the last turn's cache

    def generate(
        self, prompts: list[list[int]], group_size: int, params: SamplingParams, seed: int | list[int]
    ) -> Rollouts:
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling, whatever mode the caller keeps the model in
        try:  # FSDP: on the gathered weights (ranks stop decoding at different steps)
            with distributed.full_weights(self.model):
                settings = (self.stop_ids, seed, self.pad_id, self.backend, self.prefill)
                return generate(self.model, prompts, group_size, params, *settings)
        finally:
            self.model.train(was_training)

    def sync_weights(self, model) -> None:
        assert model is self.model, "LocalSampler samples from the model it was built with"


class ModelStep:
    """A decode step through the model's own forward on its transformers cache (any model): the cache holds
    the rows still sampling, so it drops finished rows (`select_cache_rows`) and grows by one position a step."""

    def __init__(self, model, cache, mask, group_size):
        self.model, self.cache, self.kw = model, cache, cache_kwarg(model)
        self.rows = torch.arange(len(mask) * group_size, device=mask.device)
        # (P, ...) -> (P * group_size, ...): each prompt's cache once per sample
        select_cache_rows(cache, self.rows // group_size)
        self.mask = mask.repeat_interleave(group_size, 0)  # (N, Lp)

    def __call__(self, tokens, rows, positions, t):
        if len(rows) < len(self.rows):
            keep = torch.searchsorted(self.rows, rows)
            select_cache_rows(self.cache, keep)
            self.rows, self.mask = rows, self.mask[keep]
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(rows), 1)], dim=1)
        kw = {self.kw: self.cache, "use_cache": True}
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask, position_ids=positions[:, None], **kw)
        return out.logits[:, -1]  # (A, V)


def prefill_prompts(model, prompts: list[list[int]], pad_id: int, device):
    """The prompts through the model, left-padded -> (transformers cache, mask (P, Lp), last position's logits (P, V),
    last position (P,))."""
    from transformers import DynamicCache

    ids, mask = left_pad(prompts, pad_id, device)  # (P, Lp)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    kw = {cache_kwarg(model): cache}
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1, **kw)
    return cache, mask, out.logits[:, -1], pos[:, -1]


@torch.no_grad()
def generate(
    model, prompts, group_size: int, params: SamplingParams, stop_ids: list[int], seed, pad_id=0, backend=AUTO,
    prefill=prefill_prompts, lean=True,
) -> Rollouts:  # fmt: skip
    """Sample group_size completions for each prompt; deterministic for a given seed (one per prompt, or an int for all:
    Sampler.generate), model and device. `lean=False` decodes with the model's own forward even where
    backends/decode.py's faster step applies."""
    with backend.forward(model, pack_weights=True) as packed:
        device = next(model.parameters()).device
        seeds = seed if isinstance(seed, list) else [derive_seed(seed, i, "prompt") for i in range(len(prompts))]
        draws = [
            torch.rand(group_size, params.max_new_tokens, generator=torch.Generator().manual_seed(s)) for s in seeds
        ]
        noise = None if params.temperature == 0 else torch.cat(draws).to(device)  # (N, T) each prompt's, its own seed
        stops = torch.tensor(stop_ids, device=device)

        # --- prefill: each distinct prompt once; its cache serves the group_size samples of its group
        cache, mask, logits, last = prefill(model, prompts, pad_id, device)
        logits = logits.repeat_interleave(group_size, 0)  # (N, V)
        next_pos = last.repeat_interleave(group_size, 0) + 1  # (N,)
        step = (
            lean
            and backend.decoder(model, packed, cache, mask, group_size, params.max_new_tokens)
            or ModelStep(model, cache, mask, group_size)
        )  # backends/decode.py's step where it applies, else the model's

        N = len(prompts) * group_size
        alive = torch.arange(N, device=device)  # rows of the full batch still generating
        seen = None  # (N, V) the tokens each row has seen, for the repetition penalty
        if params.repetition_penalty != 1:
            seen = torch.zeros(N, logits.shape[-1], dtype=torch.bool, device=device)
            for i, p in enumerate(prompts):
                seen[i * group_size : (i + 1) * group_size, p] = True
        tokens: list[list[int]] = [[] for _ in range(N)]
        logps: list[list[float]] = [[] for _ in range(N)]
        truncated = [True] * N

        # --- decode: one token per step for the rows still alive
        for t in range(params.max_new_tokens):
            u, mine = None if noise is None else noise[alive, t][:, None], None if seen is None else seen[alive]
            token, lp = sample_token(logits, params, u, mine)  # (A,), (A,)
            if seen is not None:
                seen[alive, token] = True
            done = torch.isin(token, stops)
            for row, tk, logp, d in zip(alive.tolist(), token.tolist(), lp.tolist(), done.tolist()):
                tokens[row].append(tk)
                logps[row].append(logp)
                truncated[row] = not d  # a row that samples a stop token is done: it leaves the batch below
            if t == params.max_new_tokens - 1:
                break
            if done.any():  # drop finished rows from the batch
                keep = (~done).nonzero().squeeze(-1)
                if keep.numel() == 0:
                    break
                alive, token, next_pos = alive[keep], token[keep], next_pos[keep]
            logits = step(token, alive, next_pos, t)  # (A, V)
            next_pos = next_pos + 1

        prompt_ids = [list(p) for p in prompts for _ in range(group_size)]
        return Rollouts(prompt_ids, tokens, [torch.tensor(x) for x in logps], truncated, group_size)


def sample_episodes(
    sampler, tok, examples, group_size, params, seeds, system_prompt="", agent=None, seed=0, first_row=0
):
    """group_size episodes of each example (the training rollout's and the evaluation's) -> rollouts and the texts
    a reward scores. `seeds`: one per example. Without an agent an episode is one answer. With one (tools or an
    environment: agents/episodes.py) it goes on while the model calls tools, from the seed and each episode's row
    (`first_row`: this process's first row in the global batch); the texts are the episodes' last replies."""
    if agent is None:
        prompts = [render_prompt(tok, ex.prompt, system_prompt) for ex in examples]
        roll = sampler.generate(prompts, group_size, params, seeds)
        return roll, [tok.decode(c, skip_special_tokens=True) for c in roll.completion_ids]
    prompts = agent.prompts(tok, examples, group_size, system_prompt)  # tools; an environment's opening per episode
    seeds = agent.seeds(seeds, len(prompts), seed, first_row)
    with agent.reuse_prefixes(sampler):  # later turns prefill only what the last one added
        roll = sampler.generate(prompts, group_size if len(prompts) == len(examples) else 1, params, seeds)
        roll.group_size = group_size
        agent.play(sampler, tok, roll, params, seed, first_row)  # the episodes that called tools go on, turn by turn
    return roll, agent.answers(tok, roll)

"""Later turns of an episode prefill only what the last turn added. Turn k+1's prompt is turn k's prompt, the reply
and the tool results: LocalSampler would read the whole episode again every turn (with a six-turn environment that is
most of a rollout's time), so while episodes run its prefill is `PrefixCache`, which keeps the keys and values of the
last prefill and reads only the new tokens on top of them (what vLLM's automatic prefix caching does for it).

    with reuse_prefixes(sampler):              # a LocalSampler; any other sampler is left as it is
        roll = sampler.generate(prompts, ...)  # prefilled whole; its cache is kept
        more = sampler.generate(longer, ...)   # each prompt that extends a kept one: only its new tokens

The cache a decode step reads stays left-padded and contiguous (backends/decode.py's step needs that): in a batch
whose longest new part is n tokens, every row reads its last n tokens (some of them already cached) on top of the
kept keys and values of the rest. The keys are cached after the rotary embedding at each token's position, which
does not change when an episode grows, so reused and recomputed values differ only by float rounding.
"""

from __future__ import annotations

import contextlib

import torch

from nanorl.logprobs import cache_kwarg, select_cache_rows


@contextlib.contextmanager
def reuse_prefixes(sampler):
    """While the block runs, `sampler`'s prefill (LocalSampler's) reuses the last prefill's cache; afterwards the kept
    cache is dropped."""
    plain = getattr(sampler, "prefill", None)
    if plain is None:  # another engine: its own caching, if any
        yield
        return
    sampler.prefill = PrefixCache(plain)
    try:
        yield
    finally:
        sampler.prefill = plain


class PrefixCache:
    """A prefill (sampling.prefill_prompts' signature) that keeps the keys and values of its last batch of prompts
    and, for a prompt that extends one of them, reads only the tokens past it."""

    def __init__(self, plain):
        self.plain = plain
        self.prompts: dict[tuple, int] = {}  # last batch's prompts -> their row in `layers`
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []  # (P, kv heads, L, d) keys and values per layer
        self.start: list[int] = []  # first real position of each kept row (rows are left-padded)

    def __call__(self, model, prompts: list[list[int]], pad_id: int, device):
        found = [self.longest_kept(p) for p in prompts]  # (row, tokens kept) or None
        if any(found):
            cache, mask, logits, last = self.extend(model, prompts, found, pad_id, device)
        else:  # each distinct prompt once (an environment's episodes start with one prompt each, often the same)
            distinct = list(dict.fromkeys(map(tuple, prompts)))
            cache, mask, logits, last = self.plain(model, [list(p) for p in distinct], pad_id, device)
            if len(distinct) < len(prompts):
                row = {p: i for i, p in enumerate(distinct)}
                idx = torch.tensor([row[tuple(p)] for p in prompts], device=mask.device)
                select_cache_rows(cache, idx)
                mask, logits, last = mask[idx], logits[idx], last[idx]
        self.keep(prompts, cache, mask)
        return cache, mask, logits, last

    def longest_kept(self, prompt: list[int]) -> tuple[int, int] | None:
        """(row, length) of the longest kept prompt that `prompt` starts with (at most all but its last token)."""
        for n in sorted({len(k) for k in self.prompts}, reverse=True):
            row = self.prompts.get(tuple(prompt[:n])) if n <= len(prompt) else None
            if row is not None:
                return row, min(n, len(prompt) - 1)
        return None

    def extend(self, model, prompts, found, pad_id: int, device):
        """Each row reads its last n tokens (n: the longest part not kept) on the kept keys and values of the rest."""
        from transformers import DynamicCache

        kept = [k[1] if k else 0 for k in found]
        n = max(len(p) - k for p, k in zip(prompts, kept))  # tokens each row reads now
        past = [max(len(p) - n, 0) for p in prompts]  # tokens each row takes from the kept cache
        width = max(past)
        ids = torch.full((len(prompts), n), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width + n), dtype=torch.long)
        for i, p in enumerate(prompts):
            tail = p[past[i] :]
            ids[i, n - len(tail) :] = torch.tensor(tail)
            mask[i, width + n - len(p) :] = 1  # every row's tokens contiguous at the right
        cache = DynamicCache()
        for layer, (keys, values) in enumerate(self.layers):  # (B, kv heads, width, d): each row's kept part
            k = keys.new_zeros(len(prompts), keys.shape[1], width, keys.shape[3])
            v = values.new_zeros(len(prompts), values.shape[1], width, values.shape[3])
            for i, (f, m) in enumerate(zip(found, past)):
                if m:
                    s = self.start[f[0]]
                    k[i, :, width - m :], v[i, :, width - m :] = keys[f[0], :, s : s + m], values[f[0], :, s : s + m]
            cache.update(k, v, layer)
        ids, mask = ids.to(device), mask.to(device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, width:]  # (B, n)
        kw = {cache_kwarg(model): cache}
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1, **kw)
        return cache, mask, out.logits[:, -1], pos[:, -1]

    def keep(self, prompts, cache, mask) -> None:
        """Keep this batch's keys and values (the decode that follows builds new tensors; these are not changed)."""
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        if any(type(layer).__name__ != "DynamicLayer" for layer in cache.layers) or any(k is None for k, _ in layers):
            self.prompts, self.layers = {}, []  # sliding windows, shared layers: not kept
            return
        self.prompts = {tuple(p): i for i, p in enumerate(prompts)}
        self.layers = layers
        self.start = (mask.shape[1] - mask.sum(-1)).tolist()

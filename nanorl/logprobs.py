"""Log-probs: the one function every loss reads the policy through, and its pieces.

    logp, entropy = token_logprobs(model, batch, temperature, with_entropy=True, backend=backend)  # (b, C) each
    logp_sum, n_tokens = sequence_logprobs(model, batch)                                             # (b,), (b,)

A `data.Batch` stores each distinct prompt once (a GRPO group, a DPO pair): the prompts run once, their KV
cache is repeated for the sequences that continue them, and only completion positions reach the LM head.
"""

from __future__ import annotations

import inspect

import torch

from nanorl.backends import Backend

AUTO = Backend()


def cache_kwarg(model) -> str:
    """transformers >= 5.2x names the KV-cache argument `cache`; older releases `past_key_values`. A peft model
    passes it through to the model it wraps."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def select_cache_rows(cache, idx: torch.Tensor) -> None:
    """Keep rows idx (repeats allowed) of every layer's keys and values, in place. index_select, not the
    advanced indexing of transformers' batch_select_indices: the latter's backward adds repeated rows with
    racing threads on CPU (the same update gave different gradients run to run, notes/LOG.md), and its
    forward is ~5x slower here (a (64, 3, 60, 64) cache: 240 against 45 us)."""
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.numel() > 0:  # a layer can hold nothing (shared KV)
            layer.keys, layer.values = layer.keys.index_select(0, idx), layer.values.index_select(0, idx)


def token_logprobs(model, batch, temperature: float = 1.0, with_entropy: bool = False, backend: Backend = AUTO):
    """Log-probs of each completion token under softmax(logits / temperature), for a `data.Batch`.

    Two forwards that together cost one: the k distinct prompts once (keeping the KV cache and the
    last position's logits), then the b completions on top of the cache, repeated per sequence with
    autograd-friendly indexing so gradients from every sample reach the shared prompt. Logits are
    computed only at positions that predict completion tokens, never for the prompt.
    Returns logp (b, C) and, if asked, the policy entropy at those positions (b, C) (with its gradient).
    """
    from transformers import DynamicCache

    with backend.forward(model):
        kw = cache_kwarg(model)
        pmask, idx = batch.prompt_mask, batch.prompt_index
        ppos = (pmask.cumsum(-1) - 1).clamp(min=0)  # (k, P) left padding safe
        cache = DynamicCache()
        out = model(
            input_ids=batch.prompt_ids,
            attention_mask=pmask,
            position_ids=ppos,
            use_cache=True,
            logits_to_keep=1,
            **{kw: cache},
        )
        first = out.logits[:, -1].index_select(0, idx)  # (b, V): predicts the first completion token
        select_cache_rows(cache, idx)  # (k, ...) -> (b, ...), differentiable
        C, target = batch.completion_ids.shape[1], batch.completion_ids  # (b, C)
        logp0, entropy0 = selected_logprobs(first, target[:, 0], temperature, with_entropy)  # (b,) each
        # the last completion token is never an input (nothing after it is scored); with C = 1 the pass still runs,
        # on that one token, unscored: under FSDP every rank must run the same forwards
        inputs = target[:, : max(C - 1, 1)]  # (b, C - 1)
        cpos = ppos[idx, -1:] + 1 + torch.arange(inputs.shape[1], device=idx.device)  # (b, C - 1)
        attn = torch.cat([pmask[idx], torch.ones_like(inputs)], dim=1)  # right pads sit after real tokens
        with backend.recompute(model, cache):  # grad_checkpointing: layers run again in the backward
            out = model(input_ids=inputs, attention_mask=attn, position_ids=cpos, use_cache=True, **{kw: cache})
        logp, entropy = selected_logprobs(
            out.logits[:, : C - 1].flatten(0, 1), target[:, 1:].flatten(), temperature, with_entropy
        )  # (b * (C - 1),) each
        logp = torch.cat([logp0[:, None], logp.view(len(target), C - 1)], 1)  # (b, C)
        return logp, torch.cat([entropy0[:, None], entropy.view(len(target), C - 1)], 1) if with_entropy else None


class _SelectedLogprobs(torch.autograd.Function):
    """log softmax(z / T)[target] and the entropy of softmax(z / T) for rows of logits z (n, V) -> (n,), (n,),
    a chunk of rows at a time. The same values and gradients as log_softmax + gather and -sum(p log p)
    (tests/test_models.py) with one (n, V) tensor alive besides the model's logits (the gradient) instead of
    five: the scaled logits, the log-softmax, its exp for the entropy, and the gradients of gather and of
    log_softmax (about 0.5 GiB less peak memory for a micro-batch of 16 x 32 tokens of a 49k vocabulary)."""

    @staticmethod
    def forward(ctx, logits, target, temperature, with_entropy):
        logp = torch.empty(len(target), device=logits.device)  # fp32 whatever the logits' dtype
        lse, entropy = torch.empty_like(logp), torch.zeros_like(logp)
        for s in range(0, len(target), chunk := max(1, 2**22 // logits.shape[-1])):  # 4M values a chunk
            z = logits[s : s + chunk].float() / temperature  # (c, V)
            lse[s : s + chunk] = torch.logsumexp(z, -1)
            logp[s : s + chunk] = z.gather(-1, target[s : s + chunk, None]).squeeze(-1) - lse[s : s + chunk]
            if with_entropy:  # H = -sum_v p_v log p_v
                z -= lse[s : s + chunk, None]  # (c, V) log-softmax, in place
                entropy[s : s + chunk] = -(z.exp() * z).sum(-1)
        ctx.save_for_backward(logits, target, lse, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.set_materialize_grads(False)  # an unused entropy (no entropy bonus) costs nothing in backward
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, target, lse, entropy = ctx.saved_tensors
        grad, T, c = torch.empty_like(logits), ctx.temperature, ctx.chunk
        for s in range(0, len(target), c):
            p = (logits[s : s + c].float() / T).sub_(lse[s : s + c, None])  # (c, V) log-softmax, in place
            if grad_entropy is not None:  # d H / dz = -p (log p + H) / T
                g_h = (grad_entropy[s : s + c, None] / T) * p.exp() * (p + entropy[s : s + c, None])  # (c, V)
            p.exp_()  # (c, V) softmax
            if grad_logp is None:
                grad[s : s + c] = -g_h
                continue
            g = grad_logp[s : s + c, None] / T  # (c, 1); d logp / dz = (onehot(target) - softmax(z / T)) / T
            grad[s : s + c] = p.mul_(-g).scatter_add_(-1, target[s : s + c, None], g)
            if grad_entropy is not None:
                grad[s : s + c] -= g_h
        return grad, None, None, None


def selected_logprobs(logits, target, temperature: float = 1.0, with_entropy: bool = False):
    """Log-prob of each target id under softmax(logits / temperature), and that softmax's entropy (0 unless
    asked; differentiable when asked, for an entropy bonus): logits (n, V), target (n,) -> (n,), (n,)."""
    return _SelectedLogprobs.apply(logits, target, temperature, with_entropy)


def sequence_logprobs(model, batch, temperature: float = 1.0, backend: Backend = AUTO):
    """Summed log-prob of each completion of a `data.Batch` (b,), and its token count (b,)."""
    logp, _ = token_logprobs(model, batch, temperature, backend=backend)  # (b, C)
    return (logp * batch.loss_mask).sum(-1), batch.loss_mask.sum(-1)

"""From prompts and rollouts to padded training tensors.

A group of G samples shares one prompt, so a training batch stores each distinct prompt once:
`token_logprobs` runs the prompt forward once, repeats its KV cache for the group (gradients flow
back through the copy), and runs the completions on top. That halves the update's work for short
completions. Masks come from lengths (positions), never from comparing ids with the pad id: for
many chat models the pad token *is* the EOS token, and EOS must be trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def render_prompt(tok, prompt, system_prompt: str = "") -> list[int]:
    """Token ids of a prompt (a string or chat messages) ready for the assistant's reply."""
    if getattr(tok, "chat_template", None):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if system_prompt and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": system_prompt}] + messages
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]
    if not isinstance(prompt, str):
        raise ValueError("chat-message prompts need a tokenizer with a chat template")
    return tok((system_prompt + "\n\n" if system_prompt else "") + prompt)["input_ids"]


@dataclass
class Batch:
    """A micro-batch with each distinct prompt stored once (a GRPO group shares its prompt).

    Rows are [left pad | prompt] for the k distinct prompts, and [completion | right pad] for the b
    sequences; sequence j continues prompt prompt_index[j]. Masks come from lengths, never from ids.
    """

    prompt_ids: torch.Tensor  # (k, P)
    prompt_mask: torch.Tensor  # (k, P)
    prompt_index: torch.Tensor  # (b,) which prompt each sequence continues
    completion_ids: torch.Tensor  # (b, C)
    loss_mask: torch.Tensor  # (b, C) 1 on completion tokens (EOS included), 0 on padding
    extra: dict  # name -> (b, C) per-token values padded with 0


def collate(prompts: list[list[int]], completions: list[list[int]], pad_id: int, device,
            per_token: dict[str, list[torch.Tensor]] | None = None) -> Batch:
    """Pad a list of (prompt, completion) pairs into a Batch; identical prompts are stored once.
    Padding is trimmed: P and C are the longest prompt and completion in this micro-batch."""
    unique: dict[tuple, int] = {}
    prompt_index = torch.tensor([unique.setdefault(tuple(p), len(unique)) for p in prompts], dtype=torch.long)
    distinct = [list(p) for p in unique]
    P, C, b = max(len(p) for p in distinct), max(max(len(c) for c in completions), 1), len(completions)
    prompt_ids = torch.full((len(distinct), P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(distinct), P), dtype=torch.long)
    for i, p in enumerate(distinct):
        prompt_ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        prompt_mask[i, P - len(p):] = 1
    completion_ids = torch.full((b, C), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((b, C))
    for i, c in enumerate(completions):
        completion_ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        loss_mask[i, :len(c)] = 1
    extra = {}
    for name, rows in (per_token or {}).items():
        out = torch.zeros((b, C))
        for i, row in enumerate(rows):
            out[i, :len(row)] = row
        extra[name] = out.to(device)
    return Batch(prompt_ids.to(device), prompt_mask.to(device), prompt_index.to(device), completion_ids.to(device),
                 loss_mask.to(device), extra)


def encode_reply(tok, prompt, reply: str, system_prompt: str, max_length: int) -> tuple[list[int], list[int], bool]:
    """(prompt ids, reply ids ending in EOS, whether the reply was cut to fit max_length tokens)."""
    p = render_prompt(tok, prompt, system_prompt)
    if len(p) >= max_length:
        raise ValueError(f"config key 'max_length': a prompt of {len(p)} tokens leaves no room for a reply "
                         f"(max_length {max_length}): {str(prompt)[:80]!r}")
    r = tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p, r[:max_length - len(p)], len(p) + len(r) > max_length

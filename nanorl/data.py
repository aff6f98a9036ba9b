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


class Text(str):
    """A prompt read as it is, without the chat template (TRL's standard format: a data file's plain strings)."""

    note = "as given, no chat template (TRL's standard format)"  # config.json's _prompts, the console


def render_prompt(tok, prompt, system_prompt: str = "") -> list[int]:
    """Token ids of a prompt (a string, chat messages, or a Text) ready for the assistant's reply."""
    if getattr(tok, "chat_template", None) and not isinstance(prompt, Text):
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


def left_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids and attention mask with every row right-aligned."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


def right_pad(rows: list, width: int, fill=0, dtype=torch.float) -> torch.Tensor:
    """(B, width) with every row (a list or a 1-D tensor) left-aligned, the rest `fill`."""
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=dtype)
    return out


def chunks(items, size: int) -> list:
    """Consecutive slices of `items` of at most `size` (the last may be shorter): the micro-batches of a batch."""
    return [items[s : s + size] for s in range(0, len(items), size)]


def collate(
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    device,
    per_token: dict[str, list[torch.Tensor]] | None = None,
) -> Batch:
    """Pad a list of (prompt, completion) pairs into a Batch; identical prompts are stored once.
    Padding is trimmed: P and C are the longest prompt and completion in this micro-batch."""
    unique: dict[tuple, int] = {}
    prompt_index = torch.tensor([unique.setdefault(tuple(p), len(unique)) for p in prompts], dtype=torch.long)
    prompt_ids, prompt_mask = left_pad([list(p) for p in unique], pad_id, device)  # (k, P)
    C = max(max(len(c) for c in completions), 1)
    completion_ids = right_pad(completions, C, pad_id, torch.long)  # (b, C)
    loss_mask = right_pad([[1.0] * len(c) for c in completions], C)  # (b, C)
    extra = {name: right_pad(rows, C).to(device) for name, rows in (per_token or {}).items()}
    return Batch(
        prompt_ids, prompt_mask, prompt_index.to(device), completion_ids.to(device), loss_mask.to(device), extra
    )


def encode_reply(tok, prompt, reply: str, system_prompt: str, max_length: int) -> tuple[list[int], list[int], bool]:
    """(prompt ids, reply ids ending in EOS, whether the reply was cut to fit max_length tokens)."""
    p = render_prompt(tok, prompt, system_prompt)
    if len(p) >= max_length:
        raise ValueError(
            f"config key 'max_length': a prompt of {len(p)} tokens leaves no room for a reply "
            f"(max_length {max_length}): {str(prompt)[:80]!r}"
        )
    r = tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p, r[: max_length - len(p)], len(p) + len(r) > max_length

"""Preference and SFT data in TRL's formats, read through `datasets` (tasks/files.py: any file, folder or hub id).

    pairs = load_preferences("prefs.jsonl")                   # or "builtin:arithmetic" (ships with nanorl)
    train, held_out = read_pairs("prefs.parquet", "preference", eval_fraction=0.2)
    rows = encode_rows(tok, pairs, cfg)                       # preference rows as token ids (DPO, reward model)
    rows = encode_sft(tok, pairs, cfg)                        # SFT rows as token ids with per-token weights
    python -m nanorl.tasks.preferences > arithmetic_prefs.jsonl   # regenerate the shipped set

Preferences: {prompt, chosen, rejected} (explicit prompt), standard (strings) or conversational (a prompt of
messages, replies as [{"role": "assistant", ...}]); or {chosen, rejected} alone (implicit prompt): two
conversations that share every turn but the last, or two strings whose common beginning is the prompt.
SFT rows: {prompt, completion} (either form), {messages} (every assistant turn is trained), {text} (plain
language modelling: every token is trained), or a preference row (its chosen reply).
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from nanorl.data import encode_reply
from nanorl.errors import ConfigError

BUILTIN = {"builtin:arithmetic": Path(__file__).with_name("data") / "arithmetic_prefs.jsonl"}


@dataclass
class Pair:
    prompt: str | list[dict] | None  # None: plain text (SFT's `text` rows), no prompt
    chosen: str
    rejected: str
    turns: list[dict] | None = None  # SFT on a whole conversation: every assistant turn is a reply


def _reply(value, where: str, key: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict) and "content" in value[-1]:
        return value[-1]["content"]
    raise ConfigError(f"{where}: field '{key}' must be a string or a list of chat messages")


def _common_prompt(chosen: str, rejected: str) -> str:
    """The shared beginning of two strings (TRL's implicit prompt): up to the first difference, a space just before
    it left to the replies."""
    n = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), min(len(chosen), len(rejected)))
    return chosen[: n - 1] if n and chosen[n - 1] == " " else chosen[:n]


def preference(row: dict, where: str) -> Pair:
    for key in ("chosen", "rejected"):
        if key not in row or row[key] is None:
            raise ConfigError(f"{where}: missing field '{key}'")
    chosen, rejected, prompt = row["chosen"], row["rejected"], row.get("prompt")
    if prompt is None and isinstance(chosen, list):  # implicit prompt, conversational: the turns both share
        if len(chosen) < 2 or chosen[:-1] != rejected[:-1]:
            raise ConfigError(
                f"{where}: without a 'prompt', chosen and rejected must be conversations that share "
                f"every turn but the last"
            )
        prompt = chosen[:-1]
    elif prompt is None:  # implicit prompt, standard: the common beginning of the two strings
        prompt = _common_prompt(str(chosen), str(rejected))
        if not prompt:
            raise ConfigError(f"{where}: missing field 'prompt' (chosen and rejected share no beginning)")
        chosen, rejected = chosen[len(prompt) :], rejected[len(prompt) :]
    return Pair(prompt, _reply(chosen, where, "chosen"), _reply(rejected, where, "rejected"))


def reply(row: dict, where: str) -> Pair:
    if row.get("messages") is not None:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not any(isinstance(m, dict) and m.get("role") == "assistant" for m in msgs):
            raise ConfigError(f"{where}: 'messages' must be a list of chat messages with an assistant turn")
        return Pair(None, "", "", turns=msgs)
    if row.get("text") is not None and row.get("prompt") is None:
        return Pair(None, str(row["text"]), "")
    if row.get("prompt") is not None and (row.get("completion") is not None or row.get("chosen") is not None):
        return Pair(row["prompt"], _reply(row.get("completion", row.get("chosen")), where, "completion"), "")
    raise ConfigError(
        f"{where}: expected fields 'prompt' and 'completion', 'messages', 'text', or 'chosen' (found {sorted(row)})"
    )


def plain_prompts(pairs: list[Pair], template: str, builtin: bool) -> list[Pair]:
    """The Pairs with their prompts read as apply_chat_template `template` says (files.plain_prompt, TRL's rule: a
    data file's strings as they are); 'never' refuses whole conversations (SFT's messages) too."""
    from nanorl.tasks.files import plain_prompt

    for p in pairs:
        if template == "never" and p.turns:
            raise ConfigError("config key 'apply_chat_template': 'never', but the rows hold chat messages")
        p.prompt = p.prompt if p.prompt is None else plain_prompt(p.prompt, template, builtin)
    return pairs


def _parsed(source, kind: str, template: str = "auto") -> tuple[list[Pair], list[Pair] | None]:
    """(training Pairs, held-out Pairs or None) of `kind` 'preference' or 'sft' data; errors name the source,
    the row and the field."""
    from nanorl.tasks.files import load_rows

    what = {"preference": "preference data", "sft": "SFT data"}[kind]
    rows, held = load_rows(BUILTIN.get(str(source), source), what)
    parse, builtin = preference if kind == "preference" else reply, str(source) in BUILTIN
    return (
        plain_prompts([parse(row, f"{source}: row {n}") for n, row in enumerate(rows, 1)], template, builtin),
        None
        if held is None
        else plain_prompts(
            [parse(row, f"{source}: held-out row {n}") for n, row in enumerate(held, 1)], template, builtin
        ),
    )


def read_pairs(source, kind: str, eval_fraction=0.2, seed=0, template="auto") -> tuple[list[Pair], list[Pair]]:
    """(train, held-out) Pairs of `kind` 'preference' or 'sft' data: the source's test/validation split is the
    held-out set when it has one, else a seeded eval_fraction of the rows (see `split`). `template`
    (apply_chat_template): how string prompts are read, see `plain_prompts`."""
    pairs, held = _parsed(source, kind, template)
    if held is not None:
        return pairs, held
    if len(pairs) < 2:
        raise ConfigError(f"{source}: needs at least 2 rows (train and eval), found {len(pairs)}")
    return split(pairs, eval_fraction, seed)


def load_preferences(source) -> list[Pair]:
    """Every preference pair of the training split, checked."""
    return _parsed(source, "preference")[0]


def load_replies(source) -> list[Pair]:
    """SFT rows of the training split as Pairs (the reply in `chosen`; `turns` for whole conversations)."""
    return _parsed(source, "sft")[0]


def encode_conversation(tok, turns: list[dict], max_length: int) -> dict:
    """A conversation's ids split at its first assistant turn -> {prompt, chosen, weight: 1 on every assistant
    turn's tokens (its end-of-turn token included), 0 on the turns between}. Each turn's span is found by
    rendering the conversation up to it, so the chat template decides the tokens."""

    def ids(msgs, gen=False):
        return tok(tok.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False), add_special_tokens=False)[
            "input_ids"
        ]

    full, weight, first = ids(turns), [], None
    for i, m in enumerate(turns):
        if m.get("role") == "assistant":
            start, end = len(ids(turns[:i], gen=True)), len(ids(turns[: i + 1]))
            if ids(turns[: i + 1]) != full[:end]:
                raise ConfigError(
                    "SFT 'messages': this chat template renders a conversation differently from its "
                    "turns (e.g. it drops earlier reasoning), so assistant turns cannot be located"
                )
            first = start if first is None else first
            weight += [0.0] * (start - len(weight)) + [1.0] * (end - start)
    full = full[: len(weight)][:max_length]
    return {
        "prompt": full[:first],
        "chosen": full[first:],
        "weight": weight[first : len(full)],
        "cut": len(weight) > max_length,
    }


def encode_rows(tok, pairs, cfg, fields=("chosen", "rejected")) -> list[dict]:
    """Token ids of each pair's prompt and of its `fields` replies (each ending in EOS), and whether a
    reply was cut to max_length. A prompt that leaves no room raises, naming it, before any training."""
    rows = []
    for p in pairs:
        row, cut = {}, False
        for f in fields:
            row["prompt"], row[f], c = encode_reply(tok, p.prompt, getattr(p, f), cfg.system_prompt, cfg.max_length)
            cut = cut or c
        rows.append({**row, "cut": cut})
    return rows


def encode_sft(tok, pairs, cfg) -> list[dict]:
    """Token ids of each SFT row: a conversation (encode_conversation), plain text (the first token is the
    context, every later one is trained) or a prompt with its reply (encode_rows)."""
    rows = []
    for p in pairs:
        if p.turns is not None:
            rows.append(encode_conversation(tok, p.turns, cfg.max_length))
        elif p.prompt is None:
            ids = tok(p.chosen)["input_ids"] + [tok.eos_token_id]
            rows.append({"prompt": ids[:1], "chosen": ids[1 : cfg.max_length], "cut": len(ids) > cfg.max_length})
        else:
            rows += encode_rows(tok, [p], cfg, fields=("chosen",))
    for r, p in zip(rows, pairs):
        r.setdefault("weight", [1.0] * len(r["chosen"]))
        if not sum(r["weight"]):
            raise ConfigError(
                f"an SFT row has no token to train (an empty text or reply, or max_length "
                f"{cfg.max_length} cuts every assistant turn): {str(p.turns or p.prompt)[:120]!r}"
            )
    return rows


def split(pairs: list[Pair], eval_fraction: float, seed: int = 0) -> tuple[list[Pair], list[Pair]]:
    """Seeded shuffle, then the first eval_fraction (at least 1 pair, at most half) is held out."""
    pairs = list(pairs)
    random.Random(seed).shuffle(pairs)
    n_eval = min(max(1, round(len(pairs) * eval_fraction)), len(pairs) // 2)
    return pairs[n_eval:], pairs[:n_eval]


def arithmetic_preferences(n: int = 400, seed: int = 0) -> list[dict]:
    """The shipped set: two-digit additions from the arithmetic task's *training* split (its held-out
    split is never used), a concise correct answer preferred over a typical failure of small models:
    a carry mistake, an off-by-one, a wrong number in a sentence, or a reply that never answers."""
    from nanorl.tasks.arithmetic import arithmetic

    rng = random.Random(seed)
    rows = []
    for ex in arithmetic(digits=2, operators="+").train[:n]:
        a, b = (int(x) for x in ex.prompt[len("What is ") : -1].split(" + "))
        c = ex.fields["answer"]
        wrong = rng.choice([c + 10, c - 10, c + 1, c - 1, c + 100, a * b])
        rejected = rng.choice(
            [
                f"{a} + {b} = {wrong}.",
                f"To add {a} and {b}, we combine the ones and the tens, which gives {wrong}.",
                f"To add {a} and {b}, we need to combine the numbers in a specific way. We can do this by",
                f"{a} + {b} = {wrong}\n\nThis is a classic example of a mathematical identity.",
            ]
        )
        chosen = rng.choice([f"{a} + {b} = {c}.", f"{a} + {b} = {c}", f"The answer is {c}."])
        rows.append({"prompt": ex.prompt, "chosen": chosen, "rejected": rejected})
    return rows


if __name__ == "__main__":
    sys.stdout.write("".join(json.dumps(r) + "\n" for r in arithmetic_preferences()))

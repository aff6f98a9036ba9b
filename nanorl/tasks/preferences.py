"""Preference data for DPO and reward models: JSONL rows of {prompt, chosen, rejected}.

    pairs = load_preferences("prefs.jsonl")              # or "builtin:arithmetic" (ships with nanorl)
    python -m nanorl.tasks.preferences > arithmetic_prefs.jsonl   # regenerate the shipped set

A prompt is a string or a list of chat messages; chosen / rejected are strings (the assistant's reply)
or message lists whose last message is the reply. In the conversational form without a `prompt`
field, chosen and rejected are whole conversations and the prompt is everything before the last turn.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

BUILTIN = {"builtin:arithmetic": Path(__file__).with_name("data") / "arithmetic_prefs.jsonl"}


@dataclass
class Pair:
    prompt: str | list[dict]
    chosen: str
    rejected: str


def _reply(value, where: str, key: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict) and "content" in value[-1]:
        return value[-1]["content"]
    raise ValueError(f"{where}: field '{key}' must be a string or a list of chat messages")


def load_preferences(path: str | Path) -> list[Pair]:
    """Read and check a preference JSONL; every error names the file, the line and the field."""
    pairs = []
    for where, row in _jsonl(path, "preference"):
        for key in ("chosen", "rejected"):
            if key not in row:
                raise ValueError(f"{where}: missing field '{key}'")
        prompt = row.get("prompt")
        if prompt is None:  # conversational form: the prompt is the conversation before the last turn
            if not isinstance(row["chosen"], list) or len(row["chosen"]) < 2:
                raise ValueError(f"{where}: missing field 'prompt'")
            prompt = row["chosen"][:-1]
        pairs.append(Pair(prompt, _reply(row["chosen"], where, "chosen"), _reply(row["rejected"], where, "rejected")))
    if len(pairs) < 2:
        raise ValueError(f"{path}: needs at least 2 preference pairs (train and eval), found {len(pairs)}")
    return pairs


def _jsonl(path, what: str):
    """("file:line", row) for each non-empty line; a missing file or bad JSON raises naming it."""
    path = BUILTIN.get(str(path), Path(path))
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path} (or use {', '.join(BUILTIN)})")
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                yield f"{path}:{n}", json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None


def load_replies(path: str | Path) -> list[Pair]:
    """SFT rows as Pair(prompt, reply, ""): {prompt, completion}, {messages} (the last message is the
    reply; earlier turns are the prompt) or a preference file (its chosen replies)."""
    rows = []
    for where, row in _jsonl(path, "SFT data"):
        if "messages" in row:
            msgs = row["messages"]
            if not isinstance(msgs, list) or len(msgs) < 2 or msgs[-1].get("role") != "assistant":
                raise ValueError(f"{where}: 'messages' must end with an assistant message after the prompt")
            rows.append(Pair(msgs[:-1], msgs[-1]["content"], ""))
        elif "prompt" in row and ("completion" in row or "chosen" in row):
            rows.append(Pair(row["prompt"], _reply(row.get("completion", row.get("chosen")), where, "completion"), ""))
        else:
            raise ValueError(f"{where}: expected fields 'prompt' and 'completion' (or 'messages', or 'chosen')")
    if len(rows) < 2:
        raise ValueError(f"{path}: needs at least 2 rows (train and eval), found {len(rows)}")
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
        a, b = (int(x) for x in ex.prompt[len("What is "):-1].split(" + "))
        c = ex.fields["answer"]
        wrong = rng.choice([c + 10, c - 10, c + 1, c - 1, c + 100, a * b])
        rejected = rng.choice([
            f"{a} + {b} = {wrong}.",
            f"To add {a} and {b}, we combine the ones and the tens, which gives {wrong}.",
            f"To add {a} and {b}, we need to combine the numbers in a specific way. We can do this by",
            f"{a} + {b} = {wrong}\n\nThis is a classic example of a mathematical identity.",
        ])
        chosen = rng.choice([f"{a} + {b} = {c}.", f"{a} + {b} = {c}", f"The answer is {c}."])
        rows.append({"prompt": ex.prompt, "chosen": chosen, "rejected": rejected})
    return rows


if __name__ == "__main__":
    sys.stdout.write("".join(json.dumps(r) + "\n" for r in arithmetic_preferences()))

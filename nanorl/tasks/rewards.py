"""Generic verifiers: pull an answer out of a completion and compare it with the reference.

A reward is a plain function `reward(prompt, completion, **fields) -> float`, so each one can be
checked in one line:  final_number("What is 2+2?", "2 + 2 = 4.", answer=4) == 1.0

TRL's reward form. TRL calls `reward_func(prompts=..., completions=..., completion_ids=..., trainer_state=...,
**columns)` once per batch, every dataset column (but the prompt) as a list with one entry per completion. For
conversational data a prompt is a list of messages and a completion is `[{"role": "assistant", "content": text}]`.
It returns one float per completion, or None for "this reward does not score this sample" (e.g. a reward meant for
another task's rows). A function is TRL's form when it takes a parameter named `completions` (or `prompts`,
`completion_ids`); `as_reward` wraps it so that nanorl calls it the way TRL does:

    fn = as_reward(reward_len)             # TRL's batched form, detected by its signature
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

from nanorl.errors import RewardSetupError

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_final_number(text: str) -> float | None:
    """The last number in `text` ("1,234" -> 1234.0), or None if there is none."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


def final_number(prompt, completion: str, answer, **_) -> float:
    """1.0 when the last number in the completion equals `answer`, else 0.0."""
    value = extract_final_number(completion)
    return float(value is not None and abs(value - float(answer)) < 1e-9)


def exact(prompt, completion: str, answer, **_) -> float:
    """1.0 when the stripped completion equals the stripped answer."""
    return float(completion.strip() == str(answer).strip())


def contains(prompt, completion: str, answer, **_) -> float:
    """1.0 when the answer appears anywhere in the completion."""
    return float(str(answer).strip() in completion)


_THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.S)
_ANSWER = re.compile(r"<answer>.*?</answer>", re.S)


def think_answer_format(prompt, completion: str, **_) -> float:
    """1.0 when the completion is exactly <think>...</think> then <answer>...</answer> (R1-style)."""
    return float(_THINK_ANSWER.match(completion) is not None)


def answer_tag(prompt, completion: str, **_) -> float:
    """1.0 when the completion contains an <answer>...</answer> span."""
    return float(_ANSWER.search(completion) is not None)


def length_penalty(prompt, completion: str, max_words: int = 100, **_) -> float:
    """0 up to max_words words, then -1/max_words per extra word, down to -1."""
    return -min(1.0, max(0, len(completion.split()) - max_words) / max_words)


REWARDS = {
    "final_number": final_number,
    "exact": exact,
    "contains": contains,
    "think_answer_format": think_answer_format,
    "answer_tag": answer_tag,
    "length_penalty": length_penalty,
}


# ---------------------------------------------------------------------------- TRL's reward form


def is_batched(fn) -> bool:
    """TRL's batched form: the function has a parameter called `completions`, `prompts` or `completion_ids` (e.g.
    TRL's own soft overlong punishment takes `completion_ids` alone)."""
    try:
        return bool({"completions", "prompts", "completion_ids"} & set(inspect.signature(fn).parameters))
    except (TypeError, ValueError):  # a builtin without a signature: nanorl's form
        return False


@dataclass
class TrainerState:
    """The part of transformers' TrainerState a reward may read: the 0-based step being scored and the total."""

    global_step: int = 0
    max_steps: int = 0


class BatchedReward:
    """A TRL reward function as a nanorl reward: `.batch(prompts, completions, fields, ...)` scores a batch."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.signature = inspect.signature(fn)  # read once: every batch is bound against it
        params = self.signature.parameters
        self.takes_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
        self.params = set(params)

    def __call__(self, prompt, completion: str, **fields):
        return self.batch([prompt], [completion], [fields])[0]

    def arguments(self, prompts, completions, fields, completion_ids=None, step=0, steps=0, episodes=None) -> dict:
        """The keywords TRL would pass (those the function accepts, unless it takes **kwargs); with multi-turn
        `episodes`, each completion as TRL passes it (its messages) and its environment."""
        chat = bool(prompts) and not isinstance(prompts[0], str)
        columns = {k: [f.get(k) for f in fields] for k in dict.fromkeys(k for f in fields for k in f)}
        kwargs = {
            **columns,
            "prompts": list(prompts),
            "completion_ids": completion_ids,
            "completions": [[{"role": "assistant", "content": c}] for c in completions] if chat else list(completions),
            "trainer_state": TrainerState(step, max(steps, step, 1)),
            **(episodes or {}),
        }
        return kwargs if self.takes_all else {k: v for k, v in kwargs.items() if k in self.params}

    def batch(self, prompts, completions, fields, completion_ids=None, step=0, steps=0, episodes=None) -> list:
        kwargs = self.arguments(prompts, completions, fields, completion_ids, step, steps, episodes)
        try:
            self.signature.bind(**kwargs)
        except TypeError as e:
            raise RewardSetupError(
                f"reward '{self.__name__}' cannot be called with TRL's arguments {sorted(kwargs)}: {e}"
            ) from None
        out = self.fn(**kwargs)
        out = out.tolist() if hasattr(out, "tolist") else out  # a numpy array or a tensor, as TRL accepts
        if not isinstance(out, (list, tuple)) or len(out) != len(completions):
            raise RewardSetupError(
                f"reward '{self.__name__}' must return a list of {len(completions)} values "
                f"(one per completion), got {type(out).__name__} of length "
                f"{len(out) if hasattr(out, '__len__') else '?'}"
            )
        return list(out)


def as_reward(fn):
    """A reward function in either form -> a nanorl reward (TRL's batched form wrapped in BatchedReward)."""
    return BatchedReward(fn) if is_batched(fn) and not isinstance(fn, BatchedReward) else fn

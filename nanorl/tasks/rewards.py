"""Generic verifiers: pull an answer out of a completion and compare it with the reference.

A reward is a plain function `reward(prompt, completion, **fields) -> float`, so each one can be
checked in one line:  final_number("What is 2+2?", "2 + 2 = 4.", answer=4) == 1.0
"""

from __future__ import annotations

import re

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


REWARDS = {"final_number": final_number, "exact": exact, "contains": contains, "think_answer_format": think_answer_format,
           "answer_tag": answer_tag, "length_penalty": length_penalty}

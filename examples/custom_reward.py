"""A custom GRPO experiment: your prompts, your reward function, any model, in a few dozen lines.

    python examples/custom_reward.py                          # SmolLM2-135M-Instruct on CPU (~15 min)
    python examples/custom_reward.py --model tiny --steps 3   # seconds: random tiny model, smoke test

The task: "Describe <topic> in exactly N words." The reward is 1 for exactly N words and falls off
linearly with the miss. Any `--key value` of `nanorl train --help` overrides the settings below.
"""

import random
import sys

from nanorl import Example, GRPOConfig, Task, train
from nanorl.config import parse_args

TOPICS = [
    "the sea",
    "a cat",
    "rain",
    "coffee",
    "the moon",
    "a city at night",
    "winter",
    "a library",
    "music",
    "a forest",
    "bread",
    "the wind",
    "a train",
    "snow",
    "a garden",
    "the sun",
]


def word_count_reward(prompt: str, completion: str, n: int, **_) -> float:
    """1.0 for exactly n words, minus 1/n per word too many or too few (never below 0)."""
    return max(0.0, 1.0 - abs(len(completion.split()) - n) / n)


def make_examples(count: int, seed: int) -> list[Example]:
    rng = random.Random(seed)
    return [
        Example(f"Describe {rng.choice(TOPICS)} in exactly {n} words.", {"n": n})
        for n in (rng.randint(3, 8) for _ in range(count))
    ]


if __name__ == "__main__":
    task = Task(
        "word-count", train=make_examples(500, seed=0), eval=make_examples(50, seed=1), reward=word_count_reward
    )
    defaults = ["--out-dir", "runs/word_count", "--steps", "40", "--max-new-tokens", "24", "--eval-every", "20"]
    cfg = parse_args(GRPOConfig, defaults + sys.argv[1:], prog="custom_reward.py")
    result = train(cfg, task)
    print(
        "held-out mean reward:", result["before"].get("eval/greedy_reward"), "->", result["after"]["eval/greedy_reward"]
    )

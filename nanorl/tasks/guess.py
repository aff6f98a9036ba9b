"""The guessing game (`--task guess`): a multi-turn environment. The model finds a secret number between 1 and 32 with
the `guess` tool, which answers each guess with "higher" or "lower" and the numbers still possible, or "correct"; it
has 6 guesses (binary search needs at most 6, and 4.2 on average; a random guess among the numbers still possible
solves 71% of the games, in 4.3 guesses when it does). The environment follows TRL's contract (agents/,
notes/trl_tools_contract.md): `reset(**row)` starts an episode on a row's secret, its public method `guess` is the
tool, and `get_reward()` owns a part of the reward. Two parts:

    solved       the task's reward, 1 when the episode found the number (a TRL-form reward reading `environments`;
                 held-out accuracy is the fraction solved)
    GuessNumber  get_reward(): (6 - guesses - wasted) / 6 when solved, else 0: fewer guesses, more reward (a call
                 after the number was found is wasted, and charged like a guess)

    env = GuessNumber(); env.reset(secret=11)
    env.guess(16)     # 'lower: from 1 to 15'
    env.guess(8)      # 'higher: from 9 to 15'
    env.guess(11)     # 'correct: 11 in 3 guesses'

The answers name the range still possible (the model does not have to track it across turns); what is left to learn
is the search: where in the range to guess.
"""

from __future__ import annotations

import random

LOW, HIGH, MAX_GUESSES = 1, 32, 6


class GuessNumber:
    """One episode of the game: the secret, the guesses so far and whether it was found."""

    def reset(self, secret: int, **_) -> None:
        self.secret, self.guesses, self.solved, self.wasted = int(secret), 0, False, 0
        self.low, self.high = LOW, HIGH  # the numbers still possible

    def guess(self, number: int) -> str:
        """Guess the secret number. The answer says whether the secret number is higher or lower than the guess.

        Args:
            number: the guess, a whole number from 1 to 32
        """
        if self.solved:
            self.wasted += 1
            raise ValueError("the number was already found; give your final answer")
        if self.guesses >= MAX_GUESSES:
            raise ValueError(f"no guesses left: you had {MAX_GUESSES}")
        self.guesses += 1
        number = int(number)
        if number == self.secret:
            self.solved = True
            return f"correct: {number} in {self.guesses} guesses"
        if self.secret > number:
            self.low = max(self.low, number + 1)
            return f"higher: from {self.low} to {self.high}"
        self.high = min(self.high, number - 1)
        return f"lower: from {self.low} to {self.high}"

    def get_reward(self) -> float:
        return max(0, MAX_GUESSES - self.guesses - self.wasted) / MAX_GUESSES if self.solved else 0.0


def solved(completions, environments, **_) -> list[float]:
    """1 for each episode whose environment found the number, else 0 (TRL's reward form)."""
    return [float(env.solved) for env in environments]


def guess_task(eval_size: int = 200, seed: int = 0, n_train: int = 20_000):
    """Rows {"secret": n}, n uniform in 1..32 (held out: the first eval_size draws). The held-out games have the same
    32 secrets as training: what is learned is the search, not the numbers."""
    from nanorl.tasks import Example, Task

    rng = random.Random(seed)
    prompt = (
        f"I am thinking of a whole number from {LOW} to {HIGH}. Find it with the guess tool: each guess is answered "
        f"with higher, lower or correct. You have {MAX_GUESSES} guesses. When you have found it, say the number."
    )
    examples = [Example(prompt, {"secret": rng.randint(LOW, HIGH)}) for _ in range(eval_size + n_train)]
    return Task(
        "guess",
        train=examples[eval_size:],
        eval=examples[:eval_size],
        reward=[("solved", solved, 1.0)],
        environment=GuessNumber,
    )

"""Every random stream of a run comes from one helper: derive_seed(seed, step, purpose).

Each purpose has its own multiplier, a prime larger than any step count a run reaches, so within one run
every (step, purpose) pair gets its own seed and a stream never repeats another's: seed * prime + step.
A second round within a step (DAPO's refills, an episode's turns) adds round * 7,777,777, beyond any step count.
"""

from __future__ import annotations

STREAMS = {
    "data": 100_003,  # the order of the training prompts, per pass over them (step = the pass)
    "rollout": 1_000_003,  # the sampler's draws at each step
    "shuffle": 7_919,  # the order of rows in the minibatches of an off-policy update
    "refill": 9_973,  # which prompts DAPO's dynamic sampling draws to refill a step
    "offline": 31,  # the order of rows in each epoch of DPO, SFT and reward-model training
    "prompt": 1_000_000_007,  # one prompt's draws in a rollout (step = the prompt's index in the batch)
    "episode": 1_000_000_009,  # an episode's first reply when its prompt is its own (step = its row in the batch)
    "turn": 999_999_937,  # an episode's later replies (step = its row in the batch, round = the turn)
    "sample": 1_000_000_021,  # one sample of a prompt on an engine that seeds each request (step = its index)
}


def derive_seed(seed: int, step: int, purpose: str, round: int = 0) -> int:
    return seed * STREAMS[purpose] + step + round * 7_777_777

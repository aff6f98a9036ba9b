"""Multi-turn rollouts with and without the kept prefix cache (agents/prefixes.py), in one process, turn about: a
training step's episodes of an environment task (`--task guess` by default: up to 6 guesses, each a turn) sampled by
online.rollout, once with later turns prefilling only what the last turn added and once reading the whole episode
again each turn (the sampler as it was before the cache).

    N_SFT=256 STEPS=0 bash runs/guess_cpu.sh runs/guess    # a model that plays (the untrained one never calls)
    python benchmarks/episodes.py --model runs/guess/sft/model
    python benchmarks/episodes.py --model tiny --reps 1   # smoke run (one turn: the tiny model never calls)

Prints seconds per rollout of each (median, min-max), the ratio, the tokens each prefilled, turns per episode, and
whether both sampled the same episodes (the same seeds; the kept cache differs from a full prefill by float
rounding only, so a rare token may differ).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed import cpu_identity  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="guess")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--reps", type=int, default=3, help="rollouts of each, alternating")
    ap.add_argument("--out", default=None, help="also write the numbers to this JSON file")
    a = ap.parse_args()

    from nanorl import online
    from nanorl.agents.episodes import Agent, make_agent
    from nanorl.config import GRPOConfig
    from nanorl.models import load_model, stop_token_ids
    from nanorl.sampling import LocalSampler
    from nanorl.tasks import task_from_config

    cfg = GRPOConfig(
        model=a.model,
        task=a.task,
        prompts_per_step=a.prompts,
        samples_per_prompt=a.samples,
        max_new_tokens=a.max_new_tokens,
    )
    task = task_from_config(cfg)
    model, tok = load_model(cfg.model, "cpu", torch.float32)
    model.eval()
    sampler = LocalSampler(model, stop_token_ids(model, tok), tok.pad_token_id)
    agent, _ = make_agent(cfg, task)
    read = []

    def count(_module, _args, kwargs):  # tokens read by each prefill (a decode step reads one a row)
        if kwargs.get("input_ids") is not None and kwargs["input_ids"].shape[1] > 1:
            read.append(kwargs["input_ids"].numel())

    model.register_forward_pre_hook(count, with_kwargs=True)
    examples = task.train[: a.prompts]
    times, prefilled, episodes = {"kept": [], "full": []}, {}, {}
    for rep in range(a.reps):
        for mode in ("kept", "full"):
            agent.reuse_prefixes = Agent.reuse_prefixes if mode == "kept" else lambda _: contextlib.nullcontext()
            read.clear()
            timer = {"rollout": 0.0, "reward": 0.0, "tokens": 0}
            t = time.perf_counter()
            roll, _ = online.rollout(sampler, tok, examples, cfg, 0, timer, agent)
            times[mode].append(time.perf_counter() - t)
            prefilled[mode], episodes[mode] = sum(read), roll.completion_ids
            turns = sum(e["turns"] for e in roll.episodes) / len(roll.episodes)
            print(
                f"[episodes] rep {rep} {mode}: {times[mode][-1]:.1f} s, {sum(read)} prefill tokens, {turns:.2f} turns"
            )

    same = sum(x == y for x, y in zip(episodes["kept"], episodes["full"]))
    med = {m: statistics.median(v) for m, v in times.items()}
    res = {
        "cpu": cpu_identity(),
        "torch": torch.__version__,
        "model": a.model,
        "task": a.task,
        "batch": f"{a.prompts} x {a.samples}, {a.max_new_tokens} new tokens a turn at most",
        "turns_mean": turns,
        "seconds": {m: {"median": med[m], "min": min(v), "max": max(v)} for m, v in times.items()},
        "full / kept": med["full"] / med["kept"],
        "prefill_tokens": prefilled,
        "same_episodes": f"{same} of {len(episodes['kept'])}",
    }
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

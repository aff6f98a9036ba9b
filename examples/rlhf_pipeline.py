"""The classic RLHF pipeline, end to end: SFT -> reward model -> PPO against the learned reward.

    python examples/rlhf_pipeline.py                               # SmolLM2-135M-Instruct on CPU
    python examples/rlhf_pipeline.py --model tiny --steps 2 --out /tmp/rlhf   # smoke run (seconds)

Data: the preference pairs that ship with nanorl (`builtin:arithmetic`: two-digit additions, a
concise correct answer preferred over a typical mistake). The policy never sees a rule reward:
1. SFT on the chosen replies of the training pairs (the warm-up many small models need).
2. A Bradley-Terry reward model on the same pairs, starting from the SFT model's backbone.
3. PPO from the SFT model, rewarded only by the reward model (rule_weight 0), critic initialised
   from the reward model, with a KL penalty to the SFT model.
Held-out greedy accuracy on the arithmetic task (checked by the rule, which training never used)
is printed after every stage, so you can see whether optimising the learned reward helped.
"""

import argparse
import json
from pathlib import Path

from nanorl.config import PPOConfig, RMConfig, SFTConfig
from nanorl.ppo import train as ppo_train
from nanorl.reward_model import train as rm_train
from nanorl.sft import train as sft_train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=20, help="PPO steps")
    p.add_argument("--out", default="runs/rlhf")
    a = p.parse_args()
    out = Path(a.out)
    small = a.model == "tiny"  # smoke-run sizes
    # ------------------------------------------------------------------ 1. SFT
    sft = sft_train(SFTConfig(model=a.model, out_dir=str(out / "sft"), epochs=1, eval_size=16 if small else 200))
    # ------------------------------------------------------------------ 2. reward model
    rm = rm_train(RMConfig(model=str(out / "sft" / "model"), out_dir=str(out / "rm"), epochs=1))
    # ------------------------------------------------------------------ 3. PPO on the learned reward
    ppo = ppo_train(
        PPOConfig(
            model=str(out / "sft" / "model"),
            reward_model=str(out / "rm" / "model"),
            critic_model=str(out / "rm" / "model"),
            rule_weight=0.0,
            steps=a.steps,
            eval_every=max(1, a.steps // 2),
            save_every=0,
            out_dir=str(out / "ppo"),
            eval_size=16 if small else 200,
            max_new_tokens=8 if small else 32,
        )
    )
    summary = {
        "sft": {"task_greedy_acc": [sft["before"]["eval/task_greedy_acc"], sft["after"]["eval/task_greedy_acc"]]},
        "rm": {"eval_pref_acc": [rm["before"]["eval/pref_acc"], rm["after"]["eval/pref_acc"]]},
        "ppo": {"greedy_acc": [ppo["before"]["eval/greedy_acc"], ppo["after"]["eval/greedy_acc"]]},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(
        "[nanorl] pipeline: "
        + "; ".join(f"{stage} {k} {v[0]:.1%} -> {v[1]:.1%}" for stage, d in summary.items() for k, v in d.items())
    )


if __name__ == "__main__":
    main()

"""Run every online method for the same budget on the same task and seed, and write a comparison table.

    python benchmarks/compare_algos.py                       # SmolLM2-135M, two-digit addition, 20 steps each
    python benchmarks/compare_algos.py --steps 2 --model tiny --algos grpo,ppo --out /tmp/cmp   # smoke run

Each method starts from the same model, sees the same prompts in the same order (seed 0), samples
the same number of completions per step (8 x 8 = 64; PPO's preset uses 16 x 4 = 64, in two
minibatches of 32 with a critic step after each) and is
evaluated greedily on the same 200 held-out problems before and after. Writes OUT/table.md and
OUT/results.json, and keeps each run's folder under OUT/<algo>/; a run already finished there with
the same config is reused, so an interrupted comparison picks up where it stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from nanorl.config import PRESETS, PPOConfig, preset, to_dict
from nanorl.grpo import train
from nanorl.ppo import train as ppo_train


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--algos", default=",".join([*PRESETS, "ppo"]), help="comma-separated presets, and ppo (`nanorl ppo`)"
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--eval-size", type=int, default=200)
    p.add_argument("--out", default="results/compare_algos")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for algo in a.algos.split(","):
        t0 = time.perf_counter()
        settings = dict(
            model=a.model,
            steps=a.steps,
            eval_every=a.steps,
            eval_size=a.eval_size,
            save_every=0,
            out_dir=str(out / algo),
        )
        cfg = PPOConfig(**settings) if algo == "ppo" else preset(algo, **settings)
        done = out / algo / "results.json"
        if done.is_file() and json.loads((out / algo / "config.json").read_text()) == to_dict(cfg):
            result = json.loads(done.read_text())  # finished earlier with the same config: reuse it
            t0 -= result["wall_s"]
        else:
            result = (ppo_train if algo == "ppo" else train)(cfg)
        metrics = [json.loads(x) for x in open(out / algo / "metrics.jsonl")]
        rows.append(
            {
                "algo": algo,
                "before": result["before"]["eval/greedy_acc"],
                "after": result["after"]["eval/greedy_acc"],
                "reward_first5": statistics.mean(m["reward/mean"] for m in metrics[:5]),
                "reward_last5": statistics.mean(m["reward/mean"] for m in metrics[-5:]),
                "s_per_step": statistics.median(m["time/step"] for m in metrics),
                "minutes": (time.perf_counter() - t0) / 60,
            }
        )
        (out / "results.json").write_text(json.dumps(rows, indent=2))
    lines = [
        f"| `--algo` | held-out greedy acc. before → after {a.steps} steps | train reward, first 5 → last 5 steps "
        "| median s/step | minutes |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['algo']}` | {r['before']:.1%} → {r['after']:.1%} | {r['reward_first5']:.2f} → "
            f"{r['reward_last5']:.2f} | {r['s_per_step']:.1f} | {r['minutes']:.1f} |"
        )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

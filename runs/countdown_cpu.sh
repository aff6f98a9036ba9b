#!/usr/bin/env bash
# GRPO on Countdown (TinyZero's task: reach a target with 3 given numbers) from SmolLM2-135M-Instruct,
# 2-core CPU, fp32. The model starts near 0% (it copies the prompt's "(1 + 2) * 3" example), so a small
# format reward (0.1 for an <answer> tag, as TinyZero gives) gives the first groups a reward to compare.
# Numbers: docs/results.md, GRPO on other tasks (results/countdown_seed0).
set -euo pipefail
nanorl train --task countdown --reward "countdown=1,answer_tag=0.1" --max-new-tokens 64 --steps 40 \
  --eval-every 20 --out-dir runs/countdown_cpu "$@"

#!/usr/bin/env bash
# GRPO on the shipped code task set (30 train / 10 held-out small Python functions, 3-5 tests each, run in
# the sandbox; reward = fraction of tests passed) from SmolLM2-135M-Instruct, 2-core CPU, fp32.
# Numbers: docs/results.md, GRPO on other tasks (results/code_seed0).
set -euo pipefail
nanorl train --task code --max-new-tokens 128 --steps 20 --eval-every 10 --eval-k 4 --out-dir runs/code_cpu "$@"

#!/usr/bin/env bash
# The default experiment with LoRA: GRPO on SmolLM2-135M-Instruct, two-digit addition, 2-core CPU, fp32, only
# rank-16 adapters on every attention and MLP projection trained (alpha 32), at 10x the full fine-tune's
# learning rate (2e-4). Result and the full fine-tune beside it: docs/results.md, LoRA.
set -euo pipefail
nanorl train --out-dir runs/lora_cpu --lora-r 16 --lora-alpha 32 --lr 2e-4 "$@"

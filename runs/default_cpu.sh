#!/usr/bin/env bash
# The default experiment: GRPO on SmolLM2-135M-Instruct, two-digit addition, 2-core CPU, fp32.
# Same as a bare `nanorl train`; every setting is the GRPOConfig default (nanorl train --help).
# Expected (seed 0, 2-core Intel Xeon family 6 model 207, commit a5dbefb): held-out greedy accuracy
# 7.0% -> 78.5% in 40 steps, 6.2 minutes (results/torchrun_a5dbefb/one), bit for bit on the same machine and
# libraries; another CPU model rounds differently and lands a few points away (75.5% in 6.6 minutes on an AMD
# EPYC family 25 model 17 at de9e014: results/default_amd_de9e014). docs/results.md, The default run.
set -euo pipefail
nanorl train --out-dir runs/default_cpu "$@"

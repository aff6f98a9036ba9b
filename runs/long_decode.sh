#!/usr/bin/env bash
# Rollout throughput for long answers (issues 36 and 37): nanorl's sampler against a colocated vLLM engine (and, at 256
# tokens, against the model-forward step and `generate`), every row making exactly N new tokens (--ignore-eos), the
# samplers taking turns in one process (benchmarks/decode.py). Run it where vLLM is installed (tests/vllm.sh's venv):
#
#   PATH=$PWD/.vllm-venv/bin:$PATH bash runs/long_decode.sh results/long_decode
#
# One JSON per length in the folder, and the console lines in log.txt.
set -euo pipefail
out=${1:-runs/long_decode}
mkdir -p "$out"
{
  python benchmarks/decode.py --vllm --new-tokens 256 --prompts 4 --samples 4 --ignore-eos --reps 2 --out "$out/n256.json"
  python benchmarks/decode.py --vllm --new-tokens 512 --prompts 4 --samples 4 --ignore-eos --reps 2 --no-forward \
    --out "$out/n512.json"
  python benchmarks/decode.py --vllm --new-tokens 1024 --prompts 2 --samples 4 --ignore-eos --reps 2 --no-forward \
    --out "$out/n1024.json"
} 2>&1 | grep -v -e "^WARNING" -e "^INFO" | tee "$out/log.txt"

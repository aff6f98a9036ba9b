#!/usr/bin/env bash
# The GPU checks in one go: the CUDA tests, then benchmarks/speed.py on the GPU (nanorl's default there:
# fp32 weights, bf16 autocast; TRL with bf16=True) at the CPU table's batch shape and at a larger one.
#
#   bash benchmarks/gpu.sh                                  # SmolLM2-135M (needs pip and the model cache)
#   bash benchmarks/gpu.sh path/to/config-and-tokenizer OUT # a folder without weights: random weights of that shape
#
# A folder holding only config.json and tokenizer files gets random weights (seed 0) in a temporary folder: the
# speed of a step does not depend on the weights, except that a random model never samples its stop
# token, so every completion runs to the token cap (the same for every part of the benchmark).
# Results: OUT/8x8x32 and OUT/32x8x256 (speed.json and table.md each), OUT/8x8x32_lora (LoRA r 16 against TRL), OUT/tests.txt, OUT/lora (LoRA against full
# fine-tuning, each with and without gradient checkpointing: peak GPU memory and step time, SmolLM2-135M and a
# random Qwen2.5-1.5B-shaped model), OUT/strategies and OUT/strategies_lora (ddp against fsdp under torchrun with
# one process: nccl takes one device per process, so FSDP2 shards over a world of one; step time, tokens/s, peak
# memory, the final weights compared). Data parallel over several GPUs needs more than the one GPU lent.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-smollm2-135m}
out=${2:-results/speed_gpu}
mkdir -p "$out"
if [ -d "$model" ] && ! ls "$model"/*.safetensors >/dev/null 2>&1; then
  random_model=$(mktemp -d)/model
  python3 - "$model" "$random_model" <<'EOF'
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
src, dst = sys.argv[1:]
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32).save_pretrained(dst)
AutoTokenizer.from_pretrained(src).save_pretrained(dst)
print(f"[gpu] random weights of {src}'s shape in {dst}")
EOF
  model=$random_model
fi
python3 -c "import torch, transformers; print('[gpu]', torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
python3 -m pytest -q -m gpu tests 2>&1 | tee "$out/tests.txt" | tail -3 || true  # the benchmark runs either way
# One micro-batch for the whole batch on the GPU (TRL's per-device batch is the whole batch too).
python3 benchmarks/speed.py --device cuda --model "$model" --micro-batch-size 64 --out "$out/8x8x32"
python3 benchmarks/speed.py --device cuda --model "$model" --micro-batch-size 256 --out "$out/32x8x256" \
  --parts roofline,generate,nanorl,trl \
  --prompts 32 --samples 8 --new-tokens 256
python3 benchmarks/speed.py --device cuda --model "$model" --micro-batch-size 64 --lora-r 16 --parts nanorl,trl \
  --out "$out/8x8x32_lora"  # LoRA in both, TRL with the same peft config
python3 benchmarks/lora_memory.py --device cuda --reps 2 --modes lora,lora+ckpt,full,full+ckpt --micro 64 \
  --out "$out/lora"  # with and without gradient checkpointing
python3 benchmarks/strategies.py --device cuda --model "$model" --out "$out/strategies"  # FSDP2 on nccl
python3 benchmarks/strategies.py --device cuda --model "$model" --extra "--lora-r 16" --out "$out/strategies_lora"

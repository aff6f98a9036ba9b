#!/usr/bin/env bash
# The GPU checks, in stages: the CUDA tests, benchmarks/speed.py against TRL (nanorl's GPU default: fp32 weights,
# bf16 autocast; TRL with bf16=True), LoRA against TRL and against full fine-tuning, and ddp against fsdp.
#
#   bash benchmarks/gpu.sh [MODEL] [OUT] [STAGES]        # defaults: smollm2-135m, results/speed_gpu, all stages
#   GPU_SH_DEVICE=cpu bash benchmarks/gpu.sh .gpu/tiny-shape /tmp/gpu_dry    # this script's plumbing, on a CPU
#
# Stages (comma-separated; minutes on the H200 of session 7 where measured, else estimated):
#   tests       pytest -m gpu                                                        OUT/tests.log           (< 1)
#   speed       speed.py at the CPU table's shape (8 prompts x 8 samples x 32 tokens) OUT/8x8x32             (~2.5)
#   speed_big   speed.py at 32 x 8 x 256                                             OUT/32x8x256            (~4)
#   lora_speed  speed.py, LoRA r 16 in both nanorl and TRL (the same peft config)   OUT/8x8x32_lora         (~1.5)
#   lora        lora_memory.py: LoRA and full fine-tuning, each with and without gradient checkpointing, on MODEL
#               and on a random Qwen2.5-1.5B-shaped model: peak GPU memory, step time  OUT/lora              (~3)
#   strategies  strategies.py: ddp against fsdp under torchrun with one process (nccl takes one device per
#               process, so FSDP2 shards over a world of one), full and LoRA: step time, tokens/s, peak memory,
#               the final weights compared                                  OUT/strategies, OUT/strategies_lora (~2)
# Each stage runs under `timeout` (GPU_SH_STAGE_TIMEOUT seconds, default 300), cut to what is left of
# GPU_SH_DEADLINE (seconds for the whole script, default none; a stage that would get under 20 s is skipped); a
# failed stage is reported and the next one runs; the last lines list every stage's status and seconds (also in
# OUT/stages.txt). Use the deadline, not an outer `timeout`: that would kill this script but not the stage under way.
#
# A MODEL folder holding only config.json and tokenizer files gets random weights (seed 0) in a temporary folder:
# the speed of a step does not depend on the weights, except that a random model never samples its stop token, so
# every completion runs to the token cap (the same for every part of the benchmark).
#
# On a GPU lent through the `device` tool (no network there; 15 minutes of device time, 10 per call): here, once,
# `bash benchmarks/gpu_prepare.sh` (model shapes in .gpu/, wheels of TRL and datasets in .whl/), then one run with
# carry [".gpu", ".whl"] and timeout_s 560, the stages that matter first (the whole list takes about 15 minutes);
# the deadline leaves time to pack what was written (only 8 files come back from $OUT):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site;
#   GPU_SH_STAGE_TIMEOUT=200 GPU_SH_DEADLINE=480 bash benchmarks/gpu.sh .gpu/smollm2-135m-shape /tmp/r
#   tests,lora_speed,lora,strategies; tar czf $OUT/r.tgz -C /tmp r
set -uo pipefail
cd "$(dirname "$0")/.."
model=${1:-smollm2-135m}
out=${2:-results/speed_gpu}
stages=${3:-tests,speed,speed_big,lora_speed,lora,strategies}
device=${GPU_SH_DEVICE:-cuda}
limit=${GPU_SH_STAGE_TIMEOUT:-300}
deadline=$((SECONDS + ${GPU_SH_DEADLINE:-1000000}))
[ -n "${stages//,/}" ] || { echo "gpu.sh: no stage named" >&2; exit 2; }
for s in ${stages//,/ }; do
  case $s in
    tests|speed|speed_big|lora_speed|lora|strategies) ;;
    *) echo "gpu.sh: unknown stage '$s'" >&2; exit 2;;
  esac
done
mkdir -p "$out"
if [ -d "$model" ] && ! ls "$model"/*.safetensors >/dev/null 2>&1; then
  random_model=$(mktemp -d)/model
  trap 'rm -rf "$(dirname "$random_model")"' EXIT
  python3 - "$model" "$random_model" <<'PY' || exit 1
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
src, dst = sys.argv[1:]
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32).save_pretrained(dst)
AutoTokenizer.from_pretrained(src).save_pretrained(dst)
print(f"[gpu] random weights of {src}'s shape in {dst}")
PY
  model=$random_model
fi
python3 - <<'PY'
import importlib, torch
def version(name):
    try:
        return importlib.import_module(name).__version__
    except Exception as e:  # a missing peer fails its own stages, not this line
        return f"not importable ({type(e).__name__}: {e})"
print("[gpu]", torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device", "|",
      ", ".join(f"{n} {version(n)}" for n in ("torch", "transformers", "peft", "datasets", "pyarrow", "trl")))
PY
# The 1.5B shape on a GPU only: on a CPU (the plumbing check) it takes minutes a mode.
models=$model$([ "$device" = cuda ] && echo ,qwen2.5-1.5b-shaped)
speed=(python3 benchmarks/speed.py --device "$device" --model "$model")
summary=()
stage() {  # stage NAME COMMAND...: run under the time limit, log to OUT/NAME.log, record the status
  local name=$1; shift
  local t0=$SECONDS cap=$((deadline - SECONDS))
  cap=$((cap < limit ? cap : limit))
  if [ "$cap" -lt 20 ]; then summary+=("$name: skipped, the deadline is near"); return; fi
  echo "[gpu] stage $name (at most $cap s): $*"
  timeout -k 30 "$cap" "$@" 2>&1 | tee "$out/$name.log" | tail -n 25
  local rc=${PIPESTATUS[0]}
  local what=ok
  [ "$rc" = 124 ] && what="timed out after $cap s"
  [ "$rc" != 0 ] && [ "$rc" != 124 ] && what="failed ($rc)"
  summary+=("$name: $what, $((SECONDS - t0)) s")
}
for s in ${stages//,/ }; do
  case $s in
    tests) stage tests python3 -m pytest -q -m gpu tests ;;
    # One micro-batch for the whole batch on the GPU (TRL's per-device batch is the whole batch too).
    speed) stage speed "${speed[@]}" --micro-batch-size 64 --out "$out/8x8x32" ;;
    speed_big) stage speed_big "${speed[@]}" --micro-batch-size 256 --out "$out/32x8x256" \
                 --parts roofline,generate,nanorl,trl --prompts 32 --samples 8 --new-tokens 256 ;;
    lora_speed) stage lora_speed "${speed[@]}" --micro-batch-size 64 --lora-r 16 --parts nanorl,trl \
                  --out "$out/8x8x32_lora" ;;
    lora) stage lora python3 benchmarks/lora_memory.py --device "$device" --reps 2 --micro 64 \
            --modes lora,lora+ckpt,full,full+ckpt --models "$models" --tokenizer "$model" --out "$out/lora" ;;
    strategies) stage strategies python3 benchmarks/strategies.py --device "$device" --model "$model" \
                  --out "$out/strategies"
                stage strategies_lora python3 benchmarks/strategies.py --device "$device" --model "$model" \
                  --extra "--lora-r 16" --out "$out/strategies_lora" ;;
  esac
done
printf '%s\n' "${summary[@]}" | tee "$out/stages.txt"
! grep -qv ": ok," "$out/stages.txt"

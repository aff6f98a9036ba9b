#!/usr/bin/env bash
# The calculator task with its tool on the default model (issue 35, not yet the RL demo): an SFT warm-up on
# tool-using transcripts, then the held-out accuracy of whole episodes (one GRPO step's evaluation at step 0).
# 2-core AMD EPYC (family 25 model 17), commit c46f607 (session 21), 50 held-out problems:
#   SmolLM2-135M-Instruct, one answer, no tool (nanorl eval):               2% (1 of 50)
#   the same model with the tool (episodes, greedy; 4 held-out in a probe):  0%: it never writes a call
#   after SFT on 256 transcripts (13 steps, 5.0 min), with the tool:        98% (49 of 50), every episode calls it
#   after SFT on 80 transcripts (4 steps), with the tool:                    0%: it answers "a * b = c" itself
# Files: results/calculator_probe_c46f607. Left: a GRPO run that raises the rate of tool calls from a weak start.
set -euo pipefail
out=${1:-runs/calculator}
mkdir -p "$out"
python - "$out/sft.jsonl" <<'PY'
import json, sys
from nanorl.agents.tools import fallback_system_prompt
from nanorl.tasks.calculator import calculate, calculator_task

task, system = calculator_task(eval_size=200, seed=0), fallback_system_prompt([calculate])
with open(sys.argv[1], "w") as f:
    for ex in task.train[:256]:  # training problems only; the held-out 200 are never seen
        a, b = ex.prompt.split("What is ")[1].split("?")[0].split(" * ")
        call = json.dumps({"name": "calculate", "arguments": {"expression": f"{a} * {b}"}})
        f.write(json.dumps({"messages": [
            {"role": "system", "content": system}, {"role": "user", "content": ex.prompt},
            {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
            {"role": "tool", "content": calculate(f"{a} * {b}")},
            {"role": "assistant", "content": f"{a} * {b} = {ex.fields['answer']}"}]}) + "\n")
PY
nanorl eval --model smollm2-135m --task calculator --eval-size 50 --max-new-tokens 64
nanorl sft --data "$out/sft.jsonl" --task '' --max-length 320 --epochs 1 --batch-size 16 --eval-every 100 \
  --out-dir "$out/sft"
nanorl train --model "$out/sft/model" --task calculator --steps 1 --eval-size 50 --max-new-tokens 64 \
  --prompts-per-step 4 --samples-per-prompt 4 --out-dir "$out/probe"

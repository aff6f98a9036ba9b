#!/usr/bin/env bash
# The calculator task with its tool on the default model (issue 35): an SFT warm-up on tool-using transcripts of
# training problems, then GRPO on whole episodes. 2-core AMD EPYC (family 25 model 17), commit c46f607
# (session 21), 50 held-out problems, greedy:
#   SmolLM2-135M-Instruct, one answer, no tool (nanorl eval):               2% (1 of 50)
#   the same model with the tool (4 held-out in a probe; 16 rollouts):      0%: it never writes a call
#   after SFT on 80 transcripts (4 steps): no call in 16 rollouts; it answers "a * b = c" itself
#   after SFT on 256 transcripts (13 steps, 5.0 min):                       98%, every episode calls the tool
#   after SFT on 140 transcripts (7 steps, 2.7 min): held-out 94%, but sampled rollouts (temperature 1) call the
#     tool in 41% of episodes and earn 0.22; then GRPO, 15 steps (16.9 min): sampled reward 0.22 -> 0.95,
#     tool calls per episode 0.41 -> 0.97, failed calls 15% -> 2%, held-out 94% -> 100% (this script, `$out/grpo`)
# Files: results/calculator_c46f607 (probe_after_sft256/, grpo_after_sft140/).
set -euo pipefail
out=${1:-runs/calculator}
mkdir -p "$out"
python - "$out/sft.jsonl" <<'PY'
import json, sys
from nanorl.agents.tools import fallback_system_prompt
from nanorl.tasks.calculator import calculate, calculator_task

task, system = calculator_task(eval_size=200, seed=0), fallback_system_prompt([calculate])
with open(sys.argv[1], "w") as f:
    for ex in task.train[:256]:  # training problems only; the held-out ones are never seen
        a, b = ex.prompt.split("What is ")[1].split("?")[0].split(" * ")
        call = json.dumps({"name": "calculate", "arguments": {"expression": f"{a} * {b}"}})
        f.write(json.dumps({"messages": [
            {"role": "system", "content": system}, {"role": "user", "content": ex.prompt},
            {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"},
            {"role": "tool", "content": calculate(f"{a} * {b}")},
            {"role": "assistant", "content": f"{a} * {b} = {ex.fields['answer']}"}]}) + "\n")
PY
nanorl eval --model smollm2-135m --task calculator --eval-size 50 --max-new-tokens 64
head -140 "$out/sft.jsonl" > "$out/sft140.jsonl"
nanorl sft --data "$out/sft140.jsonl" --task '' --max-length 320 --epochs 1 --batch-size 16 --eval-every 100 \
  --out-dir "$out/sft140"
nanorl train --model "$out/sft140/model" --task calculator --steps 15 --eval-every 5 --eval-size 50 \
  --max-new-tokens 64 --out-dir "$out/grpo"

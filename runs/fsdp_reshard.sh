#!/usr/bin/env bash
# An FSDP checkpoint written by 2 processes resumes in 4 (docs/scaling.md, FSDP2): each process reads its own
# shards of the AdamW state through torch.distributed.checkpoint, whatever the number that wrote them.
#   bash runs/fsdp_reshard.sh OUT
# 1. OUT/straight: 4 steps in 2 processes. 2. OUT/resharded: 2 steps in 2 processes (a checkpoint after step 1),
# then --resume true to step 4 in 4 processes. 3. Each step's gradient norm and the final weights, side by side.
set -euo pipefail
out=${1:?usage: runs/fsdp_reshard.sh OUT}
mkdir -p "$out"
cat > "$out/r.py" <<'PY'
def digits(completions, **kw):  # a reward the tiny random model's samples differ on
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
PY
export OMP_NUM_THREADS=1
args=(-m nanorl.cli train --model tiny --lr 3e-3 --reward "$out/r.py:digits" --eval-size 12 --report-to none
      --strategy fsdp --lr-schedule constant --eval-every 1000)
torchrun --nproc_per_node 2 "${args[@]}" --steps 4 --out-dir "$out/straight" > "$out/straight.log" 2>&1
torchrun --nproc_per_node 2 "${args[@]}" --steps 2 --save-every 1 --out-dir "$out/resharded" > "$out/first.log" 2>&1
torchrun --nproc_per_node 4 "${args[@]}" --steps 4 --save-every 1 --resume true --out-dir "$out/resharded" \
  > "$out/resumed.log" 2>&1
python - "$out" <<'PY' | tee "$out/compare.txt"
import json, sys
from safetensors.torch import load_file
out = sys.argv[1]
runs = {r: [json.loads(x) for x in open(f"{out}/{r}/metrics.jsonl")] for r in ("straight", "resharded")}
for a, b in zip(*runs.values()):
    print(f"step {a['step']}: grad norm {a['optim/grad_norm']:.8f} (2 processes) "
          f"{b['optim/grad_norm']:.8f} (resumed in 4)")
a, b = (load_file(f"{out}/{r}/model/model.safetensors") for r in ("straight", "resharded"))
print("final weights: max |difference|", max((a[k] - b[k]).abs().max().item() for k in a))
PY

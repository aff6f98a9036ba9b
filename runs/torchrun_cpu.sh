#!/usr/bin/env bash
# The default run in two processes under torchrun next to the same run in one process
# (docs/results.md, "The default run under torchrun").
#   bash runs/torchrun_cpu.sh OUT [ONE]
# 1. OUT/two: `torchrun --nproc_per_node 2 -m nanorl.cli train`, each process one thread (torchrun's default
#    OMP_NUM_THREADS=1), gloo: each samples, scores and trains half of every step's prompts.
# 2. OUT/one: `nanorl train`, one process of two threads (or ONE: the folder of such a run made earlier).
# 3. compare.py: every metric of every step (time/* and perf/* aside), then the eval files and the final weights.
set -uo pipefail
out=${1:?usage: runs/torchrun_cpu.sh OUT [ONE]}; one=${2:-$out/one}
mkdir -p "$out"
/usr/bin/time -v torchrun --nproc_per_node 2 -m nanorl.cli train --out-dir "$out/two" > "$out/two.log" 2>&1
[ -n "${2:-}" ] || /usr/bin/time -v nanorl train --out-dir "$one" > "$out/one.log" 2>&1
python results/refactor_equivalence/compare.py "$one" "$out/two" | tee "$out/compare.txt"
for f in eval.jsonl samples.jsonl eval_samples.jsonl; do
  cmp -s "$one/$f" "$out/two/$f" && echo "$f: identical" || echo "$f: differs"
done | tee -a "$out/compare.txt"
python - "$one" "$out/two" <<'PY' | tee -a "$out/compare.txt"
import sys, torch
from safetensors.torch import load_file
a, b = (load_file(f"{d}/model/model.safetensors") for d in sys.argv[1:])
print("final weights: max |difference|", max((a[k] - b[k]).abs().max().item() for k in a))
PY

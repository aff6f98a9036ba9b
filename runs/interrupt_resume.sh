#!/usr/bin/env bash
# The default run, interrupted and resumed, next to the same run left alone (docs/results.md, "Stopped and resumed").
#   bash runs/interrupt_resume.sh OUT [STOP_AFTER_STEP] [ALONE]
# 1. OUT/alone: `nanorl train` from start to end (or ALONE: the folder of such a run made earlier).
# 2. OUT/interrupted: the same run; after STOP_AFTER_STEP (default 13) steps are logged it gets SIGTERM, writes a
#    checkpoint at the end of the step it is in, and exits (code 143); then `--resume true` finishes it.
# 3. compare.py: every metric of every step, time/* and perf/* aside, and the eval / samples files.
set -uo pipefail
out=${1:?usage: runs/interrupt_resume.sh OUT [STOP_AFTER_STEP] [ALONE]}; stop=${2:-13}; alone=${3:-$out/alone}
mkdir -p "$out"
[ -n "${3:-}" ] || nanorl train --out-dir "$alone" > "$out/alone.log" 2>&1
nanorl train --out-dir "$out/interrupted" > "$out/interrupted.log" 2>&1 &
pid=$!
until [ "$(cat "$out/interrupted/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$stop" ]; do sleep 1; done
kill -TERM "$pid"; wait "$pid"; echo "exit code after SIGTERM: $?" | tee -a "$out/interrupted.log"
nanorl train --out-dir "$out/interrupted" --resume true > "$out/resumed.log" 2>&1
python results/refactor_equivalence/compare.py "$alone" "$out/interrupted" | tee "$out/compare.txt"
for f in eval.jsonl samples.jsonl eval_samples.jsonl; do
  cmp -s "$alone/$f" "$out/interrupted/$f" && echo "$f: identical" || echo "$f: differs"
done | tee -a "$out/compare.txt"

#!/usr/bin/env bash
# The default run three ways (issue 36): nanorl's own sampler, a colocated vLLM engine (--use_vllm true) and a vLLM
# server in a second process on this machine (nanorl vllm-serve + --vllm_mode server); same seed each, one after the
# other, then a table: held-out greedy accuracy before / after, the step's time split, wall time, peak memory.
# Run it where vLLM is installed (tests/vllm.sh makes such a venv, .vllm-venv):
#
#   PATH=$PWD/.vllm-venv/bin:$PATH SEEDS="0 1 2" bash runs/vllm_cpu.sh runs/vllm
#
# MODES="colocate server" skips the local runs; the KV cache is 2 GiB per engine (VLLM_CPU_KVCACHE_SPACE).
# Results (docs/scaling.md): seed 0 on an AMD EPYC, three modes (results/vllm_default_s0): 75.5% / 76.0% / 76.0%,
# colocated and server identical step for step; seeds 0-2 on an Intel Xeon, local and colocated
# (results/vllm_default_intel_206e3e8): 78.5 / 66.0 / 74.0% and 76.0 / 75.5 / 71.5%.
set -euo pipefail
out=${1:-runs/vllm}
port=${PORT:-8011}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
mkdir -p "$out"
for seed in ${SEEDS:-0}; do
  for mode in ${MODES:-local colocate server}; do
    run="$out/${mode}_s$seed"
    args=(--seed "$seed" --out-dir "$run")
    if [ "$mode" = colocate ]; then args+=(--use_vllm true); fi
    if [ "$mode" = server ]; then  # the server's peak memory goes to $run.server_time
      /usr/bin/time -v -o "$run.server_time" nanorl vllm-serve --port "$port" > "$run.server_log" 2>&1 &
      timer=$!
      args+=(--use_vllm true --vllm_mode server --vllm_server_port "$port")  # the trainer waits for the server
    fi
    /usr/bin/time -v -o "$run.time" nanorl train "${args[@]}" > "$run.log" 2>&1
    if [ "$mode" = server ]; then
      kill "$(pgrep -P "$timer")" || true
      wait "$timer" || true
    fi
  done
done
python - "$out" <<'PY'
import json, pathlib, re, statistics, sys

out = pathlib.Path(sys.argv[1])
print("| run | held-out greedy | rollout s | sync s | update s | step s | wall min | peak RSS GiB (server API process) |")
print("|---|---|---|---|---|---|---|---|")
for run in sorted(p for p in out.iterdir() if p.is_dir()):
    evals = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    mean = lambda k: statistics.mean(r.get(k, 0.0) for r in rows)
    def usage(path):
        text = path.read_text() if path.exists() else ""
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
        wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
        secs = sum(float(x) * 60**i for i, x in enumerate(reversed(wall.group(1).split(":")))) if wall else 0
        return (int(rss.group(1)) / 2**20 if rss else 0.0), secs
    rss, wall = usage(run.with_name(run.name + ".time"))
    server = usage(run.with_name(run.name + ".server_time"))[0]
    acc = f"{evals[0]['eval/greedy_acc']:.1%} -> {evals[-1]['eval/greedy_acc']:.1%}"
    split = " | ".join(f"{mean(k):.2f}" for k in ("time/rollout", "time/sync", "time/update", "time/step"))
    print(f"| {run.name} | {acc} | {split} | {wall / 60:.1f} | {rss:.2f}" + (f" ({server:.2f})" if server else "") + " |")
PY

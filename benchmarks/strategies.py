"""ddp against fsdp on one device: the same `nanorl train` run unsharded and under FSDP2 over torchrun's processes
(one per device), with step time, token rates, peak memory per process and the final weights compared.

    python benchmarks/strategies.py --device cuda                       # the GPU check (benchmarks/gpu.sh): 1 process
    python benchmarks/strategies.py --device cpu --model tiny --nproc 2 --out /tmp/strategies   # here, on gloo

Only one GPU is ever lent, and nccl takes one device per process, so on a GPU both strategies run in one process
under torchrun: fsdp then shards over a world of one. What that checks is the nccl path itself (the process
group, FSDP2's gathers and reduce-scatters on CUDA, the sharded checkpoint written with
torch.distributed.checkpoint) and what FSDP costs in time there; the memory saving needs N > 1 devices
(benchmarks/fsdp_memory.py measures it on CPU processes). The reward is the share of distinct characters, so
every step trains whatever the model. Each worker reports its peak: CUDA's
max_memory_allocated on a GPU, the process's peak resident set on a CPU. On a GPU the dtype is bf16-mixed: ddp
keeps fp32 weights under autocast while fsdp gathers them in bf16 (MixedPrecisionPolicy), so there the final
weights differ by bf16 rounding (about 1e-2 after a few steps), not by float rounding as on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_memory import REWARD  # noqa: E402  (benchmarks/ is not a package): a reward every step trains on
from speed import cpu_identity  # noqa: E402

WORKER = """import importlib, json, os, resource, sys, torch
from nanorl.cli import TRAINERS
from nanorl.config import parse_args
module, cls = TRAINERS[sys.argv[1]]  # the command as nanorl.cli runs it, without the CLI's exit under torchrun
importlib.import_module(module).train(parse_args(cls, sys.argv[2:]))
cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with open(os.environ["PEAK_FILE"] + "." + os.environ.get("RANK", "0"), "w") as f:
    json.dump({"peak_gib": peak / 2**30, "what": "cuda max_memory_allocated" if cuda else "peak RSS"}, f)
sys.stdout.flush(); sys.stderr.flush(); os._exit(0)  # as nanorl.cli does under torchrun (notes/LOG.md, session 18)
"""


def run(strategy: str, a, out: Path) -> dict:
    name = f"{strategy}_{a.nproc}proc"
    args = [
        "train",
        "--model",
        a.model,
        "--device",
        a.device,
        "--strategy",
        strategy,
        "--backend",
        "torch",
        "--steps",
        str(a.steps),
        "--eval-size",
        "16",
        "--eval-every",
        "1000",
        "--save-every",
        "2",
        "--report-to",
        "none",
        "--lr-schedule",
        "constant",
        "--reward",
        f"{out / 'reward.py'}:distinct",
        "--out-dir",
        str(out / name),
        *a.extra.split(),
    ]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(a.nproc),
        "--no-python",
        sys.executable,
        "-c",
        WORKER,
        *args,
    ]
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PEAK_FILE": str(out / name)})
    wall = time.perf_counter() - t
    (out / f"{name}.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise SystemExit(f"{name} failed:\n{res.stderr[-3000:]}")
    steps = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    peaks = [json.loads(Path(f"{out / name}.{r}").read_text()) for r in range(a.nproc)]
    return {
        "run": name,
        "strategy": strategy,
        "wall_s": wall,
        "step_s": statistics.median(s["time/step"] for s in steps[1:] or steps),  # the first step warms up
        "update_tokens_per_s": statistics.median(s["perf/update_tokens_per_s"] for s in steps[1:] or steps),
        "rollout_tokens_per_s": statistics.median(s["perf/rollout_tokens_per_s"] for s in steps[1:] or steps),
        "peak_gib": [p["peak_gib"] for p in peaks],
        "peak": peaks[0]["what"],
        "checkpoint": sorted(p.name for p in (out / name / "checkpoint").iterdir()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--nproc", type=int, default=1, help="processes per strategy (one per GPU)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--extra", default="", help="more `nanorl train` flags for both runs, e.g. '--lora-r 16'")
    p.add_argument("--out", default="results/strategies")
    a = p.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "reward.py").write_text(REWARD)
    rows = [run(s, a, out) for s in ("ddp", "fsdp")]
    one, two = (load_file(out / r["run"] / "model" / "model.safetensors") for r in rows)
    diff = max((one[k] - two[k]).abs().max().item() for k in one)
    device = torch.cuda.get_device_name() if a.device.startswith("cuda") else cpu_identity()
    lines = [
        f"{a.model}, {a.nproc} process(es) on {device}, torch {torch.__version__}, {a.steps} steps {a.extra}",
        "",
        f"| strategy | step (median) | update tokens/s | rollout tokens/s | peak per process ({rows[0]['peak']}) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['strategy']} | {r['step_s']:.2f} s | {r['update_tokens_per_s']:.0f} | "
            f"{r['rollout_tokens_per_s']:.0f} | {' / '.join(f'{x:.2f}' for x in r['peak_gib'])} GiB |"
        )
    lines += [
        "",
        f"final weights, ddp against fsdp: max |difference| {diff:.2e}",
        f"fsdp checkpoint: {', '.join(rows[1]['checkpoint'])}",
    ]
    (out / "results.json").write_text(json.dumps({"runs": rows, "max_abs_diff": diff, "device": device}, indent=2))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

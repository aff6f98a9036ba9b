"""Peak memory of each process of `nanorl train` under torchrun, strategy ddp (every process holds the whole
model, its gradients and AdamW state) against fsdp (FSDP2: each holds 1/N of them), on a model of Qwen2.5-0.5B's
architecture and size with random weights (built from its config: no download).

    python benchmarks/fsdp_memory.py                          # 2 processes; writes results/fsdp_memory/
    python benchmarks/fsdp_memory.py --nproc 2 --steps 2 --out results/fsdp_memory
    python benchmarks/fsdp_memory.py --runs ddp+lora,fsdp+lora,ddp+ckpt,fsdp+ckpt   # LoRA, gradient checkpointing
    python benchmarks/fsdp_memory.py --runs ddp+sft,fsdp+sft                       # nanorl sft

Each run is `torchrun --nproc_per_node N -m nanorl.cli train` on the plain PyTorch path (fsdp takes it; ddp is
given it so the two differ only in the strategy), a small batch (the states, not activations, are what FSDP
shards; the reward is the share of distinct characters, so a random model's samples differ), with and without
a resumable checkpoint after step 1 (`+save`; under fsdp it gathers the full weights onto the first process; each
process writes its own shards of the AdamW state), with LoRA adapters of rank 16 on every linear projection
(`+lora`), with gradient checkpointing (`+ckpt`), and as `nanorl sft` (`+sft`: an offline trainer, which gathers
no full weights for a rollout; with no task it does not evaluate by sampling either). Every worker runs under
`/usr/bin/time -v`: its "Maximum
resident set size" is that process's peak. The final weights of runs that differ only in the strategy are
compared as a check.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from lora_memory import QWEN_0_5B, qwen_shaped_folder  # noqa: E402  (benchmarks/ is not a package)

REWARD = """def distinct(completions, **kw):  # differs between a random model's samples: something to learn from
    return [len(set(c)) / max(len(c), 1) for c in completions]
"""


def run(folder: str, name: str, a, out: Path) -> dict:
    """One run: `name` is the strategy with any of +save, +lora, +ckpt, +adapter (LoRA's final model unmerged),
    +sft (`nanorl sft` on 5 x steps rows instead of `nanorl train`)."""
    strategy, *more = name.split("+")
    rss = out / f"{name}.rss"
    worker = f'exec /usr/bin/time -v -o "{rss}.$RANK" {sys.executable} -m nanorl.cli "$@"'
    common = [
        "--model",
        folder,
        "--strategy",
        strategy,
        "--backend",
        "torch",
        "--report-to",
        "none",
        "--save-every",
        "1" if "save" in more else "0",
        "--out-dir",
        str(out / name),
        *(["--lora-r", "16"] if "lora" in more else []),
        *(["--grad-checkpointing", "true"] if "ckpt" in more else []),
        *(["--merge-lora", "false"] if "adapter" in more else []),
    ]
    if "sft" in more:  # offline: no rollout and (no task) no evaluation gathers the full weights
        args = [
            "sft",
            *common,
            "--data",
            str(out / "rows.jsonl"),
            "--task",
            "",
            "--batch-size",
            "4",
            "--micro-batch-size",
            "2",
        ]
    else:
        args = [
            "train",
            *common,
            "--steps",
            str(a.steps),
            "--prompts-per-step",
            "2",
            "--samples-per-prompt",
            "4",
            "--max-new-tokens",
            "16",
            "--eval-size",
            "2",
            "--micro-batch-size",
            "4",
            "--reward",
            f"{out / 'reward.py'}:distinct",
        ]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(a.nproc),
        "--no-python",
        "bash",
        "-c",
        worker,
        "bash",
        *args,
    ]
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t
    (out / f"{name}.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise SystemExit(f"{name} failed:\n{res.stderr[-3000:]}")
    grad_norms = [json.loads(x)["optim/grad_norm"] for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    assert all(g > 0 for g in grad_norms), f"{name}: a step without a gradient ({grad_norms})"
    peaks = []
    for r in range(a.nproc):
        line = next(x for x in Path(f"{rss}.{r}").read_text().splitlines() if "Maximum resident set size" in x)
        peaks.append(int(line.split()[-1]) / 2**20)  # KiB -> GiB
    return {"run": name, "peak_rss_gib": peaks, "wall_s": wall, "grad_norms": grad_norms}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", default="results/fsdp_memory")
    p.add_argument(
        "--runs",
        default="ddp,ddp+save,fsdp,fsdp+save",
        help="comma-separated: strategy[+save][+lora][+ckpt][+adapter][+sft]",
    )
    a = p.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "reward.py").write_text(REWARD)
    with open(out / "rows.jsonl", "w") as f:  # +sft: a.steps batches of 4 rows (a fifth more are held out)
        f.writelines(
            json.dumps({"prompt": f"What is {i} + {i}?", "completion": str(2 * i)}) + "\n" for i in range(5 * a.steps)
        )
    folder = qwen_shaped_folder("smollm2-135m", QWEN_0_5B)
    params = sum(v.numel() for v in load_file(Path(folder) / "model.safetensors").values())
    rows, diffs = [], {}  # diffs: fsdp's final weights against ddp's with the same options
    try:
        for name in a.runs.split(","):
            rows.append(run(folder, name, a, out))
            print(json.dumps(rows[-1]), flush=True)
        for name in [r["run"] for r in rows if r["run"].startswith("fsdp")]:
            twin = "ddp" + name[len("fsdp") :]
            if twin in [r["run"] for r in rows]:
                w = [load_file(out / n / "model" / "model.safetensors") for n in (twin, name)]
                diffs[f"{twin} vs {name}"] = max((w[0][k] - w[1][k]).abs().max().item() for k in w[0])
    finally:  # 2 GiB per model folder: the random model and every run's weights go, the logs stay
        shutil.rmtree(folder, ignore_errors=True)
        for name in a.runs.split(","):
            for weights in ("model", "checkpoint"):
                shutil.rmtree(out / name / weights, ignore_errors=True)
    cpu = next(
        (
            x.split(":", 1)[1].strip()
            for x in Path("/proc/cpuinfo").read_text().splitlines()
            if x.startswith("model name")
        ),
        "?",
    )
    result = {
        "model": "qwen2.5-0.5b-shaped (random weights)",
        "params": params,
        "nproc": a.nproc,
        "steps": a.steps,
        "torch": torch.__version__,
        "cpu": cpu,
        "final_weights_max_abs_diff": diffs,
        "runs": rows,
    }
    (out / "results.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"{params / 1e6:.0f}M parameters, {a.nproc} processes, {cpu}, torch {torch.__version__}",
        "",
        "| run | peak RSS per process | wall time |",
        "|---|---|---|",
    ]
    for r in rows:
        peaks = " / ".join(f"{x:.2f}" for x in r["peak_rss_gib"])
        lines.append(f"| {r['run']} | {peaks} GiB | {r['wall_s']:.0f} s |")
    lines += [""] + [f"final weights, {k}: max |difference| {v:.2e}" for k, v in diffs.items()]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

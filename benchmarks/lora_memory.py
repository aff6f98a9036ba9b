"""Peak memory and time of one GRPO step with LoRA against full fine-tuning, with and without gradient
checkpointing, on SmolLM2-135M and on a model of Qwen2.5-1.5B's architecture and size with random weights
(built from its config: no download).

    python benchmarks/lora_memory.py                          # both models; writes results/lora_memory/
    python benchmarks/lora_memory.py --models smollm2-135m --reps 2
    python benchmarks/lora_memory.py --modes full,full+ckpt --micro 8,64 --out results/grad_ckpt
    python benchmarks/lora_memory.py --device cuda --out results/lora_memory_gpu   # bf16-mixed, peak GPU memory

Each (model, mode) runs in its own subprocess, so each peak resident memory is its own. A step is what the loop
does: a rollout of 8 prompts x 8 samples x 32 new tokens, then the backward of every row (random +-1 advantages:
a random model's rewards carry no signal) in micro-batches of 8 (--micro), then the optimizer step. The first step
is a warm-up; times are medians of --reps steps; memory is the peak of the whole process, and the peak while the
update runs (the kernel's high-water mark, reset before each update through /proc/self/clear_refs; it counts
memory the allocator kept from the rollout, so it is at least what was resident when the update began).

Full fine-tuning of the 1.5B-shaped model is not run here: fp32 weights, gradients and AdamW's two moments are
16 bytes a parameter, 23 GiB for 1.54B parameters before any activation, on a 24 GiB machine. The script prints
that arithmetic beside the measured LoRA step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

# Qwen2.5-1.5B's config.json (architecture and sizes only); weights are random.
QWEN_1_5B = dict(
    model_type="qwen2",
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    bos_token_id=151643,
    eos_token_id=151643,
)
QWEN_0_5B = {
    **QWEN_1_5B,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
}  # Qwen2.5-0.5B's config.json: the same family, smaller


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current resident size (Linux >= 4.0)


def peak_since_reset_gib() -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 2**20  # KiB


def qwen_shaped_folder(tok_from: str, config: dict = QWEN_1_5B) -> str:
    """A folder with a random model of a Qwen2.5 shape (1.5B by default) and SmolLM2's tokenizer (its ids fit the
    vocabulary)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from nanorl.models import load_model

    out = Path(tempfile.mkdtemp(prefix="qwen_shaped_"))
    _, tok = load_model(tok_from)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**config), dtype=torch.float32)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def one_run(model_name: str, lora_r: int, reps: int, device_name: str, ckpt: bool = False, micro: int = 8) -> dict:
    from nanorl.backends import select_backend
    from nanorl.config import GRPOConfig
    from nanorl.data import render_prompt
    from nanorl.learner import make_optimizer, optimizer_step
    from nanorl.models import load_model, resolve_device, stop_token_ids, trainable
    from nanorl.online import prompt_order, sampling_params
    from nanorl.sampling import LocalSampler
    from nanorl.seeds import derive_seed
    from nanorl.tasks import task_from_config
    from nanorl.update import policy_backward

    cfg = GRPOConfig(
        model=model_name,
        lora_r=lora_r,
        lora_alpha=2.0 * max(lora_r, 1),
        device=device_name,
        micro_batch_size=micro,
        grad_checkpointing=ckpt,
    )
    device = resolve_device(cfg.device)
    backend, dtype = select_backend(cfg.backend, cfg.dtype, device, cfg.grad_checkpointing)
    backend.prepare(device)
    policy, tok = load_model(cfg.model, device, dtype)
    policy = trainable(policy, cfg).eval()
    sampler = LocalSampler(policy, stop_token_ids(policy, tok), tok.pad_token_id, backend)
    opt, sched = make_optimizer(policy, dataclasses.replace(cfg, warmup_steps=0, lr_schedule="constant"), 100)
    task = task_from_config(cfg)
    examples = [task.train[i] for i in prompt_order(len(task.train), cfg.seed, 0, cfg.prompts_per_step)]
    prompts = [render_prompt(tok, ex.prompt) for ex in examples]
    times, update_peak = {"rollout": [], "update": []}, 0.0
    for r in range(reps + 1):
        t = time.perf_counter()
        roll = sampler.generate(prompts, cfg.samples_per_prompt, sampling_params(cfg), derive_seed(0, r, "rollout"))
        t_roll = time.perf_counter() - t
        adv = torch.randn(len(roll.completion_ids), generator=torch.Generator().manual_seed(r)).sign()
        if device.type == "cpu":
            reset_peak()
        t = time.perf_counter()
        policy_backward(
            policy,
            roll,
            adv,
            list(range(len(adv))),
            cfg,
            on_policy=True,
            pad_id=tok.pad_token_id,
            device=device,
            backend=backend,
        )
        optimizer_step(policy, opt, sched, cfg.grad_clip)  # .item() inside: synchronised
        update_peak = max(update_peak, peak_since_reset_gib()) if device.type == "cpu" else 0.0
        if r:  # the first step is a warm-up
            times["rollout"].append(t_roll)
            times["update"].append(time.perf_counter() - t)
    params = sum(p.numel() for p in policy.parameters())
    trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    gpu = {"peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30} if device.type == "cuda" else {}
    return {
        "params": params,
        "trained_params": trained,
        "peak_rss_gib": peak_rss_gib(),
        "update_peak_rss_gib": update_peak,
        **gpu,
        **{f"{k}_s": statistics.median(v) for k, v in times.items()},
        "tokens": sum(len(c) for c in roll.completion_ids),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="smollm2-135m,qwen2.5-1.5b-shaped")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument(
        "--modes",
        default="lora,full",
        help="comma-separated: lora, full, lora+ckpt, full+ckpt "
        "(+ckpt: grad_checkpointing); full is skipped for the 1.5B-shaped model on CPU",
    )
    p.add_argument("--micro", default="8", help="micro-batch sizes, comma-separated (cpu default 8, cuda 64)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--tokenizer", default="smollm2-135m", help="the 1.5B-shaped model's tokenizer (a model name)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (bf16-mixed, micro-batch 64)")
    p.add_argument("--out", default="results/lora_memory")
    p.add_argument("--one", nargs=4, help=argparse.SUPPRESS)  # internal: MODEL LORA_R CKPT MICRO in a subprocess
    a = p.parse_args()
    if a.one:
        print(json.dumps(one_run(a.one[0], int(a.one[1]), a.reps, a.device, a.one[2] == "1", int(a.one[3]))))
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, failed = [], []
    for name in a.models.split(","):
        folder = qwen_shaped_folder(a.tokenizer) if name == "qwen2.5-1.5b-shaped" else name
        modes = [
            m for m in a.modes.split(",") if m.startswith("lora") or name != "qwen2.5-1.5b-shaped" or a.device != "cpu"
        ]
        for mode, micro in ((m, int(b)) for m in modes for b in a.micro.split(",")):
            r, ckpt = (a.lora_r if mode.startswith("lora") else 0), mode.endswith("+ckpt")
            res = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    folder,
                    str(r),
                    str(int(ckpt)),
                    str(micro),
                    "--reps",
                    str(a.reps),
                    "--device",
                    a.device,
                ],
                capture_output=True,
                text=True,
            )
            if res.returncode != 0:  # the others still run: on a lent GPU there is one try
                failed.append(f"{name} {mode} micro {micro}")
                print(f"{failed[-1]} failed:\n{res.stderr[-3000:]}", flush=True)
                continue
            row = {
                "model": name,
                "mode": mode,
                "lora_r": r,
                "grad_checkpointing": ckpt,
                "micro_batch_size": micro,
                **json.loads(res.stdout.strip().splitlines()[-1]),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        if folder != name:
            shutil.rmtree(folder, ignore_errors=True)  # the random 1.5B model: 6 GiB of /tmp
        if name == "qwen2.5-1.5b-shaped" and a.device == "cpu" and rows and rows[-1]["model"] == name:
            n = rows[-1]["params"]
            rows.append(
                {
                    "model": name,
                    "mode": "full (arithmetic, not run)",
                    "params": n,
                    "state_gib": 16 * n / 2**30,
                    "note": "fp32 weights + gradients + AdamW's two moments = 16 bytes a parameter",
                }
            )
    (out / "lora_memory.json").write_text(json.dumps(rows, indent=2))
    lines = [
        "| model | mode | micro-batch | trained params | peak RSS (GPU) | peak RSS in the update | rollout | "
        "update (every row) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "peak_rss_gib" in r:
            mode = r["mode"].replace("lora", f"lora r={r['lora_r']}")
            gpu = f" ({r['peak_gpu_gib']:.2f} GiB)" if "peak_gpu_gib" in r else ""
            lines.append(
                f"| {r['model']} | {mode} | {r['micro_batch_size']} | "
                f"{r['trained_params'] / 1e6:.1f}M of {r['params'] / 1e6:.0f}M | {r['peak_rss_gib']:.2f} GiB{gpu} | "
                f"{r['update_peak_rss_gib']:.2f} GiB | {r['rollout_s']:.1f} s | {r['update_s']:.1f} s |"
            )
        else:
            lines.append(
                f"| {r['model']} | {r['mode']} | | {r['params'] / 1e6:.0f}M | > {r['state_gib']:.1f} GiB "
                f"(weights, gradients, AdamW) | | | |"
            )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if failed:
        raise SystemExit(f"failed: {'; '.join(failed)}")


if __name__ == "__main__":
    main()

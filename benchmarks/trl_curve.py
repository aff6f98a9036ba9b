"""Held-out accuracy against training minutes: TRL's GRPOTrainer on nanorl's default run, next to
nanorl's own curve.

    pip install -e ".[bench]"
    python benchmarks/trl_curve.py                          # ~45 min on a 2-core CPU
    python benchmarks/trl_curve.py --steps 2 --eval-every 1 --eval-size 8 --model tiny   # smoke run
    python benchmarks/trl_curve.py --report-only     # redo table and plot from OUT/curve.json and --nanorl-run

TRL gets the default `nanorl train` configuration, setting by setting: SmolLM2-135M-Instruct, fp32,
two-digit addition under the chat template, 8 prompts x 8 completions a step, 32 new tokens,
temperature 1, group-normalised advantages, token-level loss (TRL `loss_type="dapo"`), beta 0,
AdamW lr 2e-5 (betas 0.9/0.99) with 3 warmup steps and a cosine decay to 10%, gradient-norm clip 1,
40 steps, and the same prompts in the same order (nanorl's `prompt_order`). No gradient
checkpointing, no vLLM, no bf16 autocast (TRL turns it on by default, on a CPU too: the curve of
2026-12-03 ran that way, and its step-0 score, 6.0% against 7.0% for the same weights, was the
sign). What differs is TRL's own machinery (and its warmup starting at lr 0).

Every `--eval-every` steps the TRL model is scored by nanorl's own `evaluate` (greedy, the same 200
held-out prompts), with the clock stopped: the minutes are training time only, summed step times,
for both tools. nanorl's curve is read from a finished run folder (`--nanorl-run`, default
results/grpo_default_seed0, made by `bash runs/default_cpu.sh`).

Writes OUT/curve.json (both curves, per-step times, TRL's logs) and OUT/curve.png.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def nanorl_curve(run_dir: Path) -> list[dict]:
    """[{step, minutes, acc}] from a nanorl run folder; minutes = summed step times (no eval, no loading)."""
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    train_s, total = {0: 0.0}, 0.0
    for m in metrics:
        total += m["time/step"]
        train_s[m["step"]] = total
    return [{"step": e["step"], "minutes": train_s[e["step"]] / 60, "acc": e["eval/greedy_acc"]} for e in evals]


def trl_args(cfg, output_dir: str, **overrides):
    """TRL's GRPOConfig for nanorl's GRPOConfig `cfg`, setting by setting (the module docstring says why each);
    `overrides` replace any of them."""
    from trl import GRPOConfig as TRLConfig

    n = cfg.prompts_per_step * cfg.samples_per_prompt
    assert n % cfg.micro_batch_size == 0
    settings = dict(
        output_dir=output_dir,
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=n // cfg.micro_batch_size,  # one generation batch, one optimizer step
        num_generations=cfg.samples_per_prompt,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_k=0,
        top_p=1.0,
        beta=cfg.kl_coef,
        epsilon=cfg.clip_low,
        epsilon_high=cfg.clip_high,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=cfg.epochs,
        learning_rate=cfg.lr,
        adam_beta1=0.9,
        adam_beta2=0.99,
        adam_epsilon=1e-8,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.grad_clip,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.1},
        gradient_checkpointing=False,
        use_cpu=True,
        max_steps=cfg.steps,
        logging_steps=1,
        bf16=False,
        fp16=False,  # TRL's own default is bf16=True, which autocasts on CPUs too
        report_to="none",
        save_strategy="no",
        shuffle_dataset=False,
        seed=cfg.seed,
        disable_dropout=True,
    )
    return TRLConfig(**{**settings, **overrides})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-size", type=int, default=200)
    p.add_argument("--nanorl-run", default="results/grpo_default_seed0")
    p.add_argument("--out", default="results/trl_curve")
    p.add_argument("--report-only", action="store_true", help="reuse the TRL curve in OUT/curve.json; no training")
    a = p.parse_args()
    out = Path(a.out)
    if a.report_only:
        report(json.loads((out / "curve.json").read_text()), Path(a.nanorl_run), out)
        return

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from nanorl.config import GRPOConfig
    from nanorl.evaluate import evaluate
    from nanorl.models import load_model, stop_token_ids
    from nanorl.online import prompt_order
    from nanorl.sampling import LocalSampler, SamplingParams
    from nanorl.tasks import task_from_config

    # ----------------------------------------------------------------------------- the same run
    cfg = GRPOConfig(model=a.model, steps=a.steps, eval_size=a.eval_size)
    torch.manual_seed(cfg.seed)
    task = task_from_config(cfg)
    model, tok = load_model(cfg.model, "cpu", torch.float32)
    order = [i for s in range(cfg.steps) for i in prompt_order(len(task.train), cfg.seed, s, cfg.prompts_per_step)]
    by_prompt = {ex.prompt: ex for ex in task.train}
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": task.train[i].prompt}]} for i in order])

    def reward(prompts, completions, **_):
        return task.score([by_prompt[p[-1]["content"]] for p in prompts], [c[0]["content"] for c in completions])

    out.mkdir(parents=True, exist_ok=True)
    n = cfg.prompts_per_step * cfg.samples_per_prompt  # the whole step in one micro-batch
    args = trl_args(
        cfg, tempfile.mkdtemp(prefix="trl_curve_"), per_device_train_batch_size=n, gradient_accumulation_steps=1
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok)
    assert trainer.accelerator.mixed_precision == "no", "TRL must run in fp32, as nanorl does on CPU"

    # ----------------------------------------------------------------------------- clock and evals
    rec = {"step_s": [], "logs": [], "curve": []}

    def score(step: int, train_s: float) -> None:
        metrics, _ = evaluate(
            LocalSampler(trainer.model, stop_token_ids(trainer.model, tok), tok.pad_token_id),
            tok,
            task,
            SamplingParams(cfg.max_new_tokens),
        )
        rec["curve"].append({"step": step, "minutes": train_s / 60, "acc": metrics["eval/greedy_acc"]})
        print(
            f"[trl_curve] step {step}: held-out greedy {metrics['eval/greedy_acc']:.1%} "
            f"after {train_s / 60:.1f} training min",
            flush=True,
        )
        (out / "curve.json").write_text(json.dumps({"trl": rec}, indent=1))

    class Clock(TrainerCallback):
        def on_train_begin(self, *_a, **_kw):
            score(0, 0.0)

        def on_step_begin(self, *_a, **_kw):
            self.t = time.perf_counter()

        def on_step_end(self, _args, state, *_a, **_kw):
            rec["step_s"].append(time.perf_counter() - self.t)
            if state.global_step % a.eval_every == 0 or state.global_step == a.steps:
                score(state.global_step, sum(rec["step_s"]))

        def on_log(self, _args, _state, _control, logs=None, **_kw):
            rec["logs"].append(logs)

    trainer.add_callback(Clock())
    trainer.train()

    # ----------------------------------------------------------------------------- report
    import trl

    report(
        {"trl_version": trl.__version__, "command": "python benchmarks/trl_curve.py", "trl": rec},
        Path(a.nanorl_run),
        out,
    )


def report(res: dict, nanorl_run: Path, out: Path) -> None:
    """Add nanorl's curve to `res`, write OUT/curve.json, OUT/table.md and OUT/curve.png, print the table."""
    if (nanorl_run / "eval.jsonl").is_file():
        res["nanorl"] = {"run": str(nanorl_run), "curve": nanorl_curve(nanorl_run)}
    (out / "curve.json").write_text(json.dumps(res, indent=1))
    rows = ["| step | nanorl min | nanorl acc | TRL min | TRL acc |", "|---|---|---|---|---|"]
    ours = {c["step"]: c for c in res.get("nanorl", {}).get("curve", [])}
    for c in res["trl"]["curve"]:
        o = ours.get(c["step"])
        rows.append(
            f"| {c['step']} | {o['minutes']:.1f} | {o['acc']:.1%} | {c['minutes']:.1f} | {c['acc']:.1%} |"
            if o
            else f"| {c['step']} | - | - | {c['minutes']:.1f} | {c['acc']:.1%} |"
        )
    (out / "table.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, curve in (("nanorl", res.get("nanorl", {}).get("curve", [])), ("TRL GRPOTrainer", res["trl"]["curve"])):
        if curve:
            ax.plot([c["minutes"] for c in curve], [c["acc"] for c in curve], "o-", label=name)
    ax.set_xlabel("training minutes (2-core CPU, fp32)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=110)


if __name__ == "__main__":
    main()

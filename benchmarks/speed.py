"""Speed and memory of one GRPO step: nanorl against TRL's GRPOTrainer, plain `generate`, and this
machine's matmul roofline, side by side in one run.

    pip install -e ".[bench]"                     # the peer, TRL >= 1.16; only this benchmark needs it
    python benchmarks/speed.py                    # SmolLM2-135M, 8 prompts x 8 samples, 32 new tokens
    bash benchmarks/gpu.sh                        # on a GPU: bf16-mixed, two batch shapes, tokens/s and MFU
    python benchmarks/speed.py --parts roofline,generate,nanorl --model tiny --reps 2   # smoke run
    python benchmarks/speed.py --parts nanorl,trl --lora-r 16     # LoRA (peft) in both, the same adapters

Every part runs in its own subprocess, one after the other, so each one's peak resident memory is
its own and no two share the cores. All parts use the same model, the same first prompts of the
default run (seed 0, two-digit addition, chat template), temperature 1, no top-k / top-p, no KL
term, learning rate 5e-6, and the same batch shape. Each part runs `--warmup` steps, then `--reps`
timed ones; we report medians and the min-max spread.

    roofline   sustained matmul FLOP/s (fp32 on CPU, bf16 on GPU) on the model's own weight shapes: forward at
               M = 64 rows (decoding) and forward + both backward matmuls at M = 512 tokens (prefill and update), with
               torch's matmul (MKL on CPU) and with oneDNN, taking the faster for each kind of matmul.
               Ideal times follow: 2 N FLOPs per token through the model, 6 N per trained token,
               with N the weights that take part in matmuls (the tied embedding counts as the head).
    generate   `model.generate` for the same rows (each prompt repeated once per sample, as TRL does).
    nanorl     a GRPO step of nanorl's own pieces (`online.rollout` and `online.reward`, the group advantage,
               `update.policy_backward`, `optimizer_step`), timed phase by phase; the update is run twice:
               as the loop runs it (rows whose advantage is exactly 0 are skipped) and with every one
               of the rows trained (the same work TRL does), on alternate steps.
    trl        TRL's `GRPOTrainer`, the equivalent configuration (loss "dapo", beta 0, one
               iteration, no gradient checkpointing, no vLLM), split with wrappers around its
               `_generate` (generation), `_generate_and_score_completions` (generation + reward +
               bookkeeping) and `compute_loss` (the loss forward); the rest of a step is backward + optimizer.
    profile    torch.profiler over one nanorl step (rollout, and an update of every row): the top
               operators by self time, written to OUT/profile_nanorl.txt.

Writes OUT/speed.json (everything) and OUT/table.md (the table of docs/speed.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

LR, SEED = 5e-6, 0


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def cpu_identity() -> str:
    """The CPU as /proc/cpuinfo names it, with family / model / stepping: hosts behind one model name differ
    (an "AMD EPYC" of family 25 is Zen 3/4, 26 is Zen 5, with twice the AVX-512 width)."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines()[:30] if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        return f"{info['model name']} (family {info['cpu family']} model {info['model']} stepping {info['stepping']})"
    except (OSError, KeyError, ValueError):  # not Linux, or another layout
        return platform.processor() or platform.machine()


def device_and_precision(a):
    """(device, weight dtype, autocast dtype or None): on a GPU fp32 weights with bf16 autocast (nanorl's
    default there, and TRL's bf16=True), else cpu + fp32 (bf16 is ~100x slower on CPUs without bf16 units)."""
    from nanorl.backends import resolve_precision
    from nanorl.models import resolve_device

    device = resolve_device(a.device)
    return device, *resolve_precision("auto", device)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def memory(device) -> dict:
    out = {"peak_rss_gib": peak_rss_gib()}
    if device.type == "cuda":
        out["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def med(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def matmul_params(model) -> int:
    """Weights that take part in matmuls: every Linear, including the LM head (tied or not)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def count_tokens(model) -> dict:
    """Count the tokens every forward of `model`'s backbone processes (padding included)."""
    seen = {"tokens": 0}

    def hook(_module, _args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None:
            seen["tokens"] += ids.numel()

    model.base_model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def first_prompts(cfg, a):
    """The default run's first-step examples."""
    from nanorl.online import prompt_order
    from nanorl.tasks import task_from_config

    task = task_from_config(cfg)
    return task, [task.train[i] for i in prompt_order(len(task.train), SEED, 0, a.prompts)]


# ---------------------------------------------------------------------------------------------- parts
def part_roofline(a) -> dict:
    from nanorl.backends.cpu import _dnn as dnn  # the call nanorl's linears make on CPU
    from nanorl.models import load_model

    device, dtype, autocast = device_and_precision(a)
    dtype = autocast or dtype  # the dtype the matmuls run in
    model, _ = load_model(a.model, "cpu", torch.float32)
    shapes = [m.weight.shape for m in model.modules() if isinstance(m, torch.nn.Linear)]  # (out, in) each
    weights = {s: torch.randn(s, device=device, dtype=dtype) for s in set(shapes)}
    # Two libraries on CPU: torch's own matmul (MKL's sgemm for fp32) and oneDNN (what nanorl's linears use on
    # CPU, cpu.fast_cpu). The roofline is the faster of the two for each kind of matmul.
    libs = {"torch": {"fwd": lambda x, w: x @ w.T, "dx": lambda g, w: g @ w, "dw": lambda g, x: g.T @ x}}
    if device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available():
        libs["onednn"] = {"fwd": dnn, "dx": lambda g, w: dnn(g, w.T), "dw": lambda g, x: dnn(g.T, x.T)}

    def sweep(M: int, backward: bool, ops: dict, packed: dict | None = None) -> dict:
        """Seconds per kind of matmul for one pass over all of the model's weights at M rows (one sync per
        kind, so a GPU's launches overlap as they do in a model; a sync per matmul would time its latency)."""
        xs = {s: torch.randn(M, s[1], device=device, dtype=dtype) for s in weights}
        gs = {s: torch.randn(M, s[0], device=device, dtype=dtype) for s in weights}
        args = {
            "fwd": lambda s: (xs[s], (packed or weights)[s]),
            "dx": lambda s: (gs[s], weights[s]),
            "dw": lambda s: (gs[s], xs[s]),
        }
        secs = {"fwd": 0.0, "dx": 0.0, "dw": 0.0}
        for kind in ("fwd", "dx", "dw") if backward else ("fwd",):
            sync(device)
            t = time.perf_counter()
            for s in shapes:
                ops[kind](*args[kind](s))
            sync(device)
            secs[kind] = time.perf_counter() - t
        return secs

    out, per_lib = {}, {}
    for name, M, bw in (("decode_m64_fwd", 64, False), ("update_m512_fwd_bwd", 512, True)):
        flops = sum((6 if bw else 2) * M * s[0] * s[1] for s in shapes)
        best, rates = None, {}
        for lib, ops in libs.items():
            packed = None
            if (
                lib == "onednn" and not bw
            ):  # decoding reuses each weight many times: reordered once, as the sampler does
                packed = {s: torch.ops.mkldnn._reorder_linear_weight(w, M) for s, w in weights.items()}
            sweep(M, bw, ops, packed)  # warm-up
            runs = [sweep(M, bw, ops, packed) for _ in range(max(3, a.reps))]
            secs = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            rates[lib] = flops / sum(secs.values())
            best = secs if best is None else {k: min(best[k], secs[k]) for k in secs}
        out[name] = {"median": flops / sum(best.values())}
        per_lib[name] = rates
    res = {
        "matmul_params": matmul_params(model),
        "flops": out,
        "flops_per_library": per_lib,
        "dtype": str(dtype),
        "device": str(device),
    }
    if device.type == "cuda":  # the chip's own ceiling, for MFU: a large square product (random data, not zeros)
        x, y = torch.randn(8192, 8192, device=device, dtype=dtype), torch.randn(8192, 8192, device=device, dtype=dtype)
        for _ in range(3):
            x @ y
        sync(device)
        t = time.perf_counter()
        for _ in range(10):
            x @ y
        sync(device)
        res["peak_flops"] = 10 * 2 * 8192**3 / (time.perf_counter() - t)
        res["gpu"] = torch.cuda.get_device_name(device)
    return res


def hf_generate(model, ids, mask, new_tokens: int, pad: int, stops: list[int], fixed: bool = False) -> torch.Tensor:
    """Plain `model.generate` of these rows with the sampler's settings (temperature 1, no top-k or top-p):
    the new tokens (rows, new_tokens); `fixed`: every row runs to new_tokens (min_new_tokens: no stop before)."""
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        pad_token_id=pad,
        eos_token_id=stops,
        min_new_tokens=new_tokens if fixed else 0,
    )
    return out[:, ids.shape[1] :]


def generated_tokens(new: torch.Tensor, stops: list[int]) -> int:
    """Tokens `hf_generate` sampled: each row up to and including its first stop token (then padding)."""
    return sum(next((i + 1 for i, x in enumerate(row) if x in stops), len(row)) for row in new.tolist())


def part_generate(a) -> dict:
    from nanorl.config import GRPOConfig
    from nanorl.data import render_prompt
    from nanorl.models import load_model, stop_token_ids
    from nanorl.sampling import left_pad

    cfg = GRPOConfig(model=a.model)
    device, dtype, autocast = device_and_precision(a)
    model, tok = load_model(a.model, device, dtype)
    model.eval()
    _, examples = first_prompts(cfg, a)
    stops, pad = stop_token_ids(model, tok), tok.pad_token_id
    rows = [render_prompt(tok, ex.prompt) for ex in examples for _ in range(a.samples)]  # each prompt repeated, as TRL
    ids, mask = left_pad(rows, pad, device)
    times, prefill, tokens = [], [], []
    for r in range(a.warmup + a.reps):
        torch.manual_seed(SEED + r)
        with torch.no_grad(), torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
            sync(device)
            t = time.perf_counter()
            model(input_ids=ids, attention_mask=mask, logits_to_keep=1)  # the prefill alone
            sync(device)
            t_prefill = time.perf_counter() - t
            t = time.perf_counter()
            new = hf_generate(model, ids, mask, a.new_tokens, pad, stops)
            sync(device)
            dt = time.perf_counter() - t
        n = generated_tokens(new, stops)
        if r >= a.warmup:
            times.append(dt), prefill.append(t_prefill), tokens.append(n)
    return {
        "time": med(times),
        "prefill_time": med(prefill),
        "tokens": med(tokens),
        "tokens_per_s": med([n / t for n, t in zip(tokens, times)]),
        "prompt_tokens": int(mask.sum()),
        **memory(device),
    }


def nanorl_run(a):
    """nanorl's pieces for the benchmark batch, set up as grpo.train sets them up: config, run (policy, tokenizer,
    task, sampler, backend, device), examples, optimizer."""
    from types import SimpleNamespace

    from nanorl.backends import select_backend
    from nanorl.config import GRPOConfig
    from nanorl.learner import make_optimizer
    from nanorl.models import load_model, resolve_device, stop_token_ids, trainable
    from nanorl.sampling import LocalSampler

    cfg = GRPOConfig(
        model=a.model,
        lr=LR,
        prompts_per_step=a.prompts,
        samples_per_prompt=a.samples,
        device=a.device,
        micro_batch_size=a.micro_batch_size,
        lora_r=a.lora_r,
        max_new_tokens=a.new_tokens,
        eval_size=8,
        out_dir=tempfile.mkdtemp(prefix="nanorl_speed_"),
    )
    device = resolve_device(cfg.device)
    backend, dtype = select_backend(cfg.backend, cfg.dtype, device)
    backend.prepare(device)
    torch.manual_seed(cfg.seed)
    task, examples = first_prompts(cfg, a)
    policy, tok = load_model(cfg.model, device, dtype)
    policy = trainable(policy, cfg).eval()  # --lora-r: peft adapters (alpha 32, every linear projection)
    run = SimpleNamespace(
        policy=policy,
        tok=tok,
        task=task,
        device=device,
        backend=backend,
        pad_id=tok.pad_token_id,
        sampler=LocalSampler(policy, stop_token_ids(policy, tok), tok.pad_token_id, backend),
    )
    opt, sched = make_optimizer(run.policy, dataclasses.replace(cfg, warmup_steps=0, lr_schedule="constant"), 10_000)
    return cfg, run, examples, opt, sched


def nanorl_rollout(cfg, run, examples, r: int, timer: dict):
    """One rollout and its rewards, as the loop runs it at step r -> rollouts, texts, rewards (N,), reward parts."""
    from nanorl import online
    from nanorl.seeds import derive_seed

    roll, texts = online.rollout(run.sampler, run.tok, examples, cfg, derive_seed(SEED, r, "rollout"), timer)
    rewards, parts = online.reward(run.task, None, examples, texts, roll, cfg, timer, run.device, run.backend)
    return roll, texts, rewards, parts


def nanorl_update(cfg, run, roll, adv) -> None:
    """The backward of every row with a non-zero advantage, as the loop runs it (the caller steps the optimizer)."""
    from nanorl.update import policy_backward

    policy_backward(
        run.policy,
        roll,
        adv,
        list(range(len(adv))),
        cfg,
        on_policy=True,
        pad_id=run.pad_id,
        device=run.device,
        backend=run.backend,
    )


def part_nanorl(a) -> dict:
    from nanorl.advantages import ESTIMATORS
    from nanorl.learner import optimizer_step

    cfg, run, examples, opt, sched = nanorl_run(a)
    seen = count_tokens(run.policy)
    rec = {
        k: []
        for k in (
            "rollout",
            "reward",
            "update_as_run",
            "update_all_rows",
            "rollout_tokens",
            "update_tokens_as_run",
            "update_tokens_all_rows",
            "rows_as_run",
        )
    }
    for r in range(a.warmup + 2 * a.reps):
        timer = {"rollout": 0.0, "reward": 0.0, "tokens": 0}
        roll, _, rewards, _ = nanorl_rollout(cfg, run, examples, r, timer)  # (N,)
        adv = ESTIMATORS["group"](rewards, a.samples, True)  # (N,)
        all_rows = r % 2 == 1
        if all_rows:  # the work TRL does: every row carries a (here random, non-zero) advantage
            adv = torch.randn(len(adv), generator=torch.Generator().manual_seed(r)).sign()
        seen["tokens"] = 0
        t = time.perf_counter()
        nanorl_update(cfg, run, roll, adv)
        optimizer_step(run.policy, opt, sched, cfg.grad_clip)  # .item() inside: synchronised
        dt = time.perf_counter() - t
        if r < a.warmup:
            continue
        if not all_rows:
            rec["rollout"].append(timer["rollout"]), rec["reward"].append(timer["reward"])
            rec["rollout_tokens"].append(timer["tokens"])
            rec["update_as_run"].append(dt), rec["update_tokens_as_run"].append(seen["tokens"])
            rec["rows_as_run"].append(int((adv != 0).sum()))
        else:
            rec["update_all_rows"].append(dt), rec["update_tokens_all_rows"].append(seen["tokens"])
    out = {k: med(v) for k, v in rec.items()}
    out["rollout_tokens_per_s"] = med([n / t for n, t in zip(rec["rollout_tokens"], rec["rollout"])])
    return {**out, **memory(run.device)}


def part_trl(a) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    from nanorl.config import GRPOConfig
    from nanorl.models import load_model

    cfg = GRPOConfig(model=a.model)
    task, examples = first_prompts(cfg, a)
    device, dtype, autocast = device_and_precision(a)
    model, tok = load_model(a.model, device, dtype)  # fp32 weights; bf16=True below autocasts, as nanorl does
    steps = a.warmup + a.reps
    by_prompt = {ex.prompt: ex for ex in task.train}
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": ex.prompt}]} for ex in examples] * steps)

    def reward(prompts, completions, **_):
        return task.score([by_prompt[p[-1]["content"]] for p in prompts], [c[0]["content"] for c in completions])

    args = TRLConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_speed_"),
        per_device_train_batch_size=a.prompts * a.samples,
        num_generations=a.samples,
        max_completion_length=a.new_tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        learning_rate=LR,
        beta=0.0,
        loss_type="dapo",
        num_iterations=1,
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        bf16=autocast == torch.bfloat16,
        use_cpu=device.type == "cpu",
        max_steps=steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        shuffle_dataset=False,
        seed=SEED,
        disable_dropout=True,
    )
    peft_config = None
    if a.lora_r:  # the same adapters as nanorl's --lora-r (config.ScaleConfig's defaults: alpha 32, all-linear)
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=a.lora_r,
            lora_alpha=GRPOConfig.lora_alpha,
            lora_dropout=0.0,
            target_modules=GRPOConfig.lora_target,
            task_type="CAUSAL_LM",
        )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, peft_config=peft_config
    )
    assert trainer.accelerator.mixed_precision == ("bf16" if autocast else "no"), trainer.accelerator.mixed_precision
    seen = count_tokens(trainer.model)
    clock = {"generate": 0.0, "gen_and_score": 0.0, "loss_forward": 0.0, "loss_tokens": 0}

    def timed(name, fn, tokens=False):
        def wrapper(*args, **kwargs):
            before, t = seen["tokens"], time.perf_counter()
            out = fn(*args, **kwargs)
            clock[name] += time.perf_counter() - t
            if tokens:
                clock["loss_tokens"] += seen["tokens"] - before
            return out

        return wrapper

    trainer._generate = timed("generate", trainer._generate)
    trainer._generate_and_score_completions = timed("gen_and_score", trainer._generate_and_score_completions)
    trainer.compute_loss = timed("loss_forward", trainer.compute_loss, tokens=True)
    rec = {
        k: []
        for k in (
            "step",
            "generate",
            "gen_and_score",
            "loss_forward",
            "backward_and_optimizer",
            "loss_tokens",
            "generated_tokens",
        )
    }

    class Steps(TrainerCallback):
        def on_step_begin(self, *_args, **_kw):
            self.t = time.perf_counter()
            clock.update(generate=0.0, gen_and_score=0.0, loss_forward=0.0, loss_tokens=0)

        def on_step_end(self, _args, state, *_a, **_kw):
            dt = time.perf_counter() - self.t
            if state.global_step > a.warmup:
                rec["step"].append(dt)
                for k in ("generate", "gen_and_score", "loss_forward", "loss_tokens"):
                    rec[k].append(clock[k])
                rec["backward_and_optimizer"].append(dt - clock["gen_and_score"] - clock["loss_forward"])

        def on_log(self, _args, state, _control, logs=None, **_kw):
            if logs and "completions/mean_length" in logs and state.global_step > a.warmup:
                rec["generated_tokens"].append(logs["completions/mean_length"] * a.prompts * a.samples)

    trainer.add_callback(Steps())
    trainer.train()
    out = {k: med(v) for k, v in rec.items() if v}
    if rec["generated_tokens"]:
        out["generate_tokens_per_s"] = med([n / t for n, t in zip(rec["generated_tokens"], rec["generate"])])
    import trl

    out["version"] = trl.__version__
    return {**out, **memory(device)}


def part_profile(a) -> dict:
    """torch.profiler over one nanorl step (rollout + an update of every row): the top operators by self time."""
    from torch.profiler import ProfilerActivity, profile

    from nanorl.learner import optimizer_step

    cfg, run, examples, opt, sched = nanorl_run(a)
    gpu = run.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    key = "self_device_time_total" if gpu else "self_cpu_time_total"
    tables = {}
    for r in range(2):  # a warm-up step, then the profiled one
        with profile(activities=acts) as prof:
            t = time.perf_counter()
            roll, _, _, _ = nanorl_rollout(cfg, run, examples, r, {"rollout": 0.0, "reward": 0.0, "tokens": 0})
            t_roll = time.perf_counter() - t
        tables["rollout"] = (t_roll, prof.key_averages().table(sort_by=key, row_limit=15))
        adv = torch.randn(len(roll.completion_ids), generator=torch.Generator().manual_seed(r)).sign()
        with profile(activities=acts) as prof:
            t = time.perf_counter()
            nanorl_update(cfg, run, roll, adv)
            optimizer_step(run.policy, opt, sched, cfg.grad_clip)
            t_upd = time.perf_counter() - t
        tables["update"] = (t_upd, prof.key_averages().table(sort_by=key, row_limit=15))
    text = "".join(f"## {k}: {t:.2f} s (profiled)\n\n{tab}\n" for k, (t, tab) in tables.items())
    return {"text": text, "peak_rss_gib": peak_rss_gib()}


PARTS = {
    "roofline": part_roofline,
    "generate": part_generate,
    "nanorl": part_nanorl,
    "trl": part_trl,
    "profile": part_profile,
}


# ---------------------------------------------------------------------------------------------- report
def _by_lib(roof: dict) -> dict:
    """{library: {sweep: FLOP/s}} from the roofline part's {sweep: {library: FLOP/s}}."""
    out: dict = {}
    for sweep, rates in roof.get("flops_per_library", {}).items():
        for lib, r in rates.items():
            out.setdefault(lib, {})[sweep] = r
    return out


def ceiling(n: dict, g: dict, a, N: int, rate: float) -> float:
    """The most a rollout's tokens/s can exceed `generate`'s on this machine: every prompt prefilled once
    and every generated token at the decode roofline (2 N FLOPs a token), nothing else."""
    ideal = 2 * N * (n["rollout_tokens"]["median"] + g["prompt_tokens"] / a.samples) / rate
    return n["rollout_tokens"]["median"] / ideal / g["tokens_per_s"]["median"]


def report(res: dict, a) -> str:
    """The table of docs/speed.md: ratios from this one run."""
    roof_info = res.get("roofline", {})
    lines = [
        f"Commit {res.get('commit', '?')}, {res.get('machine', '?')}. "
        f"Model {a.model}, {roof_info.get('device', '')} {roof_info.get('dtype', '')}, "
        f"{a.prompts} prompts x {a.samples} samples, {a.new_tokens} new tokens, "
        f"{f'LoRA rank {a.lora_r} (alpha 32, every linear projection), ' if a.lora_r else ''}"
        f"{torch.get_num_threads()} threads, medians of {a.reps} (min-max).",
        "",
    ]
    fmt = lambda d: f"{d['median']:.2f} s ({d['min']:.2f}-{d['max']:.2f})"  # noqa: E731
    gib = lambda r: f"{r['peak_rss_gib']:.2f} GiB"  # noqa: E731
    n, g, t, roof = res.get("nanorl"), res.get("generate"), res.get("trl"), res.get("roofline")
    lines += ["| | nanorl | TRL GRPOTrainer | ratio |", "|---|---|---|---|"]
    if n and t:
        step_as_run = n["rollout"]["median"] + n["reward"]["median"] + n["update_as_run"]["median"]
        step_all = n["rollout"]["median"] + n["reward"]["median"] + n["update_all_rows"]["median"]
        rows = [
            ("step, every row trained (the same work)", step_all, t["step"]["median"]),
            ("step, as the loop runs (zero-advantage rows skipped)", step_as_run, t["step"]["median"]),
            (
                "rollout: generation (+ reward and bookkeeping for TRL)",
                n["rollout"]["median"] + n["reward"]["median"],
                t["gen_and_score"]["median"],
            ),
            (
                "update, every row (loss forward + backward + optimizer)",
                n["update_all_rows"]["median"],
                t["loss_forward"]["median"] + t["backward_and_optimizer"]["median"],
            ),
        ]
        lines += [f"| {name} | {x:.2f} s | {y:.2f} s | {x / y:.2f}x |" for name, x, y in rows]
        lines.append(f"| peak resident memory | {gib(n)} | {gib(t)} | {n['peak_rss_gib'] / t['peak_rss_gib']:.2f}x |")
        if "peak_gpu_gib" in n and "peak_gpu_gib" in t:
            lines.append(
                f"| peak GPU memory (allocated) | {n['peak_gpu_gib']:.2f} GiB | {t['peak_gpu_gib']:.2f} GiB | "
                f"{n['peak_gpu_gib'] / t['peak_gpu_gib']:.2f}x |"
            )
    lines.append("")
    if n and g:
        lines.append(
            f"- Rollout against plain `generate` for the same {a.prompts * a.samples} rows: nanorl "
            f"{n['rollout_tokens_per_s']['median']:.0f} tokens/s, generate {g['tokens_per_s']['median']:.0f} "
            f"tokens/s ({n['rollout_tokens_per_s']['median'] / g['tokens_per_s']['median']:.2f}x); generate "
            f"took {fmt(g['time'])}, of which its prefill {g['prefill_time']['median']:.2f} s."
        )
    if roof and n:
        N, fl = roof["matmul_params"], roof["flops"]
        big, small = fl["update_m512_fwd_bwd"]["median"], fl["decode_m64_fwd"]["median"]
        ideal_update = 6 * N * n["update_tokens_all_rows"]["median"] / big
        ideal_roll = 2 * N * n["rollout_tokens"]["median"] / small
        libs = "; ".join(
            f"{lib} {r['update_m512_fwd_bwd'] / 1e9:.0f} and {r['decode_m64_fwd'] / 1e9:.0f}"
            for lib, r in _by_lib(roof).items()
        )
        lines.append(
            f"- Matmul roofline ({N / 1e6:.1f}M matmul weights, the faster library for each kind of matmul): "
            f"{big / 1e9:.0f} GFLOP/s at M=512 (forward + backward), {small / 1e9:.0f} GFLOP/s at M=64 (decode) "
            f"[one library alone: {libs}]. nanorl's update of every row processes "
            f"{n['update_tokens_all_rows']['median']:.0f} tokens (padding included): ideal {ideal_update:.2f} s, "
            f"measured {n['update_all_rows']['median']:.2f} s = {ideal_update / n['update_all_rows']['median']:.0%} "
            f"of the roofline. Rollout: {n['rollout_tokens']['median']:.0f} generated tokens, ideal "
            f"{ideal_roll:.2f} s at the decode rate, measured {n['rollout']['median']:.2f} s "
            f"({ideal_roll / n['rollout']['median']:.0%})"
            + (
                f"; with its prefill (each prompt once, {g['prompt_tokens'] / a.samples:.0f} tokens) at the "
                f"same rate, no rollout can beat `generate` by more than {ceiling(n, g, a, N, small):.1f}x here"
                if g
                else ""
            )
            + "."
        )
        if t and "loss_tokens" in t:
            ideal_t = 6 * N * t["loss_tokens"]["median"] / big
            upd_t = t["loss_forward"]["median"] + t["backward_and_optimizer"]["median"]
            lines.append(
                f"- TRL's update processes {t['loss_tokens']['median']:.0f} tokens: ideal {ideal_t:.2f} s, "
                f"measured {upd_t:.2f} s = {ideal_t / upd_t:.0%} of the roofline."
            )
    if roof and "peak_flops" in roof:  # on a GPU: model FLOPs utilisation against the chip's measured peak
        N, P = roof["matmul_params"], roof["peak_flops"]
        mfu = lambda flops, secs: f"{flops / secs / 1e12:.1f} TFLOP/s = {flops / secs / P:.1%} MFU"  # noqa: E731
        parts = []
        if n:
            parts += [
                f"nanorl rollout {n['rollout_tokens_per_s']['median']:.0f} tokens/s "
                f"({mfu(2 * N * n['rollout_tokens']['median'], n['rollout']['median'])}), update of every row "
                f"{mfu(6 * N * n['update_tokens_all_rows']['median'], n['update_all_rows']['median'])}"
            ]
        if g:
            parts += [f"`generate` {g['tokens_per_s']['median']:.0f} tokens/s"]
        if t and "loss_tokens" in t:
            upd_t = t["loss_forward"]["median"] + t["backward_and_optimizer"]["median"]
            parts += [
                f"TRL update {mfu(6 * N * t['loss_tokens']['median'], upd_t)}"
                + (
                    f", generation {t['generate_tokens_per_s']['median']:.0f} tokens/s"
                    if "generate_tokens_per_s" in t
                    else ""
                )
            ]
        lines.append(
            f"- {roof.get('gpu', 'GPU')}: measured bf16 peak {P / 1e12:.0f} TFLOP/s (8192^3 product); "
            + "; ".join(parts)
            + " (model FLOPs: 2N per generated token, 6N per trained token)."
        )
    for part, why in res.get("failed", {}).items():
        lines.append(f"- Part '{part}' failed and is left out: {' '.join(why)[:300]}")
    return "\n".join(lines) + "\n"


def main() -> None:
    from nanorl.config import GRPOConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="roofline,generate,nanorl,trl,profile")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--reps", type=int, default=3, help="timed steps per part (after the warm-up)")
    p.add_argument("--prompts", type=int, default=8, help="distinct prompts per step")
    p.add_argument("--samples", type=int, default=8, help="completions per prompt (the group size)")
    p.add_argument("--new-tokens", type=int, default=32, help="max new tokens per completion")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--micro-batch-size",
        type=int,
        default=GRPOConfig.micro_batch_size,
        help="nanorl's rows per forward/backward (default: the config default)",
    )
    p.add_argument("--device", default="auto", help="auto (cuda + bf16 if present, else cpu + fp32) | cpu | cuda")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank for nanorl and TRL alike (0 = full fine-tuning)")
    p.add_argument("--out", default="results/speed")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)  # internal: run one part, print JSON
    a = p.parse_args()
    if a.worker:
        print("RESULT " + json.dumps(PARTS[a.worker](a)))
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:  # no git (a copied tree)
        commit = ""
    commit = commit or os.environ.get("NANORL_COMMIT", "unknown")
    res = {
        "commit": commit,
        "machine": f"{cpu_identity()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
    }
    for part in a.parts.split(","):
        if part not in PARTS:
            raise SystemExit(f"--parts: unknown part '{part}' (choose from {', '.join(PARTS)})")
        t = time.perf_counter()
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            part,
            "--model",
            a.model,
            "--reps",
            str(a.reps),
            "--warmup",
            str(a.warmup),
            "--device",
            a.device,
            "--micro-batch-size",
            str(a.micro_batch_size),
            "--prompts",
            str(a.prompts),
            "--samples",
            str(a.samples),
            "--new-tokens",
            str(a.new_tokens),
            "--lora-r",
            str(a.lora_r),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode or line is None:  # e.g. TRL not installed: the other parts still report
            sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
            print(f"[speed] part '{part}' FAILED (exit {proc.returncode}); left out of the table", flush=True)
            res.setdefault("failed", {})[part] = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            continue
        res[part] = json.loads(line[len("RESULT ") :])
        if part == "profile":
            (out / "profile_nanorl.txt").write_text(res[part].pop("text"))
        print(f"[speed] {part}: {time.perf_counter() - t:.0f} s", flush=True)
        (out / "speed.json").write_text(json.dumps(res, indent=2))
    table = report(res, a)
    (out / "table.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()

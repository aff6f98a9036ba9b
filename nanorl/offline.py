"""The loop shared by the offline trainers (DPO, SFT, reward model): optimizer steps -> micro-batches.

Each trainer supplies `micro_loss(rows) -> (summed loss, summed stats)` over a few rows and
`run_eval() -> held-out metrics`; the loop divides by a count of the whole batch (rows, or tokens for
SFT), so the gradient is the same for any micro_batch_size, steps the optimizer, logs, evaluates
(adding a task's greedy accuracy for DPO and SFT), checkpoints, and saves the final model. Stats are
reported as means per row. The steps are one flat range over (epoch, batch): a step's rows follow from
the step alone (epoch = step // batches per epoch, each epoch's shuffle seeded by it), so a run resumed
from its checkpoint (--resume) continues exactly where it stopped, and SIGINT / SIGTERM stop it cleanly
(checkpoint.stoppable).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from nanorl import checkpoint, distributed
from nanorl.backends import Backend, select_backend
from nanorl.config import OfflineConfig, to_dict, validate
from nanorl.data import Text, chunks
from nanorl.evaluate import evaluate
from nanorl.hub import model_source
from nanorl.learner import count_bad_steps, make_optimizer, optimizer_step
from nanorl.logger import make_logger
from nanorl.logprobs import AUTO
from nanorl.models import load_model, resolve_device, stop_token_ids, trainable
from nanorl.sampling import LocalSampler, SamplingParams
from nanorl.seeds import derive_seed


def setup(cfg: OfflineConfig, name: str, load=load_model, prompts=()):
    """Validate, seed, open the run folder, load the model on its device: `load(cfg.model)`, or with cfg.resume
    the weights of out_dir/checkpoint, which check_resume has found; config.json says whether the rows' prompts
    (Pairs) go through the chat template. -> model, tok, device, backend, logger."""
    validate(cfg)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    device = distributed.init(resolve_device(cfg.device), cfg)  # under torchrun: join the process group
    backend, dtype = select_backend(cfg.backend, cfg.dtype, device, cfg.grad_checkpointing, cfg.strategy)
    backend.prepare(device)
    out, ckpt = Path(cfg.out_dir), Path(cfg.out_dir) / "checkpoint"
    checkpoint.lock(out)  # one run per folder, before anything in it is read or removed
    resuming = checkpoint.check_resume(cfg, ckpt)  # refuses a resume that cannot continue this run
    model, tok = distributed.load(
        load, str(ckpt) if resuming else cfg.model, device, dtype, cfg
    )  # LoRA: base + adapter
    # LoRA when cfg.lora_r > 0; eval mode, no dropout: the reference pass and the update see the same function
    model = distributed.shard(trainable(model, cfg, "CAUSAL_LM" if load is load_model else "SEQ_CLS"), cfg).eval()
    logger = make_logger(out, cfg.report_to, append=resuming, config=cfg)
    if distributed.is_main():
        source = model_source(cfg.model)  # a GGUF's weights: dequantized, not the hub checkpoint's
        text = Text.note if any(isinstance(p.prompt, Text) for p in prompts) else ""
        notes = {k: v for k, v in (("_model_source", source), ("_prompts", text)) if v}
        (out / "config.json").write_text(json.dumps({**to_dict(cfg), **notes}, indent=2))
        print(f"[nanorl] {name} config: {json.dumps(to_dict(cfg))}")
        for what, v in ((f"model {cfg.model}", source), ("prompts", text)):
            if v:
                print(f"[nanorl] {what}: {v}")
    return model, tok, device, backend, logger


def describe_rows(cfg: OfflineConfig, train_rows: list, eval_rows: list, kind: str) -> None:
    """Print how many rows train and how many are held out, and how many were cut (the main process)."""
    if distributed.is_main():
        print(
            f"[nanorl] {len(train_rows)} train / {len(eval_rows)} held-out {kind} from {cfg.data}; "
            f"{sum(r['cut'] for r in train_rows)} cut to max_length {cfg.max_length}"
        )


def fit(
    cfg: OfflineConfig,
    model,
    tok,
    rows: list,
    micro_loss,
    run_eval,
    logger,
    name: str,
    normaliser=len,
    task=None,
    backend: Backend = AUTO,
    state: dict | None = None,
    load=load_model,
) -> dict:
    """normaliser(batch rows) is what the batch loss divides by: rows (default) or, for SFT, tokens. With a
    `task` (DPO, SFT) each evaluation also measures the greedy accuracy on its held-out prompts. `state`: the
    trainer's own, saved in every checkpoint beside the optimizer's (DPO: the reference log-probs). `load`: how
    the model's base is read (setup's), for merging a LoRA adapter under FSDP."""
    # ------------------------------------------------------------------ optimizer, resume, first eval
    t_start, out, ckpt = time.perf_counter(), Path(cfg.out_dir), Path(cfg.out_dir) / "checkpoint"
    per_epoch = -(-len(rows) // cfg.batch_size)  # optimizer steps per epoch: a partial last batch is one too
    total = cfg.epochs * per_epoch
    opt, sched = make_optimizer(model, cfg, total)
    start = checkpoint.load_state(ckpt, opt, sched, model)["step"] if cfg.resume else 0  # setup checked it exists
    logger.rewind(start)  # lines a stopped run wrote after its checkpoint are redone below

    def evaluate_and_log(step: int) -> dict:  # the trainer's held-out metrics, then the task's accuracy
        metrics = run_eval()
        if task is not None:
            sampler = LocalSampler(model, stop_token_ids(model, tok), tok.pad_token_id, backend)
            acc, _ = evaluate(sampler, tok, task, SamplingParams(cfg.max_new_tokens), system_prompt=cfg.system_prompt)
            metrics["eval/task_greedy_acc"] = acc["eval/greedy_acc"]
        logger.log_eval(metrics, step)
        if distributed.is_main():
            tqdm.write(f"[nanorl] step {step} eval: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
        return metrics

    def save(done: int) -> None:  # a resumable checkpoint after step `done`
        checkpoint.save(ckpt, model, tok, opt, sched, done, state, keep_last=cfg.keep_last)

    first, last = checkpoint.first_eval(cfg.resume, out, evaluate_and_log, start, total)
    bar = tqdm(
        range(start, total),
        initial=start,
        total=total,
        desc=name,
        dynamic_ncols=True,
        disable=None if distributed.is_main() else True,
    )
    bad_steps = 0  # steps in a row whose updates were skipped for a non-finite gradient
    for step in checkpoint.stoppable(bar, save, ckpt):  # SIGINT / SIGTERM: finish the step, save, stop
        # -------------------------------------------------------------- the batch: from the step alone
        t0 = time.perf_counter()
        epoch, i = divmod(step, per_epoch)
        shuffle = torch.Generator().manual_seed(derive_seed(cfg.seed, epoch, "offline"))  # one order per epoch
        order = torch.randperm(len(rows), generator=shuffle)[i * cfg.batch_size : (i + 1) * cfg.batch_size]
        batch = [rows[j] for j in order.tolist()]

        # -------------------------------------------------------------- forward / backward
        sums: dict = {}
        norm = normaliser(batch)  # a count over the whole batch: micro-batching (and torchrun's sharding) is invisible
        mine = chunks(batch[distributed.share(len(batch))], cfg.micro_batch_size)  # this rank's rows
        for part, weight in distributed.even(model, mine, batch[:1]):  # FSDP: zero-weight fillers pair the passes
            loss, stats = micro_loss(part)
            (loss * weight / norm).backward()
            for k, v in {**stats, "loss": loss.item() * len(batch) / norm}.items():  # the loss reported per row
                sums[k] = sums.get(k, 0.0) + weight * float(v)
        sums = {k: distributed.reduce(v) for k, v in sums.items()}  # every rank's rows
        grad_norm = optimizer_step(model, opt, sched, cfg.grad_clip)  # NaN / inf: the update is skipped

        # -------------------------------------------------------------- log / eval / checkpoint
        metrics = {
            "epoch": epoch,
            **{f"train/{k}": v / len(batch) for k, v in sums.items()},
            "optim/grad_norm": grad_norm,
            "optim/skipped_updates": int(not math.isfinite(grad_norm)),
            "optim/lr": sched.get_last_lr()[0],
            "time/step": time.perf_counter() - t0,
            "time/elapsed": time.perf_counter() - t_start,
        }
        if (step + 1) % cfg.eval_every == 0 or step + 1 == total:
            last = evaluate_and_log(step + 1)
            metrics.update(last)
        logger.log(metrics, step + 1)
        bad_steps = count_bad_steps(metrics["optim/skipped_updates"], bad_steps, cfg.max_bad_steps, step + 1)
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < total:  # the final model: below
            save(step + 1)

    # ------------------------------------------------------------------ finish
    shown = [k for k in last if k.endswith("acc")][:3] or list(last)[:3]
    fmt = ".1%" if shown[0].endswith("acc") else ".3f"  # accuracies as percentages, a loss as it is
    return checkpoint.finish(
        out,
        model,
        tok,
        cfg,
        load,
        logger,
        t_start,
        total,
        first,
        last,
        lambda wall: (
            f"[nanorl] {name} done in {total} steps, {wall / 60:.1f} min: "
            + ", ".join(f"{k} {first[k]:{fmt}} -> {last[k]:{fmt}}" for k in shown)
            + f"; model saved to {out / 'model'}"
        ),
    )

"""Checkpoints in Hugging Face format (from_pretrained loads them) plus the trainer state to resume, and the run
folder's safety: one run per folder, and a stop on SIGINT / SIGTERM that writes a checkpoint first.

    out_dir/checkpoint/           latest resumable checkpoint: model + tokenizer + trainer_state.pt (+ critic/ for PPO)
    out_dir/checkpoint-step<N>/   older ones, with keep_last > 1
    out_dir/model/                the final model, with results.json beside it (finish)
    lock(out_dir)                 a second run on the folder is refused while this process lives
    for step in stoppable(range(...), save): ...   # a signal ends the step, saves, raises Interrupted
    resuming = check_resume(cfg, out_dir / "checkpoint")  # --resume checked; a new run drops an old checkpoint
Writes go to a temporary folder, renamed whole to checkpoint.new, then swapped in (checkpoint -> checkpoint.old,
.new -> checkpoint): a process stopped at any instant, kill -9 included, leaves a whole checkpoint that --resume
finds (recover).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import threading
import time
from pathlib import Path

import torch

from nanorl import distributed
from nanorl.config import to_dict
from nanorl.errors import ConfigError


def save(path: Path, model, tok, opt=None, sched=None, step=0, extra=None, models=None, keep_last=1, optimizers=None):
    """Write the model, tokenizer, other `models` (e.g. {"critic": critic}, each in its own subfolder: all of them
    are replaced in one rename) and, with `opt`, the trainer state, with other `optimizers` {key: (model, opt)}
    beside `opt`'s; keep_last > 1 keeps the previous checkpoints as checkpoint-step<N>. Only the main process
    writes; under FSDP every rank first gathers the full weights (onto the main process) and writes its shards of
    the optimizer states."""
    path = Path(path)
    tmp, new, old = (path.with_name(path.name + end) for end in (".tmp", ".new", ".old"))
    if distributed.is_main():
        shutil.rmtree(tmp, ignore_errors=True)
    weights = {name: distributed.full_state_dict(m) for name, m in {".": model, **(models or {})}.items()}
    optims = {"optimizer": (model, opt), **(optimizers or {})} if opt is not None else {}
    optim = {key: distributed.optimizer_state(m, o, tmp / key) for key, (m, o) in optims.items()}
    if not distributed.is_main():
        return
    try:
        _write(tmp, model, tok, optim, sched, step, extra, models, weights)
    except (OSError, RuntimeError) as e:  # a full disk surfaces as torch's "file write failed": say so
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(path.parent).free / 2**30
        why = f"{free:.2f} GiB free on its disk" + (": no space left" if free < 1 else "")
        raise OSError(f"writing the checkpoint {path} failed ({why}); the previous checkpoint is intact: {e}") from e
    shutil.rmtree(new, ignore_errors=True)
    tmp.rename(new)  # whole: a save stopped from here on (kill -9) is finished by recover() on resume
    swap(new, path, old)
    if keep_last > 1 and (old / "step").is_file():
        old.rename(path.with_name(f"{path.name}-step{(old / 'step').read_text()}"))
        older = sorted(path.parent.glob(f"{path.name}-step*"), key=lambda d: int(d.name.split("-step")[1]))
        for stale in older[: -(keep_last - 1)]:
            shutil.rmtree(stale)
    shutil.rmtree(old, ignore_errors=True)


def swap(new: Path, path: Path, old: Path) -> None:
    """The checkpoint `new` takes the place of `path`, which becomes `old` (two renames)."""
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    new.rename(path)


def recover(path: Path) -> None:
    """Finish a save that was stopped between its renames (kill -9, power loss): the newest whole checkpoint becomes
    `path`, the new one (.new) if it was written, else the previous one (.old). Every process waits for it."""
    new, old = path.with_name(path.name + ".new"), path.with_name(path.name + ".old")
    if distributed.is_main() and new.is_dir():
        swap(new, path, old)
    elif distributed.is_main() and old.is_dir() and not path.exists():
        old.rename(path)
    distributed.reduce(0)


def _write(tmp: Path, model, tok, optim, sched, step: int, extra: dict | None, models: dict | None, weights) -> None:
    """Everything a checkpoint holds, into the folder `tmp`; `weights`: each model's state dict (None: its own)."""
    for name, m in {".": model, **(models or {})}.items():  # each loadable on its own, with the tokenizer
        # a peft adapter alone; without save_embedding_layers peft looks its base model up on the hub
        m.save_pretrained(
            tmp / name,
            state_dict=weights[name],
            **({"save_embedding_layers": False} if hasattr(m, "peft_config") else {}),
        )
        tok.save_pretrained(tmp / name)
    (tmp / "step").write_text(str(step))
    if optim:
        state = {
            "step": step,
            **optim,
            "scheduler": sched.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            **(extra or {}),
        }
        torch.save(state, tmp / "trainer_state.pt")


def save_final(path: Path, model, tok, merge_lora: bool = True, load_base=None) -> None:
    """The final model: as it is, or for a LoRA run the adapter merged into its base (or the adapter alone). Under
    FSDP no process holds the whole model to merge: the adapter is written, and the main process reads it back
    onto its CPU with its base (`load_base(name, device, dtype)`, as lora.load_adapter takes it) and merges."""
    if hasattr(model, "peft_config") and merge_lora and distributed.sharded(model):
        from nanorl.integrations.lora import load_adapter

        save(path, model, tok)
        dtype = next(model.parameters()).dtype
        model = (
            load_adapter(path, "cpu", dtype, load_base, trainable=False)[0].merge_and_unload()
            if distributed.is_main()
            else None
        )
    elif hasattr(model, "peft_config") and merge_lora:
        model = model.merge_and_unload()  # the run is over: the adapters' wrappers are no longer needed
    save(path, model, tok)


def finish(
    out: Path, model, tok, cfg, load, logger, t_start: float, steps: int, first: dict, last: dict, summary
) -> dict:
    """The end of every run: the final model (save_final; `load` reads a LoRA merge's base), results.json (before /
    after) and the line summary(wall seconds) from the main process; then the run folder is closed and unlocked."""
    save_final(Path(out) / "model", model, tok, cfg.merge_lora, load)
    result = {"steps": steps, "wall_s": time.perf_counter() - t_start, "before": first, "after": last}
    if distributed.is_main():
        (Path(out) / "results.json").write_text(json.dumps(result, indent=2))
        print(summary(result["wall_s"]), flush=True)
    logger.close()
    unlock(out)
    distributed.finish()
    return result


def load_state(path: Path, opt, sched, model=None) -> dict:
    """Restore optimizer, schedule and RNG from `path`; returns the saved state (with 'step'). FSDP: give `model`."""
    state = torch.load(Path(path) / "trainer_state.pt", weights_only=False, map_location="cpu")  # then to each device
    distributed.load_optimizer_state(model, opt, state["optimizer"], path)
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return state


# keys a resumed run may change: where it stops and what it reports, not what it computes
RESUMABLE_CHANGES = set("resume steps save_every keep_last eval_every report_to max_bad_steps device backend".split())
RESUMABLE_CHANGES |= {"grad_checkpointing", "strategy"}


def check_resume(cfg, ckpt: Path) -> bool:
    """Whether the run resumes from `ckpt` (then cfg.resume is true). --resume without a checkpoint, or with a
    config that differs from the stopped run's in a key that changes what is computed, is an error; a new run
    into a folder that holds an old checkpoint removes it, so that no later resume picks it up."""
    saved = ckpt.parent / "config.json"
    if cfg.resume:
        recover(ckpt)
        if not (ckpt / "trainer_state.pt").is_file():  # a resumable checkpoint: one with trainer state
            raise ConfigError(
                f"config key 'resume': no checkpoint to resume from in {ckpt} (write one with "
                f"save_every, or start a new run without --resume)"
            )
        old = json.loads(saved.read_text()) if saved.is_file() else {}
        changed = sorted(k for k, v in to_dict(cfg).items() if k in old and old[k] != v and k not in RESUMABLE_CHANGES)
        if changed:
            raise ConfigError(
                f"config keys {changed}: differ from the run being resumed ({saved}); resume with the "
                f"same values or start a new run in another out_dir"
            )
        if (done := int((ckpt / "step").read_text())) > getattr(cfg, "steps", done):  # it would report a wrong end
            raise ConfigError(
                f"config key 'steps': {cfg.steps} is below the step of the checkpoint being resumed "
                f"({done}, in {ckpt}); resume with --steps {done} or more"
            )
        return True
    if distributed.is_main():
        for old in (ckpt, *ckpt.parent.glob(ckpt.name + "-step*"), *ckpt.parent.glob(ckpt.name + ".*")):
            shutil.rmtree(old, ignore_errors=True)  # a new run: an old checkpoint here (or a save's part) is not its
    return False


def first_eval(resuming: bool, out: Path, evaluate_at, start: int, total: int) -> tuple[dict, dict]:
    """The "before" numbers, the first evaluation of the run, and the latest ones: on resume both read back from
    eval.jsonl, else evaluate_at(start) now. A resumed run with no step left (stopped in its last step, or given
    fewer steps) whose latest evaluation is older than its weights evaluates them now: that is its "after"."""
    lines = (out / "eval.jsonl").read_text().splitlines() if resuming and distributed.is_main() else []
    prior = distributed.gather_objects([[json.loads(x) for x in lines]])[0]  # the main process's reading, every rank
    first, last = (prior[0], prior[-1]) if prior else [evaluate_at(start)] * 2
    last = evaluate_at(start) if prior and start >= total and last.get("step", start) < start else last
    return tuple({k: v for k, v in e.items() if k != "step"} for e in (first, last))


HELD: dict[Path, list[int]] = {}  # run folders this process holds the lock of -> their open lock files


def lock(out: Path) -> None:
    """Take the run folder's lock for the rest of this process: another process starting a run on the same folder
    is refused. The kernel drops the lock when the process ends, however it ends; this process may take it again."""
    if not distributed.is_main():
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(out) / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode() or "?"
        os.close(fd)
        raise ConfigError(
            f"config key 'out_dir': {out} is in use by another nanorl run (pid {holder}); "
            f"wait for it to finish or use another out_dir"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    HELD.setdefault(Path(out).resolve(), []).append(fd)  # open until unlock(out) at the run's end, or the process's


def unlock(out: Path) -> None:
    """Let other processes run in `out` again (a finished run); closing the descriptors drops the lock."""
    for fd in HELD.pop(Path(out).resolve(), []):
        os.close(fd)


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM after writing its checkpoint."""

    def __init__(self, signum: int, step: int, path: Path):
        self.signum = signum
        super().__init__(
            f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint written to {path}: "
            f"run the same command with --resume true to continue"
        )


def stoppable(steps, save, path: Path):
    """The loop's steps. On SIGINT or SIGTERM the step under way finishes, `save(step)` writes a checkpoint and
    Interrupted is raised; a second Ctrl-C stops at once. The signal handlers are the run's only while it runs."""
    caught: list[int] = []

    def handler(signum, frame):
        if caught and signum == signal.SIGINT:
            raise KeyboardInterrupt
        caught.append(signum)

    main_thread = threading.current_thread() is threading.main_thread()
    before = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    try:
        for step in steps:
            yield step
            if distributed.reduce(len(caught), "max"):  # under torchrun every rank stops after the same step
                save(step + 1)
                raise Interrupted((caught or [signal.SIGTERM])[0], step + 1, path)
    finally:
        for s, h in before.items():
            signal.signal(s, h)

"""Checkpoints in Hugging Face format (from_pretrained loads them) plus the trainer state to resume.

    out_dir/checkpoint/   latest resumable checkpoint: model + tokenizer + trainer_state.pt
    out_dir/model/        the final model
Writes go to a temporary folder that is renamed into place, so an interrupt never leaves a broken one.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch

from nanorl import distributed


def exists(path: Path) -> bool:
    """Whether `path` holds a resumable checkpoint (one with trainer state)."""
    return (Path(path) / "trainer_state.pt").is_file()


def save(path: Path, model, tok, opt=None, sched=None, step: int = 0, extra: dict | None = None) -> None:
    """Write the model, tokenizer and (with `opt`) the trainer state; only the main process writes."""
    if not distributed.is_main():
        return
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # a peft adapter alone; without save_embedding_layers peft looks its base model up on the hub
    model.save_pretrained(tmp, **({"save_embedding_layers": False} if hasattr(model, "peft_config") else {}))
    tok.save_pretrained(tmp)
    if opt is not None:
        state = {"step": step, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                 "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(), **(extra or {})}
        torch.save(state, tmp / "trainer_state.pt")
    old = path.with_name(path.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def save_final(path: Path, model, tok, merge_lora: bool = True) -> None:
    """The final model: as it is, or for a LoRA run the adapter merged into its base (or the adapter alone)."""
    if hasattr(model, "peft_config") and merge_lora:
        model = model.merge_and_unload()  # the run is over: the adapters' wrappers are no longer needed
    save(path, model, tok)


def load_state(path: Path, opt, sched) -> dict:
    """Restore optimizer, schedule and RNG from `path`; returns the saved state (with 'step')."""
    state = torch.load(Path(path) / "trainer_state.pt", weights_only=False)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return state

"""Data parallel training under `torchrun`: the rank helpers every run uses (a plain run is rank 0 of 1).

    torchrun --nproc_per_node 2 -m nanorl.cli train --model tiny      # 2 processes, one training, one run folder

A plain run is one process: rank 0 of 1, and every function below is the identity. Under torchrun (WORLD_SIZE
> 1) `init` joins the process group (nccl on GPUs, gloo on CPU) and each rank takes its contiguous share of each
step's prompts (`share`): it samples, scores and backpropagates only those. What must count the whole batch is
made global here: rewards and lengths are gathered (`gather`), so advantages, metrics and the loss normalisers
are the single-process ones; gradients are summed over ranks once per optimizer step (`all_reduce_grads`), so
two processes take the same step as one process on the same global batch (tests/test_distributed.py). Only the
main process (rank 0) writes logs, samples, checkpoints and the final model.

With `strategy: fsdp` (FSDP2) each rank also keeps only 1/N of every weight, gradient and AdamW state. That is a
plugin, backends/fsdp.py, loaded only under fsdp: the functions at the end of this file (load, shard, full_weights,
full_state_dict, optimizer_state, load_optimizer_state) do the plain thing without it and hand over to it with it.
`even` keeps every rank's update passes paired (docs/scaling.md).

Why not the DistributedDataParallel wrapper: it reduces gradients inside each backward and needs every rank to
run the same number of backwards with the same parameters used. Here ranks differ in both (rows with zero
advantage or a truncated completion are skipped, a prompt forward and a completion forward feed one backward),
and the CPU backend writes weight gradients in place, past autograd's hooks. One all-reduce of the accumulated
gradients before the optimizer step is what DDP's gradient accumulation (no_sync) does, without those limits.
"""

from __future__ import annotations

import datetime
import os
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist

from nanorl.errors import ConfigError

# The process group this module joined (then `finish` leaves it), as its side group for waits on the main process
# alone under FSDP (the model's load, the final model's write and LoRA merge into its base read back from disk):
# gloo with a long timeout, where a collective on nccl's default group gives up after 10 minutes. Under ddp: None
# (every rank loads and merges its own copy; no gloo connection between nodes is asked of a ddp run).
STARTED: list = []
LONG_WAIT = datetime.timedelta(hours=4)


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if initialized() else 1


def is_main() -> bool:
    return rank() == 0


def init(device: torch.device, cfg=None) -> torch.device:
    """Join torchrun's process group (once per process) and check that `cfg` can run in it -> this rank's
    device: cuda:LOCAL_RANK on GPUs."""
    sharding = getattr(cfg, "strategy", "ddp") == "fsdp" and "LOCAL_RANK" in os.environ  # torchrun, even 1 process
    if (int(os.environ.get("WORLD_SIZE", "1")) > 1 or sharding) and not initialized():
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        STARTED.append(dist.new_group(backend="gloo", timeout=LONG_WAIT) if sharding else None)
    if cfg is not None and (world_size() > 1 or getattr(cfg, "strategy", "ddp") != "ddp"):
        check(cfg)
    return device


def check(cfg) -> None:
    """What does not run in several processes yet, refused before any model is loaded."""
    if getattr(cfg, "strategy", "ddp") == "fsdp":
        if not initialized():  # under torchrun with one process it runs (a world of one: the GPU check)
            raise ConfigError(
                "config key 'strategy': fsdp shards the model over torchrun's processes; launch with "
                "`torchrun --nproc_per_node N -m nanorl.cli ...`, or use ddp"
            )
    if world_size() == 1:
        return
    if getattr(cfg, "dynamic_sampling", 0):
        raise ConfigError("config key 'dynamic_sampling': not yet under torchrun (run DAPO in one process)")
    if hasattr(cfg, "prompts_per_step") and cfg.prompts_per_step % world_size():  # equal shares of each step
        raise ConfigError(
            f"config key 'prompts_per_step': {cfg.prompts_per_step} must be divisible by the "
            f"{world_size()} processes of torchrun"
        )


def share(n: int) -> slice:
    """This rank's contiguous share of n items (sizes differ by at most one when the world size does not divide n)."""
    return slice(rank() * n // world_size(), (rank() + 1) * n // world_size())


def comm_device() -> torch.device:
    """Where collectives' tensors must live: the rank's GPU under nccl, the CPU under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def gather(x: torch.Tensor) -> torch.Tensor:
    """Every rank's x (equal shapes) concatenated along dim 0 in rank order: the global batch, on x's device."""
    if world_size() == 1:
        return x
    y = x.contiguous().to(comm_device())
    parts = [torch.empty_like(y) for _ in range(world_size())]
    dist.all_gather(parts, y)
    return torch.cat(parts).to(x.device)


def gather_objects(items: list) -> list:
    """Every rank's list concatenated in rank order (any picklable items)."""
    if world_size() == 1:
        return items
    out: list = [None] * world_size()
    dist.all_gather_object(out, items)
    return [x for part in out for x in part]


def reduce(value: float, op: str = "sum") -> float:
    """A number summed (or op = "min" / "max") over ranks."""
    if world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=comm_device())
    dist.all_reduce(t, {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
    return int(t.item()) if isinstance(value, int) else t.item()


def all_reduce_grads(model) -> None:
    """Sum the accumulated gradients over ranks, in place. A parameter no rank gave a gradient keeps None (AdamW
    skips it, as in one process); one some rank did not reach gets zeros there first. FSDP did it already: each
    backward reduce-scatters every layer's gradient into the shards."""
    if world_size() == 1 or sharded(model):
        return
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
    dist.all_reduce(has)
    pending = []
    for p, anywhere in zip(params, has.tolist()):
        if anywhere:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            pending.append(dist.all_reduce(p.grad, async_op=True))
    for work in pending:
        work.wait()


def even(model, batches: list, filler) -> list[tuple]:
    """(micro-batch, weight) pairs for the update: weight 1 for each of `batches`; under FSDP, as many as the
    rank with the most, the missing ones `filler` with weight 0 (every rank must run the same forwards and
    backwards: each gathers and reduce-scatters every layer). Without FSDP a rank with none runs one filler when
    another rank has some: it then reports the same statistics (the same collectives) as the others, e.g. when an
    offline batch has fewer rows than there are processes; when no rank has any (every row of a minibatch
    filtered out), none runs, and the optimizer skips the step as in one process. A zero-weight loss adds
    exactly zero gradient and statistics."""
    most = int(reduce(len(batches), "max"))
    count = most if sharded(model) else max(len(batches), min(most, 1))
    return [(b, 1.0) for b in batches] + [(filler, 0.0)] * (count - len(batches))


def spread(model, parts: list, fn) -> list:
    """[fn(part) for part in parts] (e.g. the held-out micro-batches), each rank computing only its contiguous
    share of them, -> every result, in order, on every rank (fn's results: CPU tensors or numbers). Under FSDP a
    rank with fewer parts repeats parts[0] (every rank runs as many forwards) and drops those results."""
    mine = parts[share(len(parts))]
    return gather_objects([fn(part) for part, _ in even(model, mine, parts[0] if parts else None)][: len(mine)])


def finish() -> None:
    """Leave the process group at the end of a run, if `init` joined it (not one the caller set up)."""
    if initialized() and STARTED:
        dist.barrier(group=STARTED[0])  # fsdp: the main process may still be writing and merging the final model
        dist.destroy_process_group()
        STARTED.clear()


# ---------------------------------------------------------------------------- FSDP2 (strategy fsdp): backends/fsdp.py


def fsdp(cfg) -> bool:
    return getattr(cfg, "strategy", "ddp") == "fsdp"


def sharded(model) -> bool:
    """Whether `model` is sharded by FSDP2 (backends/fsdp.py shard). A run that never imported FSDP has none."""
    fsdp_module = sys.modules.get("torch.distributed.fsdp")
    return fsdp_module is not None and isinstance(model, fsdp_module.FSDPModule)


def load(load_fn, name: str, device, dtype, cfg):
    """load_fn(name, device, dtype) -> (model, tokenizer); under FSDP by the main process alone (fsdp.load). The
    chat template reads cfg.chat_template_kwargs (models.with_chat_kwargs)."""
    from nanorl.models import with_chat_kwargs

    if not fsdp(cfg):
        return with_chat_kwargs(*load_fn(name, device, dtype), cfg)
    from nanorl.backends import fsdp as plugin

    own = world_size() > 1 and (not STARTED or STARTED[0] is None)  # no side group (a caller's process group)
    group = dist.new_group(backend="gloo", timeout=LONG_WAIT) if own else (STARTED or [None])[0]
    try:
        return with_chat_kwargs(*plugin.load(load_fn, name, dtype, group), cfg)
    finally:
        if own:
            dist.destroy_process_group(group)


def shard(model, cfg):
    """The model, sharded over the processes under FSDP (fsdp.shard); else as it is."""
    if model is None or not fsdp(cfg):
        return model
    from nanorl.backends import fsdp as plugin

    return plugin.shard(model, cfg)


def full_weights(model):
    """A block in which a sharded model's weights are whole on every rank (fsdp.full_weights); else nothing."""
    if not sharded(model):
        return nullcontext(model)
    from nanorl.backends import fsdp as plugin

    return plugin.full_weights(model)


def full_state_dict(model) -> dict | None:
    """A sharded model's full weights on the main process (fsdp.full_state_dict); else None (the model's own)."""
    if not sharded(model):
        return None
    from nanorl.backends import fsdp as plugin

    return plugin.full_state_dict(model)


def optimizer_state(model, opt, folder):
    """The optimizer's state for trainer_state.pt; under FSDP written as shards into `folder` (fsdp.optimizer_state)."""
    if not sharded(model):
        return opt.state_dict()
    from nanorl.backends import fsdp as plugin

    return plugin.optimizer_state(model, opt, folder)


def load_optimizer_state(model, opt, state: dict, checkpoint) -> None:
    """Restore what `optimizer_state` saved, under either strategy and at any number of processes."""
    if "sharded" not in state and not sharded(model):
        return opt.load_state_dict(state)
    from nanorl.backends import fsdp as plugin

    plugin.load_optimizer_state(model, opt, state, checkpoint)

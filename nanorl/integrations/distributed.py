"""Data parallel training under `torchrun`: every rank logic of a run lives here.

    torchrun --nproc_per_node 2 -m nanorl.cli train --model tiny      # 2 processes, one training, one run folder

A plain run is one process: rank 0 of 1, and every function below is the identity. Under torchrun (WORLD_SIZE
> 1) `init` joins the process group (nccl on GPUs, gloo on CPU) and each rank takes its contiguous share of each
step's prompts (`share`): it samples, scores and backpropagates only those. What must count the whole batch is
made global here: rewards and lengths are gathered (`gather`), so advantages, metrics and the loss normalisers
are the single-process ones; gradients are summed over ranks once per optimizer step (`all_reduce_grads`), so
two processes take the same step as one process on the same global batch (tests/test_distributed.py). Only the
main process (rank 0) writes logs, samples, checkpoints and the final model.

With `strategy: fsdp` (FSDP2, `shard`) each rank also keeps only 1/N of every weight, gradient and AdamW state;
the rest of this file's FSDP section keeps every rank's collectives paired (`full_weights` for sampling and
evaluation, `even` for the update's micro-batches) and writes checkpoints from the shards (docs/scaling.md).

Why not the DistributedDataParallel wrapper: it reduces gradients inside each backward and needs every rank to
run the same number of backwards with the same parameters used. Here ranks differ in both (rows with zero
advantage or a truncated completion are skipped, a prompt forward and a completion forward feed one backward),
and the CPU backend writes weight gradients in place, past autograd's hooks. One all-reduce of the accumulated
gradients before the optimizer step is what DDP's gradient accumulation (no_sync) does, without those limits.
"""

from __future__ import annotations

import copy
import datetime
import os
import pickle
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

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
    from nanorl.config import ConfigError

    if getattr(cfg, "strategy", "ddp") == "fsdp":
        if not initialized():  # under torchrun with one process it runs (a world of one: the GPU check)
            raise ConfigError("config key 'strategy': fsdp shards the model over torchrun's processes; launch with "
                              "`torchrun --nproc_per_node N -m nanorl.cli ...`, or use ddp")
    if world_size() == 1:
        return
    if getattr(cfg, "dynamic_sampling", 0):
        raise ConfigError("config key 'dynamic_sampling': not yet under torchrun (run DAPO in one process)")
    if hasattr(cfg, "prompts_per_step") and cfg.prompts_per_step % world_size():  # equal shares of each step
        raise ConfigError(f"config key 'prompts_per_step': {cfg.prompts_per_step} must be divisible by the "
                          f"{world_size()} processes of torchrun")


def share(n: int) -> slice:
    """This rank's contiguous share of n items (sizes differ by at most one when the world size does not divide n)."""
    return slice(rank() * n // world_size(), (rank() + 1) * n // world_size())


def _comm_device() -> torch.device:
    """Where collectives' tensors must live: the rank's GPU under nccl, the CPU under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def gather(x: torch.Tensor) -> torch.Tensor:
    """Every rank's x (equal shapes) concatenated along dim 0 in rank order: the global batch, on x's device."""
    if world_size() == 1:
        return x
    y = x.contiguous().to(_comm_device())
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
    t = torch.tensor([value], dtype=torch.float64, device=_comm_device())
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


# ---------------------------------------------------------------------------- FSDP2 (strategy fsdp)


def load(load_fn, name: str, device, dtype, cfg):
    """load_fn(name, device, dtype) -> (model, tokenizer), the way FSDP wants it: onto the CPU (`shard` moves each
    unit to the device as it cuts it, so no device ever holds the whole model), and with several processes by the
    main process alone: the others get the model's skeleton on the meta device (no memory, no file read) and then
    their shards from the main process (`shard`). One copy of the weights in the job instead of one per process
    (on the main process's CPU, beside its shards under gloo: a peak of (1 + 1/N) x the model there). Without
    FSDP: load_fn as it is."""
    if getattr(cfg, "strategy", "ddp") != "fsdp" or world_size() == 1:
        return load_fn(name, "cpu" if getattr(cfg, "strategy", "ddp") == "fsdp" else device, dtype)
    # the others wait for the main process's load, which may download or convert the model: on the side group
    own = not STARTED or STARTED[0] is None  # no side group (a caller's process group): one for this wait
    group = dist.new_group(backend="gloo", timeout=LONG_WAIT) if own else STARTED[0]
    box: list = [None]
    error = None
    if is_main():
        try:
            loaded = load_fn(name, "cpu", dtype)
            box = [(_meta_copy(loaded[0]), loaded[1])]
            pickle.dumps(box)  # what broadcast_object_list does: a model that does not pickle fails here, by name
        except Exception as e:  # the others wait for the skeleton: they raise the same error
            error = e if box[0] is None else RuntimeError(
                f"strategy fsdp: model {name!r} loaded, but its skeleton cannot be sent to the other processes "
                f"({type(e).__name__}: {e}); use --strategy ddp for this model")
            box = [_sendable(error)]
    dist.broadcast_object_list(box, src=0, group=group)
    if own:
        dist.destroy_process_group(group)
    if isinstance(box[0], Exception):
        raise error or box[0]
    return loaded if is_main() else box[0]


def _sendable(e: Exception) -> Exception:
    """`e` if it survives pickling (its type and message reach the other processes), else its text alone."""
    try:
        return pickle.loads(pickle.dumps(e))
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def _meta_copy(model):
    """The model with every parameter and buffer on the meta device: its structure and config, no weights."""
    memo = {id(t): torch.nn.Parameter(torch.empty_like(t, device="meta"), requires_grad=t.requires_grad)
            if isinstance(t, torch.nn.Parameter) else torch.empty_like(t, device="meta")
            for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


def sharded(model) -> bool:
    """Whether `model` is sharded by FSDP2 (`shard`)."""
    return isinstance(model, FSDPModule)


def shard(model, cfg):
    """strategy fsdp: FSDP2's `fully_shard` on each decoder layer (the classes a transformers model names in
    _no_split_modules), then on the whole model (embeddings, final norm, LM head): each rank keeps 1/N of every
    parameter, and so of its gradient and AdamW state. A forward all-gathers a layer just before it runs and frees
    it after; a backward gathers it again and reduce-scatters its gradient, summed (divide factor 1: nanorl's loss
    normalisers count the global batch, as without FSDP). A reward model's or critic's backbone and scalar head
    are units of their own too: nanorl calls them one after the other, never through the root's forward. Under
    peft's wrapper the same, with the frozen base and the adapters sharded alike. With dtype bf16-mixed the
    gathers are bf16 (MixedPrecisionPolicy). Otherwise the model as it is."""
    if model is None or getattr(cfg, "strategy", "ddp") != "fsdp":
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from nanorl.backends import resolve_precision

    full = model.state_dict() if is_main() else {}  # the weights (`load`: the main process alone holds them)
    mesh = init_device_mesh(_comm_device().type, (world_size(),))  # the process group's devices, not a guess
    # bf16-mixed (autocast): the gathered weights in bf16 (half the traffic and memory of fp32 gathers), the
    # gradients reduced in fp32 into the fp32 shards that AdamW steps; otherwise the weights' own dtype
    autocast = resolve_precision(getattr(cfg, "dtype", "float32"), _comm_device())[1]
    mixed = MixedPrecisionPolicy(param_dtype=autocast, reduce_dtype=torch.float32) if autocast else MixedPrecisionPolicy()
    kw = {"mesh": mesh, "reshard_after_forward": True, "mp_policy": mixed}
    names = set(getattr(model, "_no_split_modules", None) or [])
    for layer in [m for m in model.modules() if type(m).__name__ in names]:
        fully_shard(layer, **kw)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # under peft's wrapper
    if hasattr(inner, "score"):  # a value head (reward model, critic): nanorl runs backbone and head one by one
        fully_shard(inner.base_model, **kw)
        fully_shard(inner.score, **kw)
    fully_shard(model, **kw)
    for m in model.modules():
        if isinstance(m, FSDPModule):  # a plain sum (gloo has no PREMUL_SUM for FSDP's scaled reductions)
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    if world_size() > 1:  # every rank's shards from the main process's weights (a skeleton's are allocated first)
        if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            model.to_empty(device=_comm_device())
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        for buffer in model.buffers():  # e.g. rotary frequencies (not in a state dict): unsharded, sent whole
            dist.broadcast(buffer, src=0)
    return model


@contextmanager
def full_weights(model):
    """FSDP: the whole model gathered on every rank (one all-gather per layer, freed at the end) for passes whose
    number of forwards differs between ranks: sampling (each rank stops when its own completions end) and
    evaluation (its shares may differ in size). Per-layer gathers inside them would not pair up across ranks.
    Scoring passes need none: every rank holds as many rows, and token_logprobs runs two forwards per batch.
    Inside another full_weights of the same model, and without FSDP, nothing."""
    modules = []  # the FSDP units to gather: none without FSDP, or when gathered already (plain tensors, no DTensors)
    if sharded(model) and isinstance(next(model.parameters()), DTensor):
        modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield model
    finally:
        for m in modules:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


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
    return gather_objects([fn(part) for part, _ in even(model, mine, parts[0] if parts else None)][:len(mine)])


def full_state_dict(model) -> dict | None:
    """FSDP: the full weights, gathered on every rank (a collective) and kept on rank 0's CPU, without the copies
    of tied weights (as save_pretrained writes them); under LoRA only the trained ones (the adapters, which is
    what peft saves: the frozen base is never gathered). Else None."""
    if not sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    lora = hasattr(model, "peft_config")
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                 ignore_frozen_params=lora))
    names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}  # a tied one once
    return {k: v for k, v in state.items() if k in names}


def optimizer_state(model, opt, folder):
    """The optimizer's state for trainer_state.pt. FSDP: each rank writes its own shards of it into `folder` with
    torch.distributed.checkpoint (a collective; no rank ever holds the whole AdamW state, and it loads back at any
    number of processes), and what is returned names that folder."""
    if not sharded(model):
        return opt.state_dict()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dist.barrier()  # the main process has cleared the checkpoint's temporary folder
    dcp.save({"optimizer": get_optimizer_state_dict(model, opt)}, checkpoint_id=folder)
    return {"sharded": Path(folder).name}


def load_optimizer_state(model, opt, state: dict, checkpoint) -> None:
    """Restore what `optimizer_state` saved in the folder `checkpoint`, under either strategy and at any number of
    processes. FSDP's shards (a folder) are read by torch.distributed.checkpoint into this process's layout:
    its shards under FSDP, the whole state otherwise. A whole state (one process's, or ddp's) is keyed by
    position: under FSDP it is renamed by parameter and each rank keeps its shards of it."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                         set_optimizer_state_dict)

    if "sharded" in state:
        import torch.distributed.checkpoint as dcp

        shards = {"optimizer": get_optimizer_state_dict(model, opt)}  # this process's layout, filled from the files
        dcp.load(shards, checkpoint_id=Path(checkpoint) / state["sharded"])
        return set_optimizer_state_dict(model, opt, shards["optimizer"])
    if not sharded(model):
        return opt.load_state_dict(state)
    names = [n for n, p in model.named_parameters() if p.requires_grad]  # the optimizer's order (make_optimizer)
    whole = {"state": {names[i]: v for i, v in state["state"].items()},
             "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, opt, whole, options=StateDictOptions(full_state_dict=True))


def finish() -> None:
    """Leave the process group at the end of a run, if `init` joined it (not one the caller set up)."""
    if initialized() and STARTED:
        dist.barrier(group=STARTED[0])  # fsdp: the main process may still be writing and merging the final model
        dist.destroy_process_group()
        STARTED.clear()

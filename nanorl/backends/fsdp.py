"""FSDP2 (`strategy: fsdp`): each process keeps 1/N of every weight, gradient and AdamW state. A plugin: the core's
distributed.py hands over to it only under fsdp, so a plain or ddp run never imports it.

    torchrun --nproc_per_node 2 -m nanorl.cli train --model tiny --strategy fsdp

`load` reads the model on the main process alone, `shard` cuts it into units and sends every rank its shards,
`full_weights` gathers it for passes whose number of forwards differs between ranks (sampling, evaluation), and
checkpoints are written from the shards (`full_state_dict`, `optimizer_state`) and read back under either strategy
(`load_optimizer_state`). docs/scaling.md has the measurements.
"""

from __future__ import annotations

import copy
import pickle
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from nanorl.backends import resolve_precision


def is_main() -> bool:
    return dist.get_rank() == 0


def comm_device() -> torch.device:
    """Where collectives' tensors live: the rank's GPU under nccl, the CPU under gloo (as distributed.comm_device)."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def load(load_fn, name: str, dtype, group):
    """load_fn(name, device, dtype) -> (model, tokenizer), the way FSDP wants it: onto the CPU (`shard` moves each
    unit to the device as it cuts it, so no device ever holds the whole model), and with several processes by the
    main process alone: the others get the model's skeleton on the meta device (no memory, no file read) and then
    their shards from the main process (`shard`). One copy of the weights in the job instead of one per process
    (on the main process's CPU, beside its shards under gloo: a peak of (1 + 1/N) x the model there). The others
    wait on `group` (gloo with a long timeout: the main process may download or convert the model)."""
    if dist.get_world_size() == 1:
        return load_fn(name, "cpu", dtype)
    box: list = [None]
    error = None
    if is_main():
        try:
            loaded = load_fn(name, "cpu", dtype)
            box = [(_meta_copy(loaded[0]), loaded[1])]
            pickle.dumps(box)  # what broadcast_object_list does: a model that does not pickle fails here, by name
        except Exception as e:  # the others wait for the skeleton: they raise the same error
            error = (
                e
                if box[0] is None
                else RuntimeError(
                    f"strategy fsdp: model {name!r} loaded, but its skeleton cannot be sent to the other processes "
                    f"({type(e).__name__}: {e}); use --strategy ddp for this model"
                )
            )
            box = [_sendable(error)]
    dist.broadcast_object_list(box, src=0, group=group)
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
    memo = {
        id(t): torch.nn.Parameter(torch.empty_like(t, device="meta"), requires_grad=t.requires_grad)
        if isinstance(t, torch.nn.Parameter)
        else torch.empty_like(t, device="meta")
        for t in [*model.parameters(), *model.buffers()]
    }
    return copy.deepcopy(model, memo)


def shard(model, cfg):
    """strategy fsdp: FSDP2's `fully_shard` on each decoder layer (the classes a transformers model names in
    _no_split_modules), then on the whole model (embeddings, final norm, LM head): each rank keeps 1/N of every
    parameter, and so of its gradient and AdamW state. A forward all-gathers a layer just before it runs and frees
    it after; a backward gathers it again and reduce-scatters its gradient, summed (divide factor 1: nanorl's loss
    normalisers count the global batch, as without FSDP). A reward model's or critic's backbone and scalar head
    are units of their own too: nanorl calls them one after the other, never through the root's forward. Under
    peft's wrapper the same, with the frozen base and the adapters sharded alike. With dtype bf16-mixed the
    gathers are bf16 (MixedPrecisionPolicy). Otherwise the model as it is."""
    full = model.state_dict() if is_main() else {}  # the weights (`load`: the main process alone holds them)
    mesh = init_device_mesh(comm_device().type, (dist.get_world_size(),))  # the process group's devices, not a guess
    # bf16-mixed (autocast): the gathered weights in bf16 (half the traffic and memory of fp32 gathers), the
    # gradients reduced in fp32 into the fp32 shards that AdamW steps; otherwise the weights' own dtype
    autocast = resolve_precision(getattr(cfg, "dtype", "float32"), comm_device())[1]
    mixed = (
        MixedPrecisionPolicy(param_dtype=autocast, reduce_dtype=torch.float32) if autocast else MixedPrecisionPolicy()
    )
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
    if (
        dist.get_world_size() > 1
    ):  # every rank's shards from the main process's weights (a skeleton's are allocated first)
        if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
            model.to_empty(device=comm_device())
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        for buffer in model.buffers():  # e.g. rotary frequencies (not in a state dict): unsharded, sent whole
            dist.broadcast(buffer, src=0)
    return model


@contextmanager
def full_weights(model):
    """The whole model gathered on every rank (one all-gather per layer, freed at the end) for passes whose
    number of forwards differs between ranks: sampling (each rank stops when its own completions end) and
    evaluation (its shares may differ in size). Per-layer gathers inside them would not pair up across ranks.
    Scoring passes need none: every rank holds as many rows, and token_logprobs runs two forwards per batch.
    Inside another full_weights of the same model, and without FSDP, nothing."""
    modules = []  # the FSDP units to gather: none when gathered already (plain tensors, no DTensors)
    if isinstance(next(model.parameters()), DTensor):
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


def full_state_dict(model) -> dict | None:
    """FSDP: the full weights, gathered on every rank (a collective) and kept on rank 0's CPU, without the copies
    of tied weights (as save_pretrained writes them); under LoRA only the trained ones (the adapters, which is
    what peft saves: the frozen base is never gathered). Else None."""
    lora = hasattr(model, "peft_config")
    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=lora)
    )
    names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}  # a tied one once
    return {k: v for k, v in state.items() if k in names}


def optimizer_state(model, opt, folder):
    """The optimizer's state for trainer_state.pt. FSDP: each rank writes its own shards of it into `folder` with
    torch.distributed.checkpoint (a collective; no rank ever holds the whole AdamW state, and it loads back at any
    number of processes), and what is returned names that folder."""
    dist.barrier()  # the main process has cleared the checkpoint's temporary folder
    dcp.save({"optimizer": get_optimizer_state_dict(model, opt)}, checkpoint_id=folder)
    return {"sharded": Path(folder).name}


def load_optimizer_state(model, opt, state: dict, checkpoint) -> None:
    """Restore what `optimizer_state` saved in the folder `checkpoint`, under either strategy and at any number of
    processes. FSDP's shards (a folder) are read by torch.distributed.checkpoint into this process's layout:
    its shards under FSDP, the whole state otherwise. A whole state (one process's, or ddp's) is keyed by
    position: under FSDP it is renamed by parameter and each rank keeps its shards of it."""
    if "sharded" in state:
        shards = {"optimizer": get_optimizer_state_dict(model, opt)}  # this process's layout, filled from the files
        dcp.load(shards, checkpoint_id=Path(checkpoint) / state["sharded"])
        return set_optimizer_state_dict(model, opt, shards["optimizer"])
    if not isinstance(model, FSDPModule):
        return opt.load_state_dict(state)
    names = [n for n, p in model.named_parameters() if p.requires_grad]  # the optimizer's order (make_optimizer)
    whole = {
        "state": {names[i]: v for i, v in state["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]],
    }
    set_optimizer_state_dict(model, opt, whole, options=StateDictOptions(full_state_dict=True))

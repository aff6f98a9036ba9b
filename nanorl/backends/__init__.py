"""Backends: the one place that decides how a forward, a decode step and the process's allocator run.

    backend = select_backend("auto", "auto", device)   # from the config keys `backend` and `dtype`
    with backend.forward(model): ...                   # every forward of the loops (token_logprobs, the critic)
    with backend.forward(model, pack_weights=True) as packed:
        step = backend.decoder(model, packed, cache, mask, group_size, max_new_tokens)   # None: the model's own forward
    with backend.recompute(model, cache): ...          # gradient checkpointing of the update's completion pass
    backend.prepare(device)                            # once per training process: the allocator policy

`auto` takes every speed-up that applies: on CPU in fp32 the oneDNN paths of cpu.py, the sampler's decode
step of decode.py and glibc's freed-memory reuse; under mixed precision, autocast. `torch` takes none of
them: plain PyTorch and transformers (autocast still applies, since it is the precision the user asked
for). The environment variable NANORL_BACKEND=torch turns `auto` into `torch` (the test suite runs its
loop tests both ways). The speed-ups live beside the core, outside its line budget (tests/test_size.py).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch

CHOICES = ("auto", "torch")
ENV = "NANORL_BACKEND"


def resolve_precision(name: str, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """Config key 'dtype' -> (dtype of the weights, dtype the forwards autocast to, or None).

    'auto' is fp32 on CPU (bf16 is ~100x slower on CPUs without bf16 units) and 'bf16-mixed' on GPUs
    with bf16: fp32 weights, bf16 matmuls (what TRL and accelerate do with bf16=True). Pure bf16
    weights ('bfloat16') halve the memory but round most AdamW updates away: at lr 2e-5 a bf16 weight
    near 0.05 moves by less than half its spacing, so 88% of a 576x576 matrix was unchanged after 10
    steps (tests/test_precision.py)."""
    if name == "auto":
        name = "bf16-mixed" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if name == "bf16-mixed":
        return torch.float32, torch.bfloat16
    dtypes = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if name not in dtypes:
        raise ValueError(f"config key 'dtype': expected auto|float32|bf16-mixed|bfloat16|float16, got {name!r}")
    return dtypes[name], None


@dataclass(frozen=True)
class Backend:
    """How forwards run: `name` auto | torch (see the module's docstring), `autocast` a dtype or None, `checkpoint`
    whether the update recomputes activations in its backward (config key grad_checkpointing)."""

    name: str = "auto"
    autocast: torch.dtype | None = None
    checkpoint: bool = False

    @property
    def fast(self) -> bool:
        """Whether nanorl's own speed-ups may run (they still check the model, device and dtype themselves)."""
        return self.name == "auto" and os.environ.get(ENV, "auto") != "torch" and self.autocast is None

    @contextmanager
    def forward(self, model, pack_weights: bool = False):
        """The context every forward of the loops runs in. Yields the weights packed for the sampler
        ({id(linear): (weight, bias, first, last output)}, or {} when nothing was packed)."""
        if self.autocast is not None:
            with torch.autocast(next(model.parameters()).device.type, dtype=self.autocast):
                yield {}
        elif self.fast and not (self.checkpoint and torch.is_grad_enabled()):  # a recomputed layer runs as it first ran
            from nanorl.backends.cpu import fast_cpu

            with fast_cpu(model, pack_weights) as packed:
                yield packed
        else:
            yield {}

    @contextmanager
    def recompute(self, model, cache=None):
        """Gradient checkpointing of a forward with gradients that appends to the prompt's KV `cache` (the update's
        completion pass, logprobs.token_logprobs), or that has none (cache None: a reward model's or critic's
        whole-sequence pass, reward_model._hidden, which must not build one): each decoder layer keeps only its
        inputs and runs again in the backward (torch.utils.checkpoint, non-reentrant). The pass appends to the
        cache, so afterwards the cache is rewound to the prompt's keys and values: a recomputed layer appends to
        exactly what its first run saw. transformers' own gradient_checkpointing_enable() drops the cache instead,
        which would drop the prompt."""
        if not (self.checkpoint and torch.is_grad_enabled()):
            yield
            return
        import functools

        from torch.utils.checkpoint import checkpoint
        from transformers.modeling_layers import GradientCheckpointingLayer

        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        if not layers:
            raise ValueError(
                f"config key 'grad_checkpointing': {type(model).__name__} has no decoder layers "
                f"transformers can checkpoint (GradientCheckpointingLayer)"
            )
        layers_of_cache = cache.layers if cache is not None else []
        prompt = [dict(vars(layer)) for layer in layers_of_cache]  # keys, values (and a sliding layer's length)
        for layer in layers:  # an instance attribute over the class's forward, removed below
            layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)
        try:
            yield
        finally:
            for layer in layers:
                del layer.forward
            for layer, state in zip(layers_of_cache, prompt):
                vars(layer).update(state)

    def decoder(self, model, packed: dict, cache, mask: torch.Tensor, group_size: int, max_new_tokens: int):
        """The sampler's decode step for this model, or None for the model's own forward (sampling.ModelStep)."""
        if not (self.fast and packed):
            return None
        from nanorl.backends.decode import cpu_decoder

        return cpu_decoder(model, packed, cache, mask, group_size, max_new_tokens)

    def prepare(self, device: torch.device) -> None:
        """Process-wide settings a training process takes once: on CPU, glibc keeps freed memory for reuse
        (backends/cpu.py, reuse_freed_memory). Not undone at the end: glibc has no way back to its adaptive
        defaults. `backend: torch` leaves the allocator alone."""
        if self.name == "auto" and os.environ.get(ENV, "auto") != "torch":
            from nanorl.backends.cpu import reuse_freed_memory

            reuse_freed_memory(device)


def select_backend(
    name: str, dtype: str, device: torch.device, checkpoint: bool = False, strategy: str = "ddp"
) -> tuple[Backend, torch.dtype]:
    """Config keys `backend`, `dtype`, `grad_checkpointing` and `strategy` on `device` -> (the Backend, the dtype
    the weights are loaded in). Strategy fsdp runs plain PyTorch: FSDP's hooks must see every gradient, and its
    gathered weights change between passes (the CPU speed-ups write gradients and pack weights themselves)."""
    if name not in CHOICES:
        raise ValueError(f"config key 'backend': expected {'|'.join(CHOICES)}, got {name!r}")
    weights, autocast = resolve_precision(dtype, device)
    return Backend("torch" if strategy == "fsdp" else name, autocast, checkpoint), weights

"""Backends: the one place that decides how a forward, a decode step and the process's allocator run.

    backend = select_backend("auto", "auto", device)   # from the config keys `backend` and `dtype`
    with backend.forward(model): ...                   # every forward of the loops (token_logprobs, the critic)
    with backend.forward(model, pack_weights=True) as packed:
        step = backend.decoder(model, packed, cache, mask, n, max_new_tokens)   # None: the model's own forward
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
    dtypes = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
              "float16": torch.float16, "fp16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"config key 'dtype': expected auto|float32|bf16-mixed|bfloat16|float16, got {name!r}")
    return dtypes[name], None


@dataclass(frozen=True)
class Backend:
    """How forwards run: `name` auto | torch (see the module's docstring), `autocast` a dtype or None."""

    name: str = "auto"
    autocast: torch.dtype | None = None

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
        elif self.fast:
            from nanorl.backends.cpu import fast_cpu

            with fast_cpu(model, pack_weights) as packed:
                yield packed
        else:
            yield {}

    def decoder(self, model, packed: dict, cache, mask: torch.Tensor, n: int, max_new_tokens: int):
        """The sampler's decode step for this model, or None for the model's own forward (sampling.ModelStep)."""
        if not (self.fast and packed):
            return None
        from nanorl.backends.decode import cpu_decoder

        return cpu_decoder(model, packed, cache, mask, n, max_new_tokens)

    def prepare(self, device: torch.device) -> None:
        """Process-wide settings a training process takes once: on CPU, glibc keeps freed memory for reuse
        (backends/cpu.py, reuse_freed_memory). Not undone at the end: glibc has no way back to its adaptive
        defaults. `backend: torch` leaves the allocator alone."""
        if self.name == "auto" and os.environ.get(ENV, "auto") != "torch":
            from nanorl.backends.cpu import reuse_freed_memory

            reuse_freed_memory(device)


def select_backend(name: str, dtype: str, device: torch.device) -> tuple[Backend, torch.dtype]:
    """Config keys `backend` and `dtype` on `device` -> (the Backend, the dtype the weights are loaded in)."""
    if name not in CHOICES:
        raise ValueError(f"config key 'backend': expected {'|'.join(CHOICES)}, got {name!r}")
    weights, autocast = resolve_precision(dtype, device)
    return Backend(name, autocast), weights

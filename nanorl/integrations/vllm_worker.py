"""What runs inside a vLLM worker for nanorl: loading the trainer's weights into the engine in place. Imported by the
engine's worker processes (`nanorl vllm-serve` passes `--worker-extension-cls` with WeightSync), and by the colocated
sampler (integrations/vllm.py) for `repack_tied_head`; it imports nothing else of nanorl.

    POST /collective_rpc {"method": "nanorl_load_weights", "kwargs": {"path": "/dev/shm/.../model.safetensors"}}
"""

from __future__ import annotations

import torch


class WeightSync:
    """A vLLM worker extension: its methods become the worker's, callable by `collective_rpc` (and so by the server's
    /collective_rpc route, which passes string arguments only: hence a file, not tensors)."""

    def nanorl_load_weights(self, path: str) -> None:
        """Load the tensors of a safetensors file (Hugging Face names) into the live model, then repack a tied head."""
        from safetensors.torch import load_file

        self.reload_weights(weights_iterator=iter(load_file(path).items()))  # the worker's in-place reload
        repack_tied_head(self)


def repack_tied_head(worker) -> None:
    """A head tied to the embedding gets no weights of its own in a reload, so on the CPU backend its packed copy
    (made from the embedding's weights at load time) would stay the old one: pack it again (elsewhere a no-op)."""
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return
    others = (
        m.weight for m in model.modules() if m is not head and isinstance(getattr(m, "weight", None), torch.Tensor)
    )
    if any(w.data_ptr() == weight.data_ptr() for w in others):
        head.quant_method.process_weights_after_loading(head)

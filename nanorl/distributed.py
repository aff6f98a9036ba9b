"""Who this process is in a run: its rank, the world size, and whether it is the main process (the one that
writes logs, samples, checkpoints and the final model). A plain run is one process: rank 0 of 1. Under
`torchrun` with an initialised process group these are the group's answers.
"""

from __future__ import annotations

import torch.distributed as dist


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if initialized() else 1


def is_main() -> bool:
    return rank() == 0

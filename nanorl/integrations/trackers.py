"""Trackers behind the logger object (logger.py), chosen with `report_to`: TensorBoard and Weights & Biases
(the console line is logger.py's own). Loaded only when a run asks for one.

    nanorl train --report-to console,tensorboard      # RUN/tensorboard/, then `tensorboard --logdir RUN`
    WANDB_MODE=offline nanorl train --report-to wandb # RUN/wandb/ (offline: `wandb sync` it later)

Each takes the step's metrics as they are written to metrics.jsonl (numbers only) and the evaluations.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path


class _Tracker:
    """The logger interface (nanorl/logger.py, Logger) for a tracker: metrics and evaluations only."""

    def log_samples(self, records: list[dict], step: int) -> None:
        pass

    def rewind(self, step: int) -> None:
        pass  # a tracker keeps what it was sent; a resumed run logs the redone steps again


def _numbers(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}


class TensorBoardLogger(_Tracker):
    def __init__(self, out_dir: Path, config=None, append: bool = False):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ImportError("report_to tensorboard needs tensorboard: pip install tensorboard") from None
        self.writer = SummaryWriter(str(Path(out_dir) / "tensorboard"))
        if config is not None and not append:
            self.writer.add_text("config", f"```\n{dataclasses.asdict(config)}\n```")

    def log(self, metrics: dict, step: int) -> None:
        for k, v in _numbers(metrics).items():
            self.writer.add_scalar(k, v, step)

    def log_eval(self, metrics: dict, step: int) -> None:
        self.log(metrics, step)

    def close(self) -> None:
        self.writer.close()


class WandbLogger(_Tracker):
    def __init__(self, out_dir: Path, config=None, append: bool = False):
        try:
            import wandb
        except ImportError:
            raise ImportError("report_to wandb needs wandb: pip install wandb") from None
        self.wandb = wandb
        self.run = wandb.init(
            project="nanorl",
            name=Path(out_dir).name,
            dir=str(out_dir),
            resume="allow" if append else None,
            config=dataclasses.asdict(config) if config is not None else None,
        )

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(_numbers(metrics), step=step)

    def log_eval(self, metrics: dict, step: int) -> None:
        self.run.log(_numbers(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


TRACKERS = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger}

"""Trackers behind the logger object (logger.py), chosen with `report_to`: TensorBoard, Weights & Biases and
trackio (the console line is logger.py's own). Loaded only when a run asks for one.

    nanorl train --report-to console,tensorboard      # RUN/tensorboard/, then `tensorboard --logdir RUN`
    WANDB_MODE=offline nanorl train --report-to wandb # RUN/wandb/ (offline: `wandb sync` it later)
    nanorl train --report-to trackio                  # trackio's local store (TRACKIO_DIR), then `trackio show`

Each takes the step's metrics as they are written to metrics.jsonl (numbers only), the evaluations, and the
step's completions as samples.jsonl gets them (all of them with --log_completions true): a text table in TensorBoard,
a `completions` table in W&B. W&B's project and run name come from WANDB_PROJECT / WANDB_NAME (else "nanorl" and
the run folder's name), and a resumed run (--resume true) continues the same W&B run (its id is kept in the folder).
trackio likewise: project TRACKIO_PROJECT (else "nanorl"), run name TRACKIO_NAME (else the folder's name), kept in
the folder for a resumed run; where its data goes is trackio's choice (TRACKIO_DIR, TRACKIO_SPACE_ID).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import uuid
from pathlib import Path


class _Tracker:
    """The logger interface (nanorl/logger.py, Logger) for a tracker: metrics and evaluations only."""

    def log_samples(self, records: list[dict], step: int) -> None:
        pass

    def rewind(self, step: int) -> None:
        pass  # a tracker keeps what it was sent; a resumed run logs the redone steps again


COLUMNS = ("prompt", "completion", "reward")


def _rows(records: list[dict]) -> list[list]:
    """A step's samples as table rows: prompt (chat messages as text), completion, reward."""
    return [[str(r.get("prompt", "")), str(r.get("completion", "")), float(r.get("reward", 0.0))] for r in records]


def _markdown(row) -> str:
    """A markdown table row (TensorBoard renders text as markdown)."""
    return " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in row)


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

    def log_samples(self, records: list[dict], step: int) -> None:
        table = "\n".join([_markdown(COLUMNS), _markdown(["---"] * 3), *map(_markdown, _rows(records))])
        self.writer.add_text("completions", table, step)

    def close(self) -> None:
        self.writer.close()


class _RunTracker(_Tracker):
    """W&B and trackio: a run object with .log(dict, step=) and .finish(), a library with a Table, and a run identity
    kept in the run folder so that a resumed run (--resume true) goes on in the same run."""

    def __init__(self, library: str, out_dir: Path, config, append: bool, keep: str, new: str):
        try:
            self.library = importlib.import_module(library)
        except ImportError:
            raise ImportError(f"report_to {library} needs {library}: pip install {library}") from None
        self.config = dataclasses.asdict(config) if config is not None else None  # the run's settings, as sent
        saved = Path(out_dir) / keep
        self.identity = saved.read_text().strip() if append and saved.is_file() else new
        saved.write_text(self.identity)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(_numbers(metrics), step=step)

    def log_eval(self, metrics: dict, step: int) -> None:
        self.log(metrics, step)

    def log_samples(self, records: list[dict], step: int) -> None:
        self.run.log({"completions": self.library.Table(columns=list(COLUMNS), data=_rows(records))}, step=step)

    def close(self) -> None:
        self.run.finish()


class WandbLogger(_RunTracker):
    def __init__(self, out_dir: Path, config=None, append: bool = False):
        super().__init__("wandb", out_dir, config, append, "wandb_run_id", uuid.uuid4().hex[:12])
        self.run = self.library.init(
            project=os.environ.get("WANDB_PROJECT", "nanorl"),
            name=os.environ.get("WANDB_NAME", Path(out_dir).name),
            id=self.identity,
            dir=str(out_dir),
            resume="allow",
            config=self.config,
        )


class TrackioLogger(_RunTracker):
    def __init__(self, out_dir: Path, config=None, append: bool = False):
        name = os.environ.get("TRACKIO_NAME", f"{Path(out_dir).name}-{uuid.uuid4().hex[:6]}")
        super().__init__("trackio", out_dir, config, append, "trackio_run_name", name)
        self.run = self.library.init(
            project=os.environ.get("TRACKIO_PROJECT", "nanorl"),
            name=self.identity,
            config=self.config,
            resume="allow",
            embed=False,
        )


TRACKERS = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger, "trackio": TrackioLogger}

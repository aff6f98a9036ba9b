"""Trackers behind the logger object (logger.py), chosen with `report_to`: the console line, TensorBoard and
Weights & Biases.

    nanorl train --report-to console                  # a line per step, also when output is not a terminal
    nanorl train --report-to console,tensorboard      # RUN/tensorboard/, then `tensorboard --logdir RUN`
    WANDB_MODE=offline nanorl train --report-to wandb # RUN/wandb/ (offline: `wandb sync` it later)

Each takes the step's metrics as they are written to metrics.jsonl (numbers only) and the evaluations.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

from tqdm.auto import tqdm

from nanorl.config import ConfigError


class _Tracker:
    """The logger interface (nanorl/logger.py, Logger) for a tracker: metrics and evaluations only."""

    def log_samples(self, records: list[dict], step: int) -> None:
        pass

    def rewind(self, step: int) -> None:
        pass  # a tracker keeps what it was sent; a resumed run logs the redone steps again


def _numbers(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}


# The console line: (metric, label, format), the first of each row's keys that a step has.
CONSOLE = (
    (("reward/mean",), "reward", "{:.3f}"), (("reward/acc",), "acc", "{:.2f}"), (("train/loss",), "loss", "{:.4f}"),
    (("train/acc",), "acc", "{:.2f}"), (("rollout/len_mean",), "len", "{:.0f}"),
    (("loss/kl", "reward/kl_penalty"), "kl", "{:.4f}"), (("optim/skipped_updates",), "skipped", "{:d}"),
    (("time/step",), "", "{:.1f} s"),
)


def console_line(metrics: dict, step: int, total: int | None) -> str:
    """'step 12/40 reward 0.340 acc 0.31 len 14 kl 0.0020 7.6 s' from a step's metrics."""
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    for keys, label, fmt in CONSOLE:
        key = next((k for k in keys if k in metrics and (label != "kl" or metrics[k])), None)
        if key is not None and (label != "skipped" or metrics[key]):
            parts.append((f"{label} " if label else "") + fmt.format(metrics[key]))
    return " ".join(parts)


class ConsoleLogger(_Tracker):
    """One line per step beside the progress bar, also when the output is not a terminal (logs, CI, nohup); the
    loops print their evaluations themselves."""

    def __init__(self, out_dir: Path, config=None, append: bool = False, total_steps: int | None = None):
        self.total = total_steps

    def log(self, metrics: dict, step: int) -> None:
        tqdm.write(console_line(metrics, step, self.total))

    def log_eval(self, metrics: dict, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardLogger(_Tracker):
    def __init__(self, out_dir: Path, config=None, append: bool = False, total_steps: int | None = None):
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
    def __init__(self, out_dir: Path, config=None, append: bool = False, total_steps: int | None = None):
        try:
            import wandb
        except ImportError:
            raise ImportError("report_to wandb needs wandb: pip install wandb") from None
        self.wandb = wandb
        self.run = wandb.init(project="nanorl", name=Path(out_dir).name, dir=str(out_dir), resume="allow" if append
                              else None, config=dataclasses.asdict(config) if config is not None else None)

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(_numbers(metrics), step=step)

    def log_eval(self, metrics: dict, step: int) -> None:
        self.run.log(_numbers(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


TRACKERS = {"console": ConsoleLogger, "tensorboard": TensorBoardLogger, "wandb": WandbLogger}


def tracker(name: str, out_dir: Path, config=None, append: bool = False, total_steps: int | None = None):
    if name not in TRACKERS:
        raise ValueError(f"config key 'report_to': unknown logger {name!r} ({', '.join(TRACKERS)}, none)")
    return TRACKERS[name](out_dir, config, append, total_steps)


def check_report_to(report_to: str) -> None:
    """Config key 'report_to' (config.validate, before any model is loaded): every name known, every tracker
    installed."""
    for name in (n.strip() for n in report_to.split(",") if n.strip()):
        if name not in (*TRACKERS, "none"):
            raise ConfigError(f"config key 'report_to': unknown logger {name!r} (console, tensorboard, wandb, none)")
        if name in ("tensorboard", "wandb") and importlib.util.find_spec(name) is None:
            raise ConfigError(f"config key 'report_to': {name} is not installed (pip install {name})")

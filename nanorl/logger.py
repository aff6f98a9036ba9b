"""Loggers: what the loops call to record a run. metrics.jsonl / eval.jsonl / samples.jsonl in the run folder
always, a one-line summary of every step on the console, and trackers (integrations/trackers.py) when asked;
processes that are not the main one record nothing.

    logger = make_logger(out_dir, report_to="console,tensorboard", append=resuming, total_steps=40, config=cfg)
    logger.log(metrics, step)                        # metrics.jsonl: one line per step
    logger.log_eval(metrics, step)                   # eval.jsonl: one line per evaluation
    logger.log_samples(records, step)                # samples.jsonl: a few completions with their rewards
    logger.close()

A new tracker implements these methods (and rewind) and joins TRACKERS in integrations/trackers.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from nanorl.integrations import distributed


class Logger:
    """The interface, doing nothing: a logger overrides what it records. Loggers([]) is the silent one."""

    def log(self, metrics: dict, step: int) -> None:
        """A step's metrics, after the step (`step` counts from 1)."""

    def log_eval(self, metrics: dict, step: int) -> None:
        """An evaluation's metrics (step 0: before any training)."""

    def log_samples(self, records: list[dict], step: int) -> None:
        """A few of the step's completions with their rewards."""

    def rewind(self, step: int) -> None:
        """A run resumed from its checkpoint of `step`: forget what was recorded after that step."""

    def close(self) -> None:
        """The run is over: flush and release what the logger holds."""


class JsonlLogger(Logger):
    def __init__(self, out_dir: Path, append: bool = False):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        mode = "a" if append else "w"
        self.files = {name: open(self.dir / f"{name}.jsonl", mode) for name in ("metrics", "samples", "eval")}

    def _write(self, name: str, record: dict) -> None:
        f = self.files[name]
        f.write(json.dumps(record, default=float) + "\n")
        f.flush()

    def log(self, metrics: dict, step: int) -> None:
        self._write("metrics", {"step": step, **metrics})

    def log_eval(self, metrics: dict, step: int) -> None:
        self._write("eval", {"step": step, **metrics})

    def log_samples(self, records: list[dict], step: int) -> None:
        for r in records:
            self._write("samples", {"step": step, **r})

    def rewind(self, step: int) -> None:
        """On resume from the checkpoint of `step`: drop every line of a later step (written after the checkpoint
        by the run that stopped), so no step appears twice and none is missing."""
        for name, f in self.files.items():
            f.close()
            path = self.dir / f"{name}.jsonl"
            lines = [x for x in path.read_text().splitlines(keepends=True) if json.loads(x).get("step", 0) <= step]
            path.write_text("".join(lines))
            self.files[name] = open(path, "a")

    def close(self) -> None:
        for f in self.files.values():
            f.close()


class Loggers(Logger):
    """Several loggers as one: each call goes to every one of them, in order."""

    def __init__(self, loggers: list):
        self.loggers = loggers

    def _each(self, method: str, *args) -> None:
        for lg in self.loggers:
            getattr(lg, method)(*args)

    def log(self, metrics: dict, step: int) -> None:
        self._each("log", metrics, step)

    def log_eval(self, metrics: dict, step: int) -> None:
        self._each("log_eval", metrics, step)

    def log_samples(self, records: list[dict], step: int) -> None:
        self._each("log_samples", records, step)

    def rewind(self, step: int) -> None:
        self._each("rewind", step)

    def close(self) -> None:
        self._each("close")


class Callback(Logger):
    """A function called as fn(step, metrics) after every step: train(cfg, callbacks=[fn])."""

    def __init__(self, fn):
        self.fn = fn

    def log(self, metrics: dict, step: int) -> None:
        self.fn(step, metrics)


def make_logger(out_dir: Path, report_to: str = "console", append: bool = False, total_steps: int | None = None,
                config=None, callbacks=()):
    """JSONL always, plus each of `report_to` (comma-separated: console, tensorboard, wandb; or none), on the main
    process only; the other processes get Loggers([]), which records nothing."""
    if not distributed.is_main():
        return Loggers([])
    from nanorl.integrations.trackers import tracker
    from nanorl.integrations.warnings import RunWarnings  # first: it adds warn/* keys the others then record

    chosen = [n.strip() for n in report_to.split(",") if n.strip() and n.strip() != "none"]
    others = [tracker(n, Path(out_dir), config, append, total_steps) for n in chosen]
    others += [c if isinstance(c, Logger) else Callback(c) for c in callbacks]  # a Logger sees evals and samples too
    return Loggers([RunWarnings(), JsonlLogger(out_dir, append), *others])

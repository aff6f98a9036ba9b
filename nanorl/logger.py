"""Loggers: what the loops call to record a run. JSONL files in the run folder by default; a no-op for
processes that are not the main one. A tracker (TensorBoard, W&B) is another class with these methods.

    logger = make_logger(out_dir, append=resuming)   # JsonlLogger on the main process, NullLogger elsewhere
    logger.log(metrics, step)                        # metrics.jsonl: one line per step
    logger.log_eval(metrics, step)                   # eval.jsonl: one line per evaluation
    logger.log_samples(records, step)                # samples.jsonl: a few completions with their rewards
    logger.close()
"""

from __future__ import annotations

import json
from pathlib import Path

from nanorl import distributed


class JsonlLogger:
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

    def close(self) -> None:
        for f in self.files.values():
            f.close()


class NullLogger:
    """Records nothing: the logger of every process but the main one."""

    def log(self, metrics: dict, step: int) -> None:
        pass

    def log_eval(self, metrics: dict, step: int) -> None:
        pass

    def log_samples(self, records: list[dict], step: int) -> None:
        pass

    def close(self) -> None:
        pass


def make_logger(out_dir: Path, append: bool = False):
    return JsonlLogger(out_dir, append) if distributed.is_main() else NullLogger()

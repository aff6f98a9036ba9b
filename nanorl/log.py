"""Run folder logging: metrics.jsonl (one line per step), samples.jsonl, eval.jsonl."""

from __future__ import annotations

import json
from pathlib import Path


class RunLog:
    def __init__(self, out_dir: Path, append: bool = False):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        mode = "a" if append else "w"
        self.files = {name: open(self.dir / f"{name}.jsonl", mode) for name in ("metrics", "samples", "eval")}

    def write(self, name: str, record: dict) -> None:
        f = self.files[name]
        f.write(json.dumps(record, default=float) + "\n")
        f.flush()

    def close(self) -> None:
        for f in self.files.values():
            f.close()

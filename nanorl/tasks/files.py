"""Tasks from data files: .jsonl, .csv, .parquet, or a folder saved by `datasets.Dataset.save_to_disk`."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanorl.tasks import Task


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a .jsonl, .csv or .parquet file, or of a `datasets` folder (its 'train' split)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task file not found: {path}")
    if path.is_dir():
        try:
            import datasets
        except ImportError:
            raise ImportError(f"{path} is a folder: reading a saved dataset needs `pip install datasets`") from None
        ds = datasets.load_from_disk(str(path))
        return [dict(r) for r in (ds["train"] if isinstance(ds, datasets.DatasetDict) else ds)]
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not valid JSON ({e})") from None
        return rows
    if path.suffix == ".csv":
        import csv

        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"reading {path} needs `pip install pyarrow`") from None
        return pq.read_table(path).to_pylist()
    raise ValueError(f"config key 'task': {path} is not .jsonl, .csv, .parquet or a dataset folder")


def file_task(path: str | Path, reward: str = "final_number", eval_size: int = 200, seed: int = 0,
              prompt_field: str = "prompt", answer_field: str = "answer") -> Task:
    """Rows with a prompt (string or chat messages) and the fields the reward needs; `answer_field`
    is passed to the reward as `answer`. After a seeded shuffle the first eval_size rows (at most
    half) are held out and never trained on."""
    from nanorl.tasks import Example, Task, parse_reward_spec

    rows = read_rows(path)
    if not rows:
        raise ValueError(f"{path}: the dataset is empty")
    examples = []
    for n, row in enumerate(rows, 1):
        if prompt_field not in row:
            raise ValueError(f"{path}: row {n} has no field '{prompt_field}' (set prompt_field; fields: {sorted(row)})")
        row = dict(row)
        prompt = row.pop(prompt_field)
        if answer_field != "answer" and answer_field in row:
            row["answer"] = row.pop(answer_field)
        examples.append(Example(prompt, row))
    if len(examples) < 2:
        raise ValueError(f"{path}: needs at least 2 rows (train and eval), found {len(examples)}")
    random.Random(seed).shuffle(examples)
    n_eval = min(eval_size, len(examples) // 2)
    return Task(Path(path).stem, train=examples[n_eval:], eval=examples[:n_eval], reward=parse_reward_spec(reward))

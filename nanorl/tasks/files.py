"""Data through Hugging Face `datasets`: every command reads its rows with `load_rows`.

    train, held_out = load_rows("rows.jsonl")        # .json .jsonl .csv .parquet .arrow .txt, .gz/.bz2/.xz/.zst
    train, held_out = load_rows("saved_folder")      # a folder from `Dataset.save_to_disk`, or a folder of data files
    train, held_out = load_rows("trl-lib/tldr")      # a hub dataset id (where a network exists)
    train, held_out = load_rows(dataset)             # a `datasets.Dataset` or `DatasetDict` from Python
    task = file_task("rows.jsonl", reward="math")    # a task from rows with a prompt and the reward's fields

`held_out` is the source's `test` (or `validation`) split when it has one, else None: the caller then cuts
its own held-out rows from the training split, after a seeded shuffle.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanorl.tasks import Task

BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow", ".txt": "text"}
COMPRESSED = (".gz", ".bz2", ".xz", ".zst")
HELD_OUT = ("test", "validation")


def _builder(path: Path) -> str | None:
    suffixes = [s for s in path.suffixes if s not in COMPRESSED]
    return BUILDERS.get(suffixes[-1]) if suffixes else None


def _bad_json_line(path: Path) -> str | None:
    """'file:line: ...' for the first line of a JSON Lines file that does not parse (datasets does not say)."""
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            for n, line in enumerate(f, 1):  # noqa: B007 (n names the bad line below)
                if line.strip():
                    json.loads(line)
    except json.JSONDecodeError as e:
        return f"{path}:{n}: not valid JSON ({e})"
    except (OSError, UnicodeDecodeError) as e:
        return f"{path}: unreadable ({e})"
    return None


def _splits(ds) -> tuple:
    """(train split, held-out split or None) of a Dataset or DatasetDict."""
    import datasets

    if not isinstance(ds, datasets.DatasetDict):
        return ds, None
    names = list(ds)
    train = "train" if "train" in ds else names[0] if len(names) == 1 else None
    if train is None:
        raise ValueError(f"the dataset has splits {names} but no 'train' split")
    held = next((ds[s] for s in HELD_OUT if s in ds), None)
    return ds[train], held


def load_rows(source, what: str = "data") -> tuple[list[dict], list[dict] | None]:
    """-> (training rows, held-out rows or None) of a file, a folder, a hub id, or a Dataset / DatasetDict."""
    from nanorl.errors import ConfigError

    try:
        import datasets
    except ImportError:
        raise ImportError("reading data needs `pip install datasets`") from None
    if isinstance(source, (datasets.Dataset, datasets.DatasetDict)):
        train, held = _splits(source)
        return train.to_list(), held.to_list() if held is not None else None
    path, quiet, level = (
        Path(str(source)),
        datasets.utils.are_progress_bars_disabled(),
        datasets.logging.get_verbosity(),
    )
    datasets.disable_progress_bars()  # for this read only, as its error log (our message says it): restored below
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            ds = datasets.load_from_disk(str(path))
        elif path.is_dir():
            ds = datasets.load_dataset(str(path))
        elif _builder(path):
            if not path.is_file():
                raise FileNotFoundError(f"{what} file not found: {path}")
            if path.stat().st_size == 0:
                raise ConfigError(f"{what} {path}: the file is empty")
            ds = datasets.load_dataset(_builder(path), data_files=str(path))
        elif path.suffix and not path.exists():
            raise ConfigError(f"{what} {path}: not a known data format ({', '.join(BUILDERS)}, or a dataset folder)")
        elif "/" not in str(source):  # not a file or folder here, and not a hub id (owner/name)
            raise FileNotFoundError(f"{what} not found: {source} (a file, a folder, or a hub id owner/name)")
        else:
            ds = datasets.load_dataset(str(source))  # a hub id
    except (FileNotFoundError, ConfigError):
        raise
    except Exception as e:
        where = _bad_json_line(path) if _builder(path) == "json" and path.suffix != ".json" else None
        raise ConfigError(where or f"{what} {source}: cannot be read ({type(e).__name__}: {str(e)[:300]})") from None
    finally:
        datasets.logging.set_verbosity(level)
        if not quiet:
            datasets.enable_progress_bars()
    train, held = _splits(ds)
    return train.to_list(), held.to_list() if held is not None else None


def plain_prompt(prompt, template: str, builtin: bool):
    """A prompt as apply_chat_template `template` (auto | always | never) reads it, TRL's rule: a string is read as it
    is (data.Text, TRL's standard format) with never, or with auto when it comes from data (not `builtin`: nanorl's
    own tasks are written for chat models); chat messages go through the template, and never refuses them."""
    from nanorl.data import Text
    from nanorl.errors import ConfigError

    if template == "never" and not isinstance(prompt, str):
        raise ConfigError(
            f"config key 'apply_chat_template': 'never', but a prompt is chat messages: {str(prompt)[:80]}"
        )
    as_given = template == "never" or (template == "auto" and not builtin)
    return Text(prompt) if as_given and isinstance(prompt, str) else prompt


def file_task(
    source,
    reward: str = "final_number",
    eval_size: int = 200,
    seed: int = 0,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    eval_data="",
    template: str = "auto",
) -> Task:
    """Rows with a prompt (string or chat messages) and the fields the reward needs; `answer_field` is also
    passed to the reward as `answer`. The held-out set (its first eval_size rows) is `eval_data` (another source:
    its test split, or its rows), else the source's test/validation split, else eval_size rows (at most half) cut
    from the training rows after a shuffle with `seed`; Task.held_out says which (console, config.json). Prompts are
    read as `template` (apply_chat_template) says: `plain_prompt`."""
    from nanorl.errors import ConfigError
    from nanorl.tasks import Example, Task, parse_reward_spec

    rows, held = load_rows(source, "task")
    name = Path(str(source)).stem if isinstance(source, (str, Path)) else "dataset"
    said = f"the test split of {source}" if isinstance(source, (str, Path)) else "the dataset's test split"
    if eval_data:
        other, other_held = load_rows(eval_data, "eval_data")
        held, said = (
            (other_held, f"the test split of {eval_data}") if other_held is not None else (other, str(eval_data))
        )

    def examples(part, label):
        out = []
        for n, row in enumerate(part, 1):
            if prompt_field not in row:
                raise ConfigError(
                    f"{source}: {label} row {n} has no field '{prompt_field}' (set prompt_field; fields: {sorted(row)})"
                )
            row = dict(row)
            prompt = row.pop(prompt_field)
            if answer_field != "answer" and answer_field in row:
                row["answer"] = row[answer_field]
            out.append(Example(plain_prompt(prompt, template, builtin=False), row))
        return out

    train = examples(rows, "train")
    if held is not None:
        held = examples(held, "held-out")[:eval_size]
        return Task(
            name, train=train, eval=held, reward=parse_reward_spec(reward), held_out=f"{len(held)} rows of {said}"
        )
    if len(train) < 2:
        raise ConfigError(f"{source}: needs at least 2 rows (train and eval), found {len(train)}")
    random.Random(seed).shuffle(train)
    n_eval = min(eval_size, len(train) // 2)
    said = f"{n_eval} training rows set aside (no test split; shuffle seed {seed}; eval_data to give one)"
    return Task(name, train=train[n_eval:], eval=train[:n_eval], reward=parse_reward_spec(reward), held_out=said)

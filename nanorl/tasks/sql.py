"""SQL rewards: run the completion's query on the task's SQLite database and compare result sets.

    sql_reward(prompt, "```sql\\nSELECT name FROM employees WHERE salary > 90000\\n```",
               db="company.db", query="SELECT name FROM employees WHERE salary > 90000")   # -> 1.0
    task = sql_task()                       # the built-in set: 36 questions on a small company database

Every query runs in a process of its own (`_sql_worker.py`), never in the trainer: with an address
space limit (`memory_mb`, and SQLite's heap capped below it), a CPU limit, and a wall clock the
trainer enforces by killing the process `KILL_GRACE_S` after `timeout_s` (inside, a progress handler
interrupts the query at `timeout_s`). The database is opened read-only (`mode=ro`, `PRAGMA query_only`),
an authorizer allows reads and functions only (no ATTACH, no PRAGMA, no writes), and only one
statement runs. The result comes back as tagged plain data, at most `max_rows` rows and `MAX_BYTES`,
and is parsed defensively: anything malformed, too large, slow or failing scores 0 (`sql_reward.batch`
flags each "killed" or "malformed" sample, logged as reward/<part>_killed_mean and reward/<part>_malformed_mean).
Result sets compare as multisets of rows, or as lists when the reference query
has an ORDER BY; floats compare to 6 decimals. Reference results are computed once per database file.
`sql_reward.batch` runs a batch's queries in parallel across cores.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nanorl.tasks.code import Malformed, decode

DATA = Path(__file__).with_name("data")
WORKER = Path(__file__).with_name("_sql_worker.py")
_FENCE = re.compile(r"```(?:sql|SQL|sqlite)?[ \t]*\n(.*?)(?:```|$)", re.S)
MEMORY_MB, MAX_BYTES, KILL_GRACE_S = 256, 2_000_000, 1.0
SQL_TAGS = ("i", "f", "s", "y", "n")  # SQLite's values: integer, real, text, blob, null
KILLED, MALFORMED = "timeout: killed", "malformed result"  # how run_query's errors for those two begin


def extract_sql(completion: str) -> str:
    m = _FENCE.search(completion)
    return (m.group(1) if m else completion).strip().rstrip(";").strip()


def parse_rows(out: str, max_rows: int):
    """The worker's line -> (rows, None) or (None, error); Malformed if it is not what the worker prints."""
    try:
        reply = json.loads(out)
    except (ValueError, RecursionError):
        raise Malformed("not JSON") from None
    if isinstance(reply, dict) and isinstance(reply.get("error"), str):
        return None, reply["error"]
    rows = reply.get("rows") if isinstance(reply, dict) else None
    if not isinstance(rows, list) or len(rows) > max_rows or not all(isinstance(r, list) for r in rows):
        raise Malformed("no rows")
    if not all(isinstance(v, list) and v and v[0] in SQL_TAGS for row in rows for v in row):
        raise Malformed("not an SQL value")
    budget = [max_rows * 64 + 1]
    return [tuple(decode(["t", row], budget=budget)) for row in rows], None


def run_query(db: str | Path, sql: str, timeout_s: float = 2.0, max_rows: int = 10_000, memory_mb: int = MEMORY_MB):
    """-> (rows, None) or (None, error message). Runs in its own process; never writes to `db`, never runs
    past timeout_s + KILL_GRACE_S, never uses more than memory_mb."""
    if not Path(db).is_file():
        raise FileNotFoundError(f"SQL task database not found: {db}")
    req = {
        "uri": Path(db).resolve().as_uri(),
        "sql": sql,
        "timeout_s": timeout_s,
        "max_rows": max_rows,
        "memory_mb": memory_mb,
        "max_bytes": MAX_BYTES,
    }
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", str(WORKER)],
            input=json.dumps(req),
            capture_output=True,
            text=True,
            timeout=timeout_s + KILL_GRACE_S,
            env={},
            cwd="/",
        )
    except subprocess.TimeoutExpired:  # run() has killed it
        return None, f"{KILLED} after {timeout_s + KILL_GRACE_S:.1f} s"
    if done.returncode != 0:
        return None, f"the query's process ended with {done.returncode}: {done.stderr[-300:]}"
    try:
        return parse_rows(done.stdout[: MAX_BYTES + 100], max_rows)
    except (Malformed, RecursionError, MemoryError) as e:
        return None, f"{MALFORMED}: {e}"


@functools.lru_cache(maxsize=4096)
def _reference(db: str, mtime_ns: int, query: str):
    rows, err = run_query(db, query, timeout_s=30)
    if err:
        from nanorl.errors import RewardSetupError

        raise RewardSetupError(f"the reference query failed on {db}: {err}: {query}")
    return rows


def reference_rows(db: str | Path, query: str):
    """The reference query's rows, computed once per (database file as it is now, query)."""
    path = Path(db).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"SQL task database not found: {db}")
    return _reference(str(path), os.stat(path).st_mtime_ns, query)


def _normal(rows) -> list[tuple]:
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in rows]


def same_result(got, expected, ordered: bool) -> bool:
    got, expected = _normal(got), _normal(expected)
    return got == expected if ordered else Counter(got) == Counter(expected)


def sql_reward(prompt, completion: str, db: str, query: str, timeout_s: float = 2.0, **_) -> float:
    """1.0 when the completion's query returns the reference query's result set, else 0.0."""
    return _score(completion, db, query, timeout_s)[0]


def _score(completion: str, db: str, query: str, timeout_s: float = 2.0, **_) -> tuple[float, str | None]:
    """sql_reward's score, and the query's error (None when it ran)."""
    expected = reference_rows(db, query)
    got, err = run_query(db, extract_sql(completion), timeout_s)
    ordered = re.search(r"\border\s+by\b", query, re.I) is not None
    try:
        return float(err is None and same_result(got, expected, ordered)), err
    except (TypeError, ValueError, OverflowError):  # rows that do not compare (e.g. unhashable): not equal
        return 0.0, err


def _batch(prompts, completions, fields: list[dict], *_, **__):
    from nanorl.tasks import Scores

    workers = max(1, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        scored = list(pool.map(lambda c, f: _score(c, **f), completions, fields))
    errors = [err or "" for _, err in scored]
    return Scores(
        [score for score, _ in scored],
        {"killed": [e.startswith(KILLED) for e in errors], "malformed": [e.startswith(MALFORMED) for e in errors]},
    )


sql_reward.batch = _batch


def build_db(path: Path) -> Path:
    """Create the built-in company database from data/company.sql (once)."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        conn = sqlite3.connect(tmp)
        conn.executescript((DATA / "company.sql").read_text())
        conn.commit()
        conn.close()
        tmp.rename(path)
    return path


def sql_task(eval_size: int = 10, seed: int = 0, db_dir: str | Path | None = None):
    """The built-in set: questions over a small company database (schema in every prompt);
    `eval_size` of them are held out."""
    import random

    from nanorl.cache import cache_dir
    from nanorl.tasks import Example, Task

    db = build_db(Path(db_dir or cache_dir()) / "sql" / "company.db")
    schema = "\n".join(
        r[0] + ";"
        for r in sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY name"
        )
    )
    rows = [json.loads(line) for line in (DATA / "sql_tasks.jsonl").read_text().splitlines() if line.strip()]
    random.Random(seed).shuffle(rows)
    if not 0 < eval_size < len(rows):
        raise ValueError(f"config key 'eval_size': the SQL task has {len(rows)} questions; hold out 1..{len(rows) - 1}")
    examples = [
        Example(
            f"SQLite database schema:\n{schema}\n\n{r['question']} Reply with one SQL query in a ```sql block.",
            {"db": str(db), "query": r["query"]},
        )
        for r in rows
    ]
    return Task("sql", train=examples[eval_size:], eval=examples[:eval_size], reward=sql_reward)

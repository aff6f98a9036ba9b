"""SQL rewards: run the completion's query on the task's SQLite database and compare result sets.

    sql_reward(prompt, "```sql\\nSELECT name FROM employees WHERE salary > 90000\\n```",
               db="company.db", query="SELECT name FROM employees WHERE salary > 90000")   # -> 1.0
    task = sql_task()                       # the built-in set: 36 questions on a small company database

The database is opened read-only (`mode=ro`, `PRAGMA query_only`), an authorizer allows reads and
functions only (no ATTACH, no PRAGMA, no writes), only one statement runs, and a progress handler
interrupts a query after `timeout_s`. Result sets compare as multisets of rows, or as lists when the
reference query has an ORDER BY; floats compare to 6 decimals. Anything that fails scores 0.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections import Counter
from pathlib import Path

DATA = Path(__file__).with_name("data")
_FENCE = re.compile(r"```(?:sql|SQL|sqlite)?[ \t]*\n(.*?)(?:```|$)", re.S)
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}


def extract_sql(completion: str) -> str:
    m = _FENCE.search(completion)
    return (m.group(1) if m else completion).strip().rstrip(";").strip()


def run_query(db: str | Path, sql: str, timeout_s: float = 2.0, max_rows: int = 10_000):
    """-> (rows, None) or (None, error message). Never writes to `db`, never runs past timeout_s."""
    if not Path(db).is_file():
        raise FileNotFoundError(f"SQL task database not found: {db}")
    conn = sqlite3.connect(f"file:{Path(db).resolve()}?mode=ro", uri=True)
    try:
        conn.execute("PRAGMA query_only = ON")
        conn.set_authorizer(lambda action, *_: sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY)
        deadline = time.monotonic() + timeout_s
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        rows = conn.execute(sql).fetchmany(max_rows + 1)
        if len(rows) > max_rows:
            return None, f"more than {max_rows} rows"
        return rows, None
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as e:
        return None, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def _normal(rows) -> list[tuple]:
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in rows]


def same_result(got, expected, ordered: bool) -> bool:
    got, expected = _normal(got), _normal(expected)
    return got == expected if ordered else Counter(got) == Counter(expected)


def sql_reward(prompt, completion: str, db: str, query: str, timeout_s: float = 2.0, **_) -> float:
    """1.0 when the completion's query returns the reference query's result set, else 0.0."""
    expected, err = run_query(db, query, timeout_s=30)
    if err:
        raise ValueError(f"the reference query failed on {db}: {err}: {query}")
    got, err = run_query(db, extract_sql(completion), timeout_s)
    ordered = re.search(r"\border\s+by\b", query, re.I) is not None
    return float(err is None and same_result(got, expected, ordered))


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
    schema = "\n".join(r[0] + ";" for r in sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY name"))
    rows = [json.loads(line) for line in (DATA / "sql_tasks.jsonl").read_text().splitlines() if line.strip()]
    random.Random(seed).shuffle(rows)
    if not 0 < eval_size < len(rows):
        raise ValueError(f"config key 'eval_size': the SQL task has {len(rows)} questions; hold out 1..{len(rows) - 1}")
    examples = [Example(f"SQLite database schema:\n{schema}\n\n{r['question']} Reply with one SQL query in a ```sql block.",
                        {"db": str(db), "query": r["query"]}) for r in rows]
    return Task("sql", train=examples[eval_size:], eval=examples[:eval_size], reward=sql_reward)

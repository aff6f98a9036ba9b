"""SQL worker: run one query on a read-only SQLite database inside memory and time limits, print the rows.

Run by `sql.run_query` as `python -I -S _sql_worker.py` with a JSON request on stdin (stdlib only,
never imported): {"uri" (the database as a file: URI), "sql", "timeout_s", "max_rows", "memory_mb",
"max_bytes"}. It limits its own
address space and CPU time, caps SQLite's heap, opens the database read-only with an authorizer that
allows reads and functions only, interrupts the query after timeout_s (the trainer kills the process
soon after, should one SQLite step run on), and prints one JSON line: {"rows": [[tagged value, ...],
...]} with values tagged as in code.py (["i", "3"], ["f", "0.5"], ["s", "x"], ["y", hex], ["n", null]),
or {"error": "..."}.
"""

import json
import resource
import sqlite3
import sys
import time

ALLOWED = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}


def tag(v) -> list:
    kind = type(v)
    if kind is int or kind is float:
        return ["i" if kind is int else "f", repr(v)]
    if kind is bytes:
        return ["y", v.hex()]
    return ["s", v] if kind is str else ["n", None]


def run(req: dict) -> dict:
    try:
        conn = sqlite3.connect(req["uri"] + "?mode=ro", uri=True)
    except sqlite3.Error as e:
        return {"error": f"{type(e).__name__}: {e}"}
    try:
        conn.execute(f"PRAGMA hard_heap_limit = {req['memory_mb'] << 19}")  # half the address space, for SQLite
        conn.execute("PRAGMA query_only = ON")
        conn.set_authorizer(lambda action, *_: sqlite3.SQLITE_OK if action in ALLOWED else sqlite3.SQLITE_DENY)
        deadline = time.monotonic() + req["timeout_s"]
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
        rows = conn.execute(req["sql"]).fetchmany(req["max_rows"] + 1)
        if len(rows) > req["max_rows"]:
            return {"error": f"more than {req['max_rows']} rows"}
        return {"rows": [[tag(v) for v in row] for row in rows]}
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        conn.close()


def main() -> None:
    req = json.loads(sys.stdin.read())
    resource.setrlimit(resource.RLIMIT_AS, (req["memory_mb"] << 20,) * 2)
    cpu = int(req["timeout_s"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        out = json.dumps(run(req))
    except MemoryError:
        out = json.dumps({"error": "MemoryError"})
    if len(out) > req["max_bytes"]:
        out = json.dumps({"error": f"the result is larger than {req['max_bytes']} bytes"})
    sys.stdout.write(out + "\n")


if __name__ == "__main__":
    main()

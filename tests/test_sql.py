"""The SQL reward: right, wrong and hostile queries, each in a process of its own with enforced limits."""

import hashlib
import resource
import time

import pytest

import nanorl.tasks.sql as sql_module
from nanorl.tasks.code import Malformed
from nanorl.tasks.sql import build_db, extract_sql, parse_rows, run_query, same_result, sql_reward, sql_task


@pytest.fixture()
def db(tmp_path):
    return str(build_db(tmp_path / "company.db"))


def _digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


REF = "SELECT name FROM employees WHERE salary > 80000"


def test_right_wrong_and_malformed_queries(db):
    assert sql_reward("", "```sql\nSELECT name FROM employees WHERE salary > 80000;\n```", db=db, query=REF) == 1.0
    # the same set in another order and with another spelling still matches (no ORDER BY in the reference)
    assert (
        sql_reward(
            "", "SELECT e.name FROM employees AS e WHERE 80000 < e.salary ORDER BY e.name DESC", db=db, query=REF
        )
        == 1.0
    )
    assert sql_reward("", "SELECT name FROM employees WHERE salary >= 60000", db=db, query=REF) == 0.0
    assert sql_reward("", "SELECT name, salary FROM employees WHERE salary > 80000", db=db, query=REF) == 0.0
    assert sql_reward("", "SELEKT name FROM employees", db=db, query=REF) == 0.0
    assert sql_reward("", "I don't know SQL.", db=db, query=REF) == 0.0
    ordered = "SELECT name FROM employees ORDER BY salary DESC LIMIT 3"
    assert sql_reward("", "SELECT name FROM employees ORDER BY salary DESC LIMIT 3", db=db, query=ordered) == 1.0
    assert sql_reward("", "SELECT name FROM employees WHERE salary > 90000", db=db, query=ordered) == 0.0  # order
    assert extract_sql("Here:\n```sql\nSELECT 1;\n```") == "SELECT 1"
    assert same_result([(1, 0.1 + 0.2)], [(1, 0.3)], ordered=False)


def test_writes_drops_and_escapes_score_zero_and_change_nothing(db, tmp_path):
    before = _digest(db)
    attacks = [
        "DROP TABLE employees",
        "DELETE FROM employees",
        "UPDATE employees SET salary = 0",
        "INSERT INTO departments VALUES (9, 'X', 'Y')",
        "SELECT 1; DROP TABLE employees",
        f"ATTACH DATABASE '{tmp_path / 'evil.db'}' AS evil",
        "PRAGMA writable_schema = ON",
        "CREATE TABLE t (x)",
        "VACUUM INTO '/tmp/nanorl_sql_copy.db'",
        "SELECT load_extension('/tmp/x.so')",
    ]
    for sql in attacks:
        assert sql_reward("", sql, db=db, query=REF) == 0.0, sql
    assert _digest(db) == before
    assert not (tmp_path / "evil.db").exists()
    rows, err = run_query(db, "SELECT COUNT(*) FROM employees")
    assert rows == [(12,)]


def test_a_query_that_runs_forever_is_interrupted(db):
    forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    t0 = time.perf_counter()
    assert sql_reward("", forever, db=db, query=REF, timeout_s=0.5) == 0.0
    assert time.perf_counter() - t0 < 3.0
    rows, err = run_query(db, forever, timeout_s=0.2)
    assert rows is None and "interrupt" in err.lower()


def test_built_in_sql_task(tmp_path):
    task = sql_task(db_dir=tmp_path)
    assert len(task.train) + len(task.eval) == 36 and len(task.eval) == 10
    assert not {e.prompt for e in task.eval} & {e.prompt for e in task.train}
    for ex in task.train + task.eval:  # every reference answers itself
        assert sql_reward(ex.prompt, ex.fields["query"], **ex.fields) == 1.0
    assert "CREATE TABLE employees" in task.eval[0].prompt


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_memory_bombs_fail_in_their_own_process(db):
    before = _rss_mb()
    for bomb in (
        "SELECT zeroblob(400000000)",
        "SELECT hex(randomblob(100000000)) LIKE '%a%'",
        "SELECT length(group_concat(hex(zeroblob(1000000)))) FROM employees, employees, employees",
    ):
        t0 = time.perf_counter()
        assert sql_reward("", bomb, db=db, query=REF, timeout_s=1.0) == 0.0, bomb
        assert time.perf_counter() - t0 < 1.0 + sql_module.KILL_GRACE_S + 1.0
    assert _rss_mb() - before < 50  # the trainer's own peak memory did not move


def test_a_single_long_step_is_killed_on_time(db):
    # one SQLite step (a naive substring search of 200 MB-steps): the progress handler never fires in it
    slow = "SELECT instr(printf('%.*c', 20000000, 'a'), printf('%.*c', 10000, 'a') || 'b')"
    t0 = time.perf_counter()
    assert sql_reward("", slow, db=db, query=REF, timeout_s=0.3) == 0.0
    assert time.perf_counter() - t0 < 0.3 + sql_module.KILL_GRACE_S + 1.0


def test_results_are_capped(db):
    many = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 20000) SELECT x FROM c"
    rows, err = run_query(db, many, max_rows=10_000)
    assert rows is None and "more than 10000 rows" in err
    wide = "SELECT printf('%.*c', 1000000, 'x') FROM employees"
    rows, err = run_query(db, wide)
    assert rows is None and "larger than" in err
    assert sql_reward("", many, db=db, query=REF) == 0.0


@pytest.mark.parametrize(
    "out",
    [
        "",
        "junk",
        "[1, 2]",
        '{"rows": 5}',
        '{"rows": [[["i", "x"]]]}',
        '{"rows": [[["?", 1]]]}',
        '{"rows": [1]}',
        "[" * 100000,
    ],
)
def test_malformed_worker_output_scores_zero_and_is_counted(db, tmp_path, monkeypatch, out):
    with pytest.raises(Malformed):
        parse_rows(out, 10)
    fake = tmp_path / "worker.py"
    fake.write_text(f"print({out!r})")
    sql_module.reference_rows(db, REF)  # computed by the real worker, once
    monkeypatch.setattr(sql_module, "WORKER", fake)
    assert sql_reward("", REF, db=db, query=REF) == 0.0
    scores = sql_reward.batch([""] * 2, [REF, REF], [{"db": db, "query": REF}] * 2)
    assert scores == [0.0, 0.0] and scores.flags == {"killed": [False, False], "malformed": [True, True]}


def test_batch_scores_like_one_at_a_time(db):
    completions = [REF, "SELECT 1", "DROP TABLE employees", "SELECT name FROM employees WHERE salary > 80000"]
    fields = [{"db": db, "query": REF}] * len(completions)
    assert sql_reward.batch([""] * 4, completions, fields) == [1.0, 0.0, 0.0, 1.0]

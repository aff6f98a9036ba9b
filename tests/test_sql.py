import hashlib
import time

import pytest

from nanorl.tasks.sql import build_db, extract_sql, run_query, same_result, sql_reward, sql_task


@pytest.fixture()
def db(tmp_path):
    return str(build_db(tmp_path / "company.db"))


def _digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


REF = "SELECT name FROM employees WHERE salary > 80000"


def test_right_wrong_and_malformed_queries(db):
    assert sql_reward("", "```sql\nSELECT name FROM employees WHERE salary > 80000;\n```", db=db, query=REF) == 1.0
    # the same set in another order and with another spelling still matches (no ORDER BY in the reference)
    assert sql_reward("", "SELECT e.name FROM employees AS e WHERE 80000 < e.salary ORDER BY e.name DESC",
                      db=db, query=REF) == 1.0
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
    attacks = ["DROP TABLE employees", "DELETE FROM employees", "UPDATE employees SET salary = 0",
               "INSERT INTO departments VALUES (9, 'X', 'Y')", "SELECT 1; DROP TABLE employees",
               f"ATTACH DATABASE '{tmp_path / 'evil.db'}' AS evil", "PRAGMA writable_schema = ON",
               "CREATE TABLE t (x)", "VACUUM INTO '/tmp/nanorl_sql_copy.db'",
               "SELECT load_extension('/tmp/x.so')"]
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

import csv
import json

import pytest

from nanorl.tasks import get_task
from nanorl.tasks.files import file_task


def test_jsonl_csv_and_field_mapping(tmp_path):
    rows = [{"question": f"What is {i} + 1?", "solution": i + 1} for i in range(10)]
    j = tmp_path / "rows.jsonl"
    j.write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = tmp_path / "rows.csv"
    with open(c, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["question", "solution"])
        w.writeheader()
        w.writerows(rows)
    for path in (j, c):
        task = file_task(path, prompt_field="question", answer_field="solution", eval_size=3)
        assert len(task.eval) == 3 and len(task.train) == 7
        ex = task.train[0]
        assert "answer" in ex.fields and task.score([ex], [f"= {ex.fields['answer']}"]) == [1.0]


def test_parquet_and_dataset_folder(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"prompt": f"p{i}", "answer": i} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    assert len(get_task(str(tmp_path / "rows.parquet"), eval_size=2).train) == 4
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    assert len(get_task(str(tmp_path / "ds"), eval_size=2).eval) == 2


def test_bad_data_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        get_task(str(tmp_path / "missing.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        get_task(str(empty))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "hi"}) + "\n" + json.dumps({"text": "yo"}) + "\n")
    with pytest.raises(ValueError, match=r"row 1 has no field 'prompt'.*\['text'\]"):
        get_task(str(bad))
    with pytest.raises(ValueError, match="unknown task 'mystery'"):
        get_task("mystery")


def test_gsm8k_loader(tmp_path):
    f = tmp_path / "gsm8k.jsonl"
    f.write_text(
        "".join(
            json.dumps({"question": f"Q{i}?", "answer": f"steps <<1+1=2>>\n#### {i},000"}) + "\n" for i in range(1, 9)
        )
    )
    task = get_task(f"gsm8k:{f}", eval_size=2)
    ex = task.train[0]
    assert ex.fields["answer"].endswith(",000")
    assert task.score([ex], [f"so the total is {ex.fields['answer']}"]) == [1.0]
    assert task.score([ex], ["#### 0"]) == [0.0]
    f.write_text(json.dumps({"question": "Q", "answer": "no marker"}) + "\n")
    with pytest.raises(ValueError, match="####"):
        get_task(f"gsm8k:{f}")

"""The README's Python blocks run as written (in a scratch folder), and its set-up commands exist."""

import os
import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert (tmp_path / "runs" / "readme" / "metrics.jsonl").is_file()


def test_readme_starts_with_the_two_setup_commands():
    first = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    lines = [line for line in first.splitlines() if line.strip() and not line.startswith("#")]
    assert len(lines) == 2
    assert lines[0].startswith("pip install torch==2.13.0") and lines[0].endswith("nanorl train")
    assert "pytest" in lines[1]
    assert os.access(Path(__file__).parents[1] / ".ci" / "run", os.X_OK)

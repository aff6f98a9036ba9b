"""The core stays small enough to read over a coffee: at most 2,000 lines of code (DEVELOPERS.md), counted
without blank lines, comments or docstrings. The core is nanorl/*.py plus the Task and reward-spec machinery
(tasks/__init__.py); the built-in verifiers (tasks/*), the speed-ups (backends/) and the integrations
(integrations/) live beside it with their own counts, printed by `python tests/test_size.py` (README)."""

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1] / "nanorl"
BUDGET, PER_FILE = 2000, 350


def code_lines(path: Path) -> int:
    """Lines holding code: not blank, not a comment, not inside a docstring."""
    text = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(1 for i, line in enumerate(text.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in docstrings)


def parts() -> dict[str, list[Path]]:
    core = sorted(ROOT.glob("*.py")) + [ROOT / "tasks" / "__init__.py"]
    return {"core": core,
            "tasks (built-in verifiers)": sorted(p for p in (ROOT / "tasks").glob("*.py") if p.name != "__init__.py"),
            "backends": sorted((ROOT / "backends").glob("*.py")),
            "integrations": sorted((ROOT / "integrations").glob("*.py"))}


def test_core_size_budget():
    core = parts()["core"]
    total = sum(code_lines(p) for p in core)
    assert total <= BUDGET, f"core is {total} code lines (budget {BUDGET:,})"
    for p in core:
        assert code_lines(p) <= PER_FILE, f"{p.name} has {code_lines(p)} code lines (keep files under {PER_FILE})"


def test_docstrings_and_comments_are_not_counted(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""Module\n\ndoc."""\n\nimport os  # a comment\n\n\ndef g():\n    """One."""\n    # note\n    return os\n')
    assert code_lines(f) == 3


if __name__ == "__main__":
    for name, files in parts().items():
        print(f"{name}: {sum(code_lines(p) for p in files)} code lines in {len(files)} files")

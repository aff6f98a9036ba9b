"""The core stays small enough to read over a coffee (DEVELOPERS.md: about 2,000 lines)."""

from pathlib import Path

CORE = Path(__file__).parents[1] / "nanorl"


def _code_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))


def test_core_size_budget():
    files = [p for p in CORE.rglob("*.py") if not {"tasks", "backends"} & set(p.relative_to(CORE).parts)]
    total = sum(_code_lines(p) for p in files)
    assert total <= 2000, f"core is {total} code lines (budget 2,000)"
    for p in files:
        assert _code_lines(p) <= 350, f"{p.name} has {_code_lines(p)} code lines (keep files under 350)"

"""What a reader of the default run must read stays within a budget (issue 34): a default `nanorl train` (on the
tiny model, one step) runs in a subprocess, lists the nanorl modules it imported, and their code lines are counted
(no blank lines, comments or docstrings). The CPU fast paths in backends/ (each with a plain-torch twin behind
`--backend torch`) are counted apart. Every optional feature loads only when it is used: the second test lists
what the default run must not import. `python tests/test_size.py` prints the table (README, How it is built)."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
BUDGET, PER_MODULE = 2500, 350
# What the default run never uses: offline methods, preference and reply readers, reward models, LoRA, FSDP,
# trackers beyond the console, plot, report, the code sandbox and SQL, and the engines and tools to come.
OPTIONAL = (
    "nanorl.dpo",
    "nanorl.sft",
    "nanorl.offline",
    "nanorl.reward_model",
    "nanorl.tasks.preferences",
    "nanorl.integrations.lora",
    "nanorl.backends.fsdp",
    "nanorl.integrations.trackers",
    "nanorl.integrations.plot",
    "nanorl.integrations.report",
    "nanorl.tasks.sandbox",
    "nanorl.tasks.code",
    "nanorl.tasks.sql",
    "nanorl.tasks.math_answer",
    "nanorl.tasks.files",
)
OPTIONAL_WORDS = ("vllm", "engine", "tool", "environment", "agent")  # in a module's name
OPTIONAL_PACKAGES = ("peft", "vllm", "tensorboard", "wandb", "trackio", "matplotlib", "trl", "math_verify")

RUN = """
import json, sys
from nanorl.cli import main
main(["train", "--model", "tiny", "--steps", "1", "--prompts-per-step", "2", "--samples-per-prompt", "2",
      "--max-new-tokens", "4", "--eval-size", "2", "--out-dir", sys.argv[1]])
files = {n: m.__file__ for n, m in sys.modules.items() if n.split(".")[0] == "nanorl" and getattr(m, "__file__", None)}
print("MODULES " + json.dumps({"nanorl": files, "others": sorted(sys.modules)}))
"""


def code_lines(path: Path) -> int:
    """Lines holding code: not blank, not a comment, not inside a docstring."""
    text = Path(path).read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(
        1
        for i, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and i not in docstrings
    )


def default_run(out_dir) -> dict:
    """{"nanorl": {module: file} imported by a default `nanorl train` (tiny model, one step), "others": [names]}."""
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(out_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "TQDM_DISABLE": "1"},
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("MODULES ")), None)
    assert done.returncode == 0 and line, done.stderr[-3000:]
    return json.loads(line[len("MODULES ") :])


def reading_path(modules: dict) -> tuple[list[tuple[int, str]], int, int]:
    """-> ((code lines, module) per module, largest first; the core's total; the backends' total)."""
    rows = sorted(((code_lines(f), name) for name, f in modules.items() if f.endswith(".py")), reverse=True)
    backends = sum(n for n, name in rows if name.startswith("nanorl.backends"))
    return rows, sum(n for n, _ in rows) - backends, backends


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return default_run(tmp_path_factory.mktemp("default_run"))


def test_the_default_run_reads_at_most_the_budget(imported):
    rows, core, _ = reading_path(imported["nanorl"])
    assert core <= BUDGET, f"the default run reads {core} code lines (budget {BUDGET:,}): {rows}"
    for n, name in rows:
        assert n <= PER_MODULE, f"{name} has {n} code lines (at most {PER_MODULE} a module)"


def test_optional_features_load_only_when_used(imported):
    names = set(imported["nanorl"])
    loaded = sorted(names & set(OPTIONAL)) + sorted(n for n in names if any(w in n for w in OPTIONAL_WORDS))
    loaded += [p for p in OPTIONAL_PACKAGES if p in imported["others"]]
    assert not loaded, f"the default run imported optional features: {loaded}"


def test_docstrings_and_comments_are_not_counted(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        '"""Module\n\ndoc."""\n\nimport os  # a comment\n\n\ndef g():\n    """One."""\n    # note\n    return os\n'
    )
    assert code_lines(f) == 3


def import_edges(package: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (at module level or inside a function), parents excepted."""
    mods = {
        ".".join(p.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in package.rglob("*.py")
    }
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        here = m if p.name == "__init__.py" else m.rpartition(".")[0]  # the package a relative import starts from
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges[m] |= {t for t in targets if t in mods and t != m and not m.startswith(t + ".")}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle (a list of modules ending where it starts), or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]):
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                return path[path.index(t) :] + [t]
            if t not in state and (found := visit(t, path + [t])):
                return found
        state[m] = 2
        return None

    return next((c for m in sorted(edges) if m not in state and (c := visit(m, [m]))), None)


def test_no_import_circles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check itself
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    cycle = find_cycle(import_edges(ROOT / "nanorl"))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_core_imports_no_integration_at_module_level():
    for path in (ROOT / "nanorl").glob("*.py"):
        for node in ast.parse(path.read_text()).body:  # module-level statements only
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            bad = [n for n in names if n.startswith("nanorl.integrations")]
            assert not bad, f"{path.name} imports {bad} at module level (import it where the feature is used)"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        rows, core, backends = reading_path(default_run(out)["nanorl"])
    for n, name in rows:
        print(f"{n:5d}  {name}")
    print(
        f"reading path: {core} code lines in {len(rows)} modules, backends/ apart: {backends} (budget {BUDGET:,}, "
        f"at most {PER_MODULE} a module)"
    )

"""The code is formatted and linted by ruff (pyproject.toml: line length 120, pycodestyle, pyflakes, isort, bugbear),
so CI fails on an unformatted file, a lint finding, or a line over 120 characters."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None, reason="ruff (the dev extra) is not installed"
)


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_format():
    done = ruff("format", "--check", ".")
    assert done.returncode == 0, f"`ruff format .` would change files:\n{done.stdout}{done.stderr}"


def test_ruff_check():
    done = ruff("check", ".")
    assert done.returncode == 0, f"`ruff check .` finds:\n{done.stdout}{done.stderr}"

"""Where nanorl keeps what it makes once and reuses: converted models (hub.py), the compiled CPU
decode kernels (backends/decode.py) and the SQL task's database (tasks/sql.py).

NANORL_CACHE, else $XDG_CACHE_HOME/nanorl, else ~/.cache/nanorl.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("NANORL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nanorl"
    return Path(root)

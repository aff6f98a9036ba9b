"""Plot a run: training reward and held-out accuracy against steps and wall-clock minutes.

    nanorl plot runs/grpo            # writes runs/grpo/curve.png (needs matplotlib: pip install matplotlib)
"""

from __future__ import annotations

import json
from pathlib import Path


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("nanorl plot needs matplotlib: pip install matplotlib") from None
    run_dir = Path(run_dir)
    for name in ("metrics.jsonl", "eval.jsonl"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir / name} not found: is {run_dir} a nanorl run folder?")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    minutes = {m["step"]: m["time/elapsed"] / 60 for m in metrics}
    minutes[0] = 0.0
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, x_of, label in ((axes[0], lambda s: s, "step"), (axes[1], lambda s: minutes.get(s, 0.0), "minutes")):
        ax.plot([x_of(m["step"]) for m in metrics], [m["reward/mean"] for m in metrics], alpha=0.5,
                label="train reward (mean)")
        ax.plot([x_of(e["step"]) for e in evals], [e["eval/greedy_acc"] for e in evals], "o-",
                label="held-out greedy accuracy")
        ax.set_xlabel(label)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = Path(out) if out else run_dir / "curve.png"
    fig.savefig(out, dpi=110)
    return out

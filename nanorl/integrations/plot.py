"""Plot runs: every curve a run folder has, against steps, one panel each, several runs overlaid.

    nanorl plot runs/grpo                       # writes runs/grpo/curve.png (needs matplotlib)
    nanorl plot runs/grpo runs/dapo --out cmp.png   # two runs on the same axes

Works on the folder of any command (train, ppo, dpo, sft, rm): a panel is drawn for each series below that
the runs have, and its axes fit the data.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

# (file, key, title): a panel for each series that some run has, unless it is 0 throughout (a KL when none was used).
SERIES = [
    ("metrics", "reward/mean", "train reward (mean)"),
    ("eval", "eval/greedy_acc", "held-out greedy accuracy"),
    ("eval", "eval/sampled_acc", "held-out sampled accuracy"),
    ("eval", "eval/task_greedy_acc", "held-out task greedy accuracy"),
    ("eval", "eval/reward_acc", "held-out implicit-reward accuracy"),
    ("eval", "eval/pref_acc", "held-out preference accuracy"),
    ("metrics", "train/loss", "train loss"),
    ("eval", "eval/loss", "held-out loss"),
    ("eval", "eval/nll_per_token", "held-out NLL per token"),
    ("metrics", "loss/kl", "KL to the reference (loss)"),
    ("metrics", "reward/kl_penalty", "KL penalty in the reward"),
    ("metrics", "policy/entropy", "policy entropy (nats)"),
    ("metrics", "rollout/len_mean", "completion length (tokens)"),
    ("metrics", "policy/clip_frac", "clip fraction"),
    ("metrics", "time/step", "seconds per step"),
]


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _points(rows: list[dict], key: str) -> tuple[list, list]:
    pts = [(r["step"], float(r[key])) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [s for s, _ in pts], [v for _, v in pts]


def runs_figure(run_dirs: list):
    """The figure `nanorl plot` saves, as a matplotlib Figure (no pyplot, no global backend); ImportError
    without matplotlib."""
    from matplotlib.figure import Figure

    runs = [Path(d) for d in run_dirs]
    for d in runs:
        if not (d / "metrics.jsonl").is_file():
            raise FileNotFoundError(f"{d / 'metrics.jsonl'} not found: is {d} a nanorl run folder?")
    data = {d: {"metrics": _read(d / "metrics.jsonl"), "eval": _read(d / "eval.jsonl")} for d in runs}
    panels = [(f, k, t) for f, k, t in SERIES if any(v != 0 for d in runs for v in _points(data[d][f], k)[1])]
    cols = min(3, len(panels)) or 1
    rows = -(-len(panels) // cols) or 1
    fig = Figure(figsize=(4.2 * cols, 3.0 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (f, key, title) in zip(axes.flat, panels):
        for d in runs:
            x, y = _points(data[d][f], key)
            ax.plot(x, y, "o-" if f == "eval" else "-", ms=3, alpha=0.8, label=d.name)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if len(runs) > 1:
        axes.flat[0].legend(fontsize=7)
    fig.suptitle(", ".join(d.name for d in runs))
    fig.tight_layout()
    return fig


def plot_runs(run_dirs: list, out: str | Path | None = None) -> Path:
    try:
        fig = runs_figure(run_dirs)
    except ImportError:
        raise SystemExit("nanorl plot needs matplotlib: pip install matplotlib") from None
    runs = [Path(d) for d in run_dirs]
    out = Path(out) if out else (runs[0] / "curve.png" if len(runs) == 1 else Path("curves.png"))
    fig.savefig(out, dpi=110)
    return out


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """One run: RUN_DIR/curve.png unless `out` is given."""
    return plot_runs([run_dir], out)


def main(argv: list[str]) -> None:
    """`nanorl plot RUN_DIR [RUN_DIR ...] [--out PNG]`."""
    import argparse

    p = argparse.ArgumentParser(prog="nanorl plot", description="Plot run folders' curves, overlaid.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", help="PNG path (default: RUN_DIR/curve.png for one run, curves.png for several)")
    a = p.parse_args(argv)
    print(plot_runs(a.run_dirs, a.out))

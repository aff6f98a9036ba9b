"""The report of a run: one self-contained HTML page to read after the run, offline, in any browser.

    nanorl report runs/grpo                  # writes runs/grpo/report.html
    nanorl report runs/grpo --out grpo.html

    from nanorl.integrations.report import write_report
    write_report("runs/grpo")                # -> Path("runs/grpo/report.html")

What is on it: what was run (command, model, task), the held-out evaluation before -> after, the curves
(`nanorl plot`'s figure, embedded as a PNG), completions with their rewards at several points of the run
(samples.jsonl) and from the last evaluation (eval_samples.jsonl), the config and results.json. Works on the
folder of any command (train, ppo, dpo, sft, rm); a section the run has nothing for is left out. No scripts,
no external links: images are data: URIs and every text (completions are model output) is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from nanorl.integrations.plot import _read, runs_figure

STYLE = """body{font:14px/1.45 system-ui,sans-serif;max-width:1240px;margin:1.5em auto;padding:0 1em;color:#222}
h1{margin:0 0 .2em}h2{margin:1.4em 0 .4em;border-bottom:1px solid #ddd}.sub{color:#555;margin:0}
table{border-collapse:collapse;margin:.3em 1.2em .3em 0}th,td{border:1px solid #ddd;padding:3px 8px;
text-align:left;vertical-align:top;white-space:pre-wrap;max-width:36em}th{background:#f3f3f3}td.n{text-align:right;
font-variant-numeric:tabular-nums}.row{display:flex;flex-wrap:wrap;align-items:flex-start}img{max-width:100%}"""


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _td(v) -> str:
    return f"<td{' class=n' if _is_number(v) else ''}>{html.escape(_fmt(v))}</td>"


def _table(header: list, rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    return f"<table><tr>{head}</tr>" + "".join("<tr>" + "".join(map(_td, r)) + "</tr>" for r in rows) + "</table>"


def _section(title: str, body: str, note: str = "") -> str:
    note = f'<p class="sub">{html.escape(note)}</p>' if note else ""
    return f"<h2>{html.escape(title)}</h2>{note}{body}\n" if body else ""


def _command(cfg: dict, evals: list[dict]) -> str:
    """Which command wrote the folder, told from its config's fields (and, for rm vs sft, its eval keys)."""
    if "algo" in cfg:
        return f"train --algo {cfg['algo']}"
    if "gae_lambda" in cfg:
        return "ppo"
    if "beta" in cfg:
        return f"dpo --loss {cfg.get('loss', 'sigmoid')}"
    return "rm" if any("eval/pref_acc" in e for e in evals) else "sft" if "data" in cfg else "?"


def _evaluation(evals: list[dict]) -> str:
    """Every eval/ key at the first and the last evaluation, and the change."""
    if not evals:
        return ""
    first, last = evals[0], evals[-1]
    keys = list(dict.fromkeys(k for e in (first, last) for k in e if k.startswith("eval/")))
    rows = [
        [
            k,
            first.get(k, ""),
            last.get(k, ""),
            last[k] - first[k] if _is_number(first.get(k)) and _is_number(last.get(k)) else "",
        ]
        for k in keys
    ]
    return _table(["", f"before (step {first.get('step')})", f"after (step {last.get('step')})", "change"], rows)


def _charts(run_dir: Path) -> str:
    try:
        fig = runs_figure([run_dir])
    except ImportError:
        return "<p>No charts: matplotlib is not installed (pip install matplotlib).</p>"
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return f'<img alt="curves of the run" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _episode(messages: list[dict]) -> str:
    """An episode after its prompt as text (agents/): each reply with the tools it called, each tool's result."""
    lines = []
    for m in messages:
        if m["role"] == "assistant":
            calls = [
                f"{c['function']['name']}({json.dumps(c['function']['arguments'])})" for c in m.get("tool_calls", [])
            ]
            lines.append(" ".join(["model:", m["content"], *(f"[calls {c}]" for c in calls)]))
        elif m["role"] == "tool":
            lines.append(f"  {m.get('name', 'tool')} -> {m['content']}")
    return "\n".join(lines)


def _records(samples: list[dict], keys: tuple) -> str:
    """Sample records as a table: a column for each of `keys` that some record has; an episode with tools shows every
    turn in its completion column."""
    cols = [k for k in keys if any(k in s for s in samples)]
    rows = [
        [_episode(s["messages"]) if k == "completion" and "messages" in s else s.get(k, "") for k in cols]
        for s in samples
    ]
    return _table(cols, rows) if samples else ""


def _samples(samples: list[dict], points: int = 5, per_point: int = 3) -> str:
    """A few completions at `points` steps spread over the run: the first, the last and between."""
    steps = sorted({s.get("step", 0) for s in samples})
    chosen = sorted({steps[round(i * (len(steps) - 1) / max(points - 1, 1))] for i in range(points)}) if steps else []
    shown = [s for st in chosen for s in [s for s in samples if s.get("step", 0) == st][:per_point]]
    return _records(shown, ("step", "prompt", "completion", "reward", "truncated", "tool_calls"))


def _flat(d: dict, prefix: str = "") -> list[list]:
    return [r for k, v in d.items() for r in (_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [[prefix + k, v]])]


def _columns(rows: list[list], n: int = 3) -> str:
    """A long key/value table as n tables side by side."""
    size = -(-len(rows) // n) or 1
    tables = "".join(_table(["key", "value"], rows[i : i + size]) for i in range(0, len(rows), size))
    return f'<div class="row">{tables}</div>' if rows else ""


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the run's report (RUN_DIR/report.html unless `out` is given) and return its path."""
    run = Path(run_dir)
    if not (run / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{run / 'metrics.jsonl'} not found: is {run} a nanorl run folder?")
    cfg, results = _json(run / "config.json"), _json(run / "results.json")
    evals, steps = _read(run / "eval.jsonl"), len(_read(run / "metrics.jsonl"))
    held_out = _read(run / "eval_samples.jsonl")[:8]
    task = cfg.get("task") or cfg.get("data", "?")
    wall = f", {results['wall_s'] / 60:.1f} min wall time" if _is_number(results.get("wall_s")) else ""
    about = f"nanorl {_command(cfg, evals)} · model {cfg.get('model', '?')} · task {task} · {steps} steps{wall}"
    page = [
        f"<h1>{html.escape(run.name)}</h1><p class=sub>{html.escape(about)}</p>\n",
        _section("Held-out evaluation", _evaluation(evals)),
        _section("Curves", _charts(run)),
        _section(
            "Completions during training",
            _samples(_read(run / "samples.jsonl")),
            "samples.jsonl: a few sampled completions at steps spread over the run, with their rewards",
        ),
        _section(
            "Held-out completions",
            _records(held_out, ("prompt", "completion", "reward", "answer", "tool_calls")),
            "eval_samples.jsonl: greedy completions at the last evaluation",
        ),
        _section("Config", _columns(list(map(list, cfg.items())))),
        _section("Results", _columns(_flat(results), 2), "results.json"),
    ]
    out = Path(out) if out else run / "report.html"
    head = f"<meta charset=utf-8><title>nanorl report: {html.escape(run.name)}</title><style>{STYLE}</style>"
    out.write_text(
        f"<!doctype html>\n<html><head>{head}</head><body>\n" + "".join(page) + "</body></html>\n", encoding="utf-8"
    )
    return out


def main(argv: list[str]) -> None:
    """`nanorl report RUN_DIR [--out HTML]`."""
    import argparse

    p = argparse.ArgumentParser(prog="nanorl report", description="A run folder as one HTML page.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--out", help="HTML path (default: RUN_DIR/report.html)")
    a = p.parse_args(argv)
    print(write_report(a.run_dir, a.out))

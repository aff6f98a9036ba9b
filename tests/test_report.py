"""`nanorl report`: the HTML page of a run folder, on small fake folders of a GRPO and a DPO run (no training),
and the page as headless Chromium shows it (skipped where Debian's `chromium` is not installed)."""

import json
import shutil
import subprocess
import sys

import pytest

from nanorl.cli import main
from nanorl.integrations.report import write_report

EVIL = "<script>alert('pwned')</script> & more"


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def grpo_run(root):
    d = root / "grpo_run"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"model": "smollm2-135m", "task": "arithmetic", "algo": "grpo", "steps": 9, "lr": 2e-05})
    )
    _jsonl(
        d / "metrics.jsonl",
        [
            {
                "step": s,
                "reward/mean": s / 10,
                "policy/entropy": 2 - s / 10,
                "rollout/len_mean": 30 - s,
                "time/step": 5.0,
            }
            for s in range(1, 10)
        ],
    )
    _jsonl(
        d / "eval.jsonl",
        [
            {"step": 0, "eval/greedy_acc": 0.07, "eval/len_mean": 31.125},
            {"step": 9, "eval/greedy_acc": 0.74, "eval/len_mean": 11.67},
        ],
    )
    _jsonl(
        d / "samples.jsonl",
        [
            {
                "step": s,
                "prompt": f"What is {s} + {s}?",
                "completion": f"step {s} says {2 * s}",
                "reward": 1.0,
                "truncated": False,
            }
            for s in range(1, 10)
            for _ in range(2)
        ]
        + [{"step": 9, "prompt": "evil?", "completion": EVIL, "reward": 0.0, "truncated": True}],
    )
    _jsonl(
        d / "eval_samples.jsonl",
        [{"prompt": "What is 25 + 60?", "completion": "25 + 60 = 95", "reward": 0.0, "answer": 85}],
    )
    (d / "results.json").write_text(
        json.dumps(
            {"steps": 9, "wall_s": 450.0, "before": {"eval/greedy_acc": 0.07}, "after": {"eval/greedy_acc": 0.74}}
        )
    )
    return d


def dpo_run(root):
    d = root / "dpo_run"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"model": "tiny", "data": "builtin:arithmetic", "task": "arithmetic", "loss": "ipo", "beta": 0.1})
    )
    _jsonl(d / "metrics.jsonl", [{"step": s, "train/loss": 0.7 - s / 10, "train/acc": 0.5} for s in (1, 2, 3)])
    _jsonl(
        d / "eval.jsonl",
        [
            {"step": 0, "eval/loss": 0.6931, "eval/reward_acc": 0.0, "eval/task_greedy_acc": 0.07},
            {"step": 3, "eval/loss": 0.1959, "eval/reward_acc": 0.9625, "eval/task_greedy_acc": 0.2},
        ],
    )
    (d / "samples.jsonl").write_text("")  # the logger opens it for every command
    return d


def test_grpo_report_has_every_section_and_escapes_completions(tmp_path):
    page = write_report(grpo_run(tmp_path))
    assert page == tmp_path / "grpo_run" / "report.html"
    text = page.read_text()
    for part in (
        "<h1>grpo_run</h1>",
        "nanorl train --algo grpo",
        "smollm2-135m",
        "arithmetic",
        "7.5 min wall time",
        "Held-out evaluation",
        "before (step 0)",
        "after (step 9)",
        "eval/greedy_acc",
        "0.07",
        "0.74",
        "0.67",
        "Completions during training",
        "step 1 says 2",
        "step 9 says 18",
        "Held-out completions",
        "25 + 60 = 95",
        "Config",
        "2e-05",
        "Results",
        "after.eval/greedy_acc",
        "450",
    ):
        assert part in text, part
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt; &amp; more" in text
    assert "<script" not in text and "http://" not in text and "https://" not in text  # self-contained, no JS
    if "matplotlib is not installed" not in text:
        assert 'src="data:image/png;base64,' in text


def test_samples_are_taken_at_several_points_of_the_run(tmp_path):
    text = write_report(grpo_run(tmp_path), tmp_path / "r.html").read_text()
    shown = {s for s in range(1, 10) if f"step {s} says" in text}
    assert shown == {1, 3, 5, 7, 9}  # first, last and evenly between
    assert not (tmp_path / "grpo_run" / "report.html").exists()


def test_dpo_report_leaves_out_the_samples(tmp_path):
    text = write_report(dpo_run(tmp_path)).read_text()
    assert "nanorl dpo --loss ipo" in text and "eval/reward_acc" in text and "0.9625" in text
    assert "eval/task_greedy_acc" in text and "Completions during training" not in text
    assert "Held-out completions" not in text and "Results" not in text  # no eval_samples.jsonl, no results.json


def test_report_without_matplotlib_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    text = write_report(dpo_run(tmp_path)).read_text()
    assert "matplotlib is not installed" in text and "eval/reward_acc" in text


def test_cli_report_and_its_error(tmp_path, capsys):
    run = dpo_run(tmp_path)
    main(["report", str(run), "--out", str(tmp_path / "dpo.html")])
    assert capsys.readouterr().out.strip() == str(tmp_path / "dpo.html") and (tmp_path / "dpo.html").is_file()
    with pytest.raises(SystemExit) as e:
        main(["report", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("nanorl: error:") and "metrics.jsonl" in err and err.count("\n") == 1


CHROMIUM = [
    "chromium",
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def test_report_in_headless_chromium(tmp_path):
    if not shutil.which("chromium", path="/usr/bin"):
        pytest.skip("Debian's chromium is not installed (/usr/bin/chromium): apt-get install chromium")
    page = write_report(grpo_run(tmp_path))
    run = [*CHROMIUM, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*run, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    for part in (
        "grpo_run",
        "nanorl train --algo grpo",
        "Held-out evaluation",
        "0.74",
        "step 9 says 18",
        "&lt;script&gt;alert(",
        "Config",
    ):
        assert part in dom, part
    assert "<script>alert(" not in dom  # the completion is text, not a script
    png = tmp_path / "shot.png"
    subprocess.run(
        [*run, f"--screenshot={png}", "--window-size=1200,2000", page.as_uri()], capture_output=True, timeout=120
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_an_episode_with_tools_is_shown_turn_by_turn(tmp_path):
    """samples.jsonl and eval_samples.jsonl of a run with tools: every reply, call and result in the report."""
    call = {"type": "function", "function": {"name": "guess", "arguments": {"number": 16}}}
    messages = [
        {"role": "user", "content": "Find it."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "guess", "content": "<lower>"},
        {"role": "assistant", "content": "It is 8."},
    ]
    sample = {"prompt": "Find it.", "completion": "It is 8.", "reward": 1.0, "messages": messages, "tool_calls": 1}
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 1.0}) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"algo": "grpo", "model": "tiny", "task": "guess"}))
    (tmp_path / "samples.jsonl").write_text(json.dumps({"step": 1, **sample}) + "\n")
    (tmp_path / "eval_samples.jsonl").write_text(json.dumps(sample) + "\n")
    page = write_report(tmp_path).read_text()
    episode = "model:  [calls guess({&quot;number&quot;: 16})]\n  guess -&gt; &lt;lower&gt;\nmodel: It is 8."
    assert page.count(episode) == 2  # during training and held out, the tool's text escaped

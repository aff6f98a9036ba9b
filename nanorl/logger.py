"""Loggers: what the loops call to record a run. metrics.jsonl / eval.jsonl / samples.jsonl in the run folder
always, warnings a practitioner needs read off every step's metrics, a one-line summary of every step on the
console, and trackers (TensorBoard, W&B: integrations/trackers.py) when asked; processes that are not the main one
record nothing.

    logger = make_logger(out_dir, report_to="console,tensorboard", append=resuming, total_steps=40, config=cfg)
    logger.log(metrics, step)                        # metrics.jsonl: one line per step
    logger.log_eval(metrics, step)                   # eval.jsonl: one line per evaluation
    logger.log_samples(records, step)                # samples.jsonl: a few completions with their rewards
    logger.close()

A new tracker implements these methods (and rewind) and joins TRACKERS in integrations/trackers.py.

Warnings: each rule (RULES) looks at a window of recent steps, so one noisy step does not fire it; a step where one
holds gets `warn/<name>: 1` in metrics.jsonl and the console says it once. The thresholds are set so that the
default run (7% -> 74% held-out accuracy) fires none (tests/test_warnings.py replays its metrics).
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm.auto import tqdm

from nanorl import distributed


class Logger:
    """The interface, doing nothing: a logger overrides what it records. Loggers([]) is the silent one."""

    def log(self, metrics: dict, step: int) -> None:
        """A step's metrics, after the step (`step` counts from 1)."""

    def log_eval(self, metrics: dict, step: int) -> None:
        """An evaluation's metrics (step 0: before any training)."""

    def log_samples(self, records: list[dict], step: int) -> None:
        """A few of the step's completions with their rewards."""

    def rewind(self, step: int) -> None:
        """A run resumed from its checkpoint of `step`: forget what was recorded after that step."""

    def close(self) -> None:
        """The run is over: flush and release what the logger holds."""


class JsonlLogger(Logger):
    def __init__(self, out_dir: Path, append: bool = False):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        mode = "a" if append else "w"
        self.files = {name: open(self.dir / f"{name}.jsonl", mode) for name in ("metrics", "samples", "eval")}

    def _write(self, name: str, record: dict) -> None:
        f = self.files[name]
        f.write(json.dumps(record, default=float) + "\n")
        f.flush()

    def log(self, metrics: dict, step: int) -> None:
        self._write("metrics", {"step": step, **metrics})

    def log_eval(self, metrics: dict, step: int) -> None:
        self._write("eval", {"step": step, **metrics})

    def log_samples(self, records: list[dict], step: int) -> None:
        for r in records:
            self._write("samples", {"step": step, **r})

    def rewind(self, step: int) -> None:
        """On resume from the checkpoint of `step`: drop every line of a later step (written after the checkpoint
        by the run that stopped), so no step appears twice and none is missing."""
        for name, f in self.files.items():
            f.close()
            path = self.dir / f"{name}.jsonl"
            lines = [x for x in path.read_text().splitlines(keepends=True) if json.loads(x).get("step", 0) <= step]
            path.write_text("".join(lines))
            self.files[name] = open(path, "a")

    def close(self) -> None:
        for f in self.files.values():
            f.close()


class Loggers(Logger):
    """Several loggers as one: each call goes to every one of them, in order."""

    def __init__(self, loggers: list):
        self.loggers = loggers

    def _each(self, method: str, *args) -> None:
        for lg in self.loggers:
            getattr(lg, method)(*args)

    def log(self, metrics: dict, step: int) -> None:
        self._each("log", metrics, step)

    def log_eval(self, metrics: dict, step: int) -> None:
        self._each("log_eval", metrics, step)

    def log_samples(self, records: list[dict], step: int) -> None:
        self._each("log_samples", records, step)

    def rewind(self, step: int) -> None:
        self._each("rewind", step)

    def close(self) -> None:
        self._each("close")


class Callback(Logger):
    """A function called as fn(step, metrics) after every step: train(cfg, callbacks=[fn])."""

    def __init__(self, fn):
        self.fn = fn

    def log(self, metrics: dict, step: int) -> None:
        self.fn(step, metrics)


# ---------------------------------------------------------------------------- the console line


# The console line: (metric, label, format), the first of each row's keys that a step has.
CONSOLE = (
    (("reward/mean",), "reward", "{:.3f}"),
    (("reward/acc",), "acc", "{:.2f}"),
    (("train/loss",), "loss", "{:.4f}"),
    (("train/acc",), "acc", "{:.2f}"),
    (("rollout/len_mean",), "len", "{:.0f}"),
    (("loss/kl", "reward/kl_penalty"), "kl", "{:.4f}"),
    (("optim/skipped_updates",), "skipped", "{:d}"),
    (("time/step",), "", "{:.1f} s"),
)


def console_line(metrics: dict, step: int, total: int | None) -> str:
    """'step 12/40 reward 0.340 acc 0.31 len 14 kl 0.0020 7.6 s' from a step's metrics."""
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    for keys, label, fmt in CONSOLE:
        key = next((k for k in keys if k in metrics and (label != "kl" or metrics[k])), None)
        if key is not None and (label != "skipped" or metrics[key]):
            parts.append((f"{label} " if label else "") + fmt.format(metrics[key]))
    return " ".join(parts)


class ConsoleLogger(Logger):
    """One line per step beside the progress bar, also when the output is not a terminal (logs, CI, nohup); the
    loops print their evaluations themselves."""

    def __init__(self, total_steps: int | None = None):
        self.total = total_steps

    def log(self, metrics: dict, step: int) -> None:
        tqdm.write(console_line(metrics, step, self.total))


# ---------------------------------------------------------------------------- run warnings


def _mean(values: list) -> float:
    return sum(values) / len(values)


def _recent(history: list[dict], key: str, n: int = 5, start: int = 0) -> list:
    """The last n values of `key` (from `start` steps back), only steps that trained on some tokens where the
    key describes the update."""
    rows = [m for m in history if key in m and (not key.startswith("policy/") or m.get("policy/trained_tokens", 1))]
    rows = rows[: len(rows) - start] if start else rows
    return [m[key] for m in rows[-n:]] if len(rows) >= n else []


def no_signal(history: list[dict]) -> bool:
    """most groups have equal rewards, so there is no learning signal: the task is too hard or too easy for this
    model (try more samples_per_prompt, a partial reward, or SFT first)"""
    v = _recent(history, "reward/frac_groups_with_variance")
    return bool(v) and _mean(v) < 0.2


def truncated(history: list[dict]) -> bool:
    """most completions stop at max_new_tokens: rewards judge unfinished answers (raise max_new_tokens, or try
    --overlong soft)"""
    v = _recent(history, "rollout/truncated_frac", n=10)
    return bool(v) and _mean(v) > 0.8


def kl_rising(history: list[dict]) -> bool:
    """the KL to the reference is rising fast: the policy is drifting (lower lr or raise kl_coef)"""
    for key in ("loss/kl", "reward/kl_penalty"):
        now, before = _recent(history, key), _recent(history, key, start=5)
        if now and before and _mean(now) > 0.1 and _mean(now) > 3 * _mean(before):
            return True
    return False


def mismatch(history: list[dict]) -> bool:
    """the sampler's and the learner's log-probs disagree (policy/sampler_logp_diff): updates are off-policy
    (try --is-mode token_truncate, or dtype float32)"""
    v = _recent(history, "policy/sampler_logp_diff")
    return bool(v) and _mean(v) > 0.05


def entropy_collapse(history: list[dict]) -> bool:
    """the policy's entropy has collapsed: it samples one answer, so groups stop differing (try a higher
    temperature, entropy_coef, or clip_high 0.28)"""
    now, first = _recent(history, "policy/entropy"), [m["policy/entropy"] for m in history[:5] if "policy/entropy" in m]
    return bool(now) and bool(first) and _mean(now) < 0.03 and _mean(now) < 0.1 * _mean(first)


def reward_errors(history: list[dict]) -> bool:
    """a reward raised errors that were scored 0 (reward/errors; --reward-errors zero)"""
    return history[-1].get("reward/errors", 0) > 0


# Each rule reads the metrics so far; its docstring is what the user is told when it holds.
RULES = {rule.__name__: rule for rule in (no_signal, truncated, kl_rising, mismatch, entropy_collapse, reward_errors)}


class RunWarnings(Logger):
    """A logger that adds `warn/<name>` to the metrics of each step where a rule holds
    and prints each kind of warning once. It must see the metrics before the loggers that write them."""

    def __init__(self):
        self.history: list[dict] = []
        self.said: set[str] = set()

    def log(self, metrics: dict, step: int) -> None:
        self.history.append(dict(metrics))
        for name, rule in RULES.items():
            if rule(self.history):
                metrics[f"warn/{name}"] = 1
                if name not in self.said:
                    self.said.add(name)
                    tqdm.write(f"[nanorl] warning (step {step}): {' '.join((rule.__doc__ or name).split())}")


def make_logger(out_dir, report_to="console", append=False, total_steps=None, config=None, callbacks=()):
    """JSONL always, plus each of `report_to` (comma-separated: console, tensorboard, wandb, trackio; or none), on
    the main process only; the other processes get Loggers([]), which records nothing."""
    if not distributed.is_main():
        return Loggers([])
    chosen = [n.strip() for n in report_to.split(",") if n.strip() and n.strip() != "none"]
    others = [
        ConsoleLogger(total_steps) if n == "console" else tracker(n, Path(out_dir), config, append) for n in chosen
    ]
    others += [c if isinstance(c, Logger) else Callback(c) for c in callbacks]  # a Logger sees evals and samples too
    return Loggers([RunWarnings(), JsonlLogger(out_dir, append), *others])  # warnings first: they add warn/* keys


def tracker(name: str, out_dir: Path, config, append: bool):
    """TensorBoard or W&B (config.validate has checked the name and that it is installed)."""
    from nanorl.integrations.trackers import TRACKERS

    return TRACKERS[name](out_dir, config, append)

"""Warnings a practitioner needs, read off the metrics of every step: a logger that watches the run.

    logger = make_logger(out, "console")    # includes RunWarnings: nothing to do
    # step 12: [nanorl] warning: most groups have equal rewards ... (printed once per kind)
    # and metrics.jsonl gets "warn/no_signal": 1 on every step where that holds

Each rule looks at a window of recent steps, so one noisy step does not fire it. The thresholds are set so that
the default run (7% -> 74% held-out accuracy) fires none (tests/test_warnings.py replays its metrics).
"""

from __future__ import annotations

from tqdm.auto import tqdm

from nanorl.logger import Logger


def _mean(values: list) -> float:
    return sum(values) / len(values)


def _recent(history: list[dict], key: str, n: int = 5, start: int = 0) -> list:
    """The last n values of `key` (from `start` steps back), only steps that trained on some tokens where the
    key describes the update."""
    rows = [m for m in history if key in m and (not key.startswith("policy/") or m.get("policy/trained_tokens", 1))]
    rows = rows[:len(rows) - start] if start else rows
    return [m[key] for m in rows[-n:]] if len(rows) >= n else []


def no_signal(history: list[dict]) -> bool:
    v = _recent(history, "reward/frac_groups_with_variance")
    return bool(v) and _mean(v) < 0.2


def truncated(history: list[dict]) -> bool:
    v = _recent(history, "rollout/truncated_frac", n=10)
    return bool(v) and _mean(v) > 0.8


def kl_rising(history: list[dict]) -> bool:
    for key in ("loss/kl", "reward/kl_penalty"):
        now, before = _recent(history, key), _recent(history, key, start=5)
        if now and before and _mean(now) > 0.1 and _mean(now) > 3 * _mean(before):
            return True
    return False


def mismatch(history: list[dict]) -> bool:
    v = _recent(history, "policy/sampler_logp_diff")
    return bool(v) and _mean(v) > 0.05


def entropy_collapse(history: list[dict]) -> bool:
    now, first = _recent(history, "policy/entropy"), [m["policy/entropy"] for m in history[:5] if "policy/entropy" in m]
    return bool(now) and bool(first) and _mean(now) < 0.03 and _mean(now) < 0.1 * _mean(first)


def reward_errors(history: list[dict]) -> bool:
    return history[-1].get("reward/errors", 0) > 0


# name -> (rule over the metrics so far, what to tell the user)
RULES = {
    "no_signal": (no_signal, "most groups have equal rewards, so there is no learning signal: the task is too hard "
                             "or too easy for this model (try more samples_per_prompt, a partial reward, or SFT first)"),
    "truncated": (truncated, "most completions stop at max_new_tokens: rewards judge unfinished answers (raise "
                             "max_new_tokens, or try --overlong soft)"),
    "kl_rising": (kl_rising, "the KL to the reference is rising fast: the policy is drifting (lower lr or raise kl_coef)"),
    "mismatch": (mismatch, "the sampler's and the learner's log-probs disagree (policy/sampler_logp_diff): updates "
                           "are off-policy (try --is-mode token_truncate, or dtype float32)"),
    "entropy_collapse": (entropy_collapse, "the policy's entropy has collapsed: it samples one answer, so groups stop "
                                           "differing (try a higher temperature, entropy_coef, or clip_high 0.28)"),
    "reward_errors": (reward_errors, "a reward raised errors that were scored 0 (reward/errors; --reward-errors zero)"),
}


class RunWarnings(Logger):
    """A logger (nanorl.logger's interface) that adds `warn/<name>` to the metrics of each step where a rule holds
    and prints each kind of warning once. It must see the metrics before the loggers that write them."""

    def __init__(self):
        self.history: list[dict] = []
        self.said: set[str] = set()

    def log(self, metrics: dict, step: int) -> None:
        self.history.append(dict(metrics))
        for name, (rule, message) in RULES.items():
            if rule(self.history):
                metrics[f"warn/{name}"] = 1
                if name not in self.said:
                    self.said.add(name)
                    tqdm.write(f"[nanorl] warning (step {step}): {message}")

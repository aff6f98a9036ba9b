"""Tasks: data (prompts plus the fields their reward needs) and a reward function.

    task = get_task("arithmetic", digits=2, operators="+", eval_size=200, seed=0)
    task = get_task("countdown") / get_task("code") / get_task("sql")     # built-in verifiable tasks
    task = get_task("rows.csv", reward="math=1,answer_tag=0.2", prompt_field="question")
    task = task_from_config(cfg)                                          # the task keys of a config
    task = Task("mine", train=[Example("Say hi", {})], eval=[...], reward=my_reward)   # from Python

A prompt is a string (rendered as one user message with the model's chat template) or a list of
chat messages. `reward(prompt, completion, **fields) -> float` gets the example's fields as keywords.
A reward spec is comma-separated `name=weight` items; a name is a built-in reward (REWARDS), a
`module:function`, or a `path/to/file.py:function`. Each part is logged as `reward/<name>_mean`.
Built-in tasks live beside this file (arithmetic.py, countdown.py, code.py, sql.py, math_answer.py); data files
(.jsonl, .csv, .parquet, or a folder saved by `datasets.Dataset.save_to_disk`) are read by files.py.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Callable

from nanorl.errors import ConfigError, RewardSetupError
from nanorl.tasks.builtin import builtin_task, load_reward  # load_reward: a reward by name, module or file
from nanorl.tasks.rewards import as_reward


@dataclass
class Example:
    prompt: str | list[dict]
    fields: dict = field(default_factory=dict)


class Scores(list):
    """What a reward's own `.batch` may return instead of a plain list (TRL-form rewards return lists): the
    scores, plus per-sample flags of what happened (`flags`: {name: [0/1 per sample]}, e.g. the code sandbox's
    {"failed": ..., "malformed": ...}), logged each step as reward/<reward>_<name>_mean: the fraction flagged."""

    def __init__(self, values, flags: dict | None = None):
        super().__init__(values)
        self.flags = flags or {}


def _value(v, batched: bool):
    """A reward's value as a float; None only where a batched (TRL) reward skips the sample."""
    if batched and (v is None or v != v):  # TRL: None (or NaN) = no score for this sample
        return None
    if v is None or isinstance(v, (str, bytes)):
        raise TypeError(f"the reward is {v!r}, not a number")
    if not math.isfinite(float(v)):  # NaN or inf would reach every weight through the update
        raise ValueError(f"the reward is {v}, not a finite number")
    return float(v)


@dataclass
class Task:
    name: str
    train: list[Example]
    eval: list[Example]
    reward: Callable[..., float]  # one reward, or a list of (name, reward, weight) parts
    on_error: str = "raise"  # a reward that raises: "raise" (stop, naming the input) or "zero" (score 0, count it)
    acc_threshold: float = 1.0  # accuracy metrics count a completion correct when its reward is >= this
    tools: list = field(default_factory=list)  # tools its episodes may call (agents/; e.g. the calculator task's)
    environment: object = None  # an environment class each episode acts in, one instance each (e.g. guess's)
    held_out: str = ""  # where the eval rows come from, when it is not obvious (data tasks): console and config.json

    def __post_init__(self):
        if not self.train:
            raise ConfigError(f"task '{self.name}': the training split is empty")

    def parts(self) -> list[tuple[str, Callable, float]]:
        parts = self.reward if isinstance(self.reward, list) else [("task", self.reward, 1.0)]
        return [(name, as_reward(fn), w) for name, fn, w in parts]

    def check(self) -> None:
        """Each reward can be called on the first rows' fields (a missing column, a wrong signature): before any
        model is loaded."""
        for name, fn, _ in self.parts():
            getattr(fn, "requires", lambda: None)()  # what a reward needs installed (math: math-verify)
            for ex in (self.train[0], *self.eval[:1]):
                try:  # TRL's batched form: every column it names must exist
                    if hasattr(fn, "arguments"):
                        fn.signature.bind(**fn.arguments([ex.prompt], [""], [ex.fields], episodes={"environments": 0}))
                    else:
                        inspect.signature(fn).bind(ex.prompt, "", **ex.fields)
                except TypeError as e:
                    raise RewardSetupError(
                        f"reward '{name}' of task '{self.name}' cannot be called on its rows "
                        f"(fields: {sorted(ex.fields)}): {e}"
                    ) from None

    def score_parts(
        self,
        examples: list[Example],
        completions: list[str],
        completion_ids=None,
        step=0,
        steps=0,
        episodes: dict | None = None,
    ):
        """-> ({part name: rewards, None where a TRL-form reward skipped the sample}, weighted totals, number of
        reward errors). A reward with `.batch(prompts, completions, fields, **context)` (TRL's form, the code
        sandbox) scores all completions at once; when that call fails, each is scored alone to find which. Flags a
        batch returns (`Scores`) join the parts as <part>_<flag>: logged, not added to the reward. `episodes`:
        what a TRL-form reward gets of multi-turn episodes instead ({"completions": messages, "environments"})."""
        parts, errors, rewards = {}, 0, self.parts()
        for name, fn, _ in rewards:
            batch, values, ctx, failed, flags = getattr(fn, "batch", None), None, {"step": step, "steps": steps}, 0, {}
            ctx.update({"episodes": episodes} if episodes and hasattr(fn, "arguments") else {})  # TRL's form only
            if batch:
                try:
                    out = batch(
                        [e.prompt for e in examples], completions, [e.fields for e in examples], completion_ids, **ctx
                    )
                    values = [_value(v, True) for v in out]
                    flags = {
                        f"{name}_{k}": [float(x) for x in v]
                        for k, v in (out.flags if isinstance(out, Scores) else {}).items()
                    }  # (numpy has .flags too)
                except RewardSetupError:
                    raise
                except Exception:
                    pass  # a completion broke the batch: each is scored alone below
            for i, (ex, completion) in enumerate(zip(examples, completions) if values is None else ()):
                values = [] if i == 0 else values
                one = {**ctx, "episodes": {k: v[i : i + 1] for k, v in episodes.items()}} if "episodes" in ctx else ctx
                try:
                    ids = completion_ids and completion_ids[i : i + 1]
                    v = batch([ex.prompt], [completion], [ex.fields], ids, **one)[0] if batch else None
                    values.append(_value(v if batch else fn(ex.prompt, completion, **ex.fields), bool(batch)))
                except (RewardSetupError, ImportError, NameError) as e:  # not the sample's fault
                    raise RewardSetupError(f"reward '{name}' of task '{self.name}': {e}") from e
                except Exception as e:
                    if self.on_error != "zero":  # name the input that broke the reward
                        raise RuntimeError(
                            f"reward '{name}' of task '{self.name}' failed on prompt {ex.prompt!r} "
                            f"with completion {completion!r}: {e!r}"
                        ) from e
                    values.append(0.0)
                    errors, failed = errors + 1, failed + 1
                    if failed == len(completions) > 1 and isinstance(e, (TypeError, AttributeError, KeyError)):
                        # a programming error on every completion (a missing column, a non-number): the reward
                        raise RewardSetupError(
                            f"reward '{name}' of task '{self.name}' failed on every completion of the batch: {e!r}"
                        ) from e
            parts.update({name: values, **flags})
        total = [
            sum(w * parts[n][i] for n, _, w in rewards if parts[n][i] is not None) for i in range(len(completions))
        ]
        return parts, total, errors

    def score(self, examples: list[Example], completions: list[str], **context) -> list[float]:
        return self.score_parts(examples, completions, **context)[1]


def parse_reward_spec(spec) -> list[tuple[str, Callable, float]]:
    """'math=1,answer_tag=0.2' -> [("math", math_reward, 1.0), ("answer_tag", answer_tag, 0.2)]; a list of
    functions (from Python) -> each with weight 1."""
    items = [x.strip() for x in spec.split(",") if x.strip()] if isinstance(spec, str) else []
    functions = [] if isinstance(spec, str) else [spec] if callable(spec) else list(spec)  # from Python: weight 1
    parts = [(getattr(f, "__name__", "reward"), f, 1.0) for f in functions]
    for item in items:
        name, _, weight = item.partition("=")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError(f"config key 'reward': weight of {name!r} must be a number, got {weight!r}") from None
        parts.append((name.split(":")[-1], load_reward(name), w))  # module:function is logged as function
    if not parts:
        raise ConfigError("config key 'reward': empty reward spec")
    names = [n for n, _, _ in parts]  # a name met before gets _2, _3, ...: each part is its own metric
    return [(n if n not in names[:i] else f"{n}_{names[:i].count(n) + 1}", f, w) for i, (n, f, w) in enumerate(parts)]


def get_task(name, *, reward="", on_error="raise", acc_threshold=1.0, apply_chat_template="auto", **options) -> Task:
    """A built-in task, or data (a file, folder, hub id, or datasets.Dataset), with builtin_task's `options`
    (digits, operators, eval_size, eval_data, seed, prompt_field, answer_field); a non-empty `reward` spec replaces the
    task's own reward. String prompts go through the chat template, a data task's only with apply_chat_template
    'always' (TRL reads a plain string as it is), none with 'never' (chat messages are then refused)."""
    task = builtin_task(name, template=apply_chat_template, **options)
    if apply_chat_template == "never":  # a built-in task's prompts as given too (files.plain_prompt)
        from nanorl.tasks.files import plain_prompt

        for ex in task.train + task.eval:
            ex.prompt = plain_prompt(ex.prompt, "never", builtin=True)
    if reward:  # a spec, or reward functions from Python
        task.reward = parse_reward_spec(reward)
    task.on_error, task.acc_threshold = on_error, acc_threshold
    task.check()  # a column a reward asks for that the data lacks: named now, before any model is loaded
    return task


def task_from_config(cfg, source=None, reward=None) -> Task:
    """The task a config names (config.TaskConfig's fields: the one place they are read), or the same settings
    on a `source` (a datasets.Dataset) and `reward` functions given from Python."""
    return get_task(
        cfg.task if source is None else source,
        reward=reward or cfg.reward,
        digits=cfg.digits,
        operators=cfg.operators,
        eval_size=cfg.eval_size,
        eval_data=cfg.eval_data,
        prompt_field=cfg.prompt_field,
        answer_field=cfg.answer_field,
        on_error=cfg.reward_errors,
        acc_threshold=cfg.acc_threshold,
        apply_chat_template=cfg.apply_chat_template,
    )

"""What the online loops (GRPO's family in grpo.py, PPO in ppo.py) share besides the update (update.py): the
models, the data order, rollouts and their rewards, evaluation, and the run folder's start and finish.

Each is a plain function the loop calls where the reader can see it:

    device, backend, dtype, task, resuming = prepare(cfg, task, ckpt)    # device, backend, seeds, task, resume?
    policy, tok, ref, rm = load_models(cfg, device, dtype, start_from)   # reference only when kl_coef > 0
    roll, texts = rollout(sampler, tok, examples, cfg, seed, timer)                 # sample
    rewards, parts = reward(task, rm, examples, texts, roll, cfg, timer, device)       # score
    metrics = run_eval(sampler, tok, task, cfg, logger, out, step)      # eval.jsonl + eval_samples.jsonl
    return finish(cfg, out, policy, tok, first, last, t_start, logger)   # model/, results.json
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from nanorl import checkpoint, distributed
from nanorl.backends import Backend, select_backend
from nanorl.checkpoint import check_resume
from nanorl.config import OnlineConfig, to_dict, validate
from nanorl.data import Text, render_prompt
from nanorl.errors import ConfigError
from nanorl.evaluate import evaluate
from nanorl.hub import model_source
from nanorl.learner import count_bad_steps
from nanorl.logprobs import AUTO
from nanorl.models import check_tokenizer, is_adapter, load_model, resolve_device, trainable
from nanorl.sampling import LocalSampler, SamplingParams, sample_episodes
from nanorl.seeds import derive_seed
from nanorl.tasks import Task, parse_reward_spec, task_from_config


def prompt_order(n_train: int, seed: int, step: int, count: int) -> list[int]:
    """Indices of the training prompts for `step`: a seeded shuffle per pass over the split."""

    def order(epoch: int) -> list[int]:  # the shuffle of pass `epoch`
        return random.Random(derive_seed(seed, epoch, "data")).sample(range(n_train), n_train)

    return [order(k // n_train)[k % n_train] for k in range(step * count, (step + 1) * count)]


def step_examples(task: Task, cfg: OnlineConfig, step: int) -> list:
    """This rank's contiguous share (under torchrun; else all) of the training prompts of `step`."""
    order = prompt_order(len(task.train), cfg.seed, step, cfg.prompts_per_step)
    return [task.train[i] for i in order[distributed.share(len(order))]]


def sampling_params(cfg: OnlineConfig) -> SamplingParams:
    return SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k, cfg.min_p, cfg.repetition_penalty)


# ---------------------------------------------------------------------------- setup


def prepare(cfg: OnlineConfig, task, ckpt: Path, model=None, reward_funcs=None, tools=None, environment_factory=None):
    """The first lines of every online loop -> the config as run, device, backend, the weights' dtype, the task,
    whether `ckpt` is resumed, the agent (make_agent: None without tools or an environment). The config is
    validated, the backend's process settings are taken and the global RNGs seeded, and every reward checked
    against the data, before any model exists. A task (or datasets.Dataset), reward functions, tools, an
    environment or a model given from Python are recorded in the config (config.json) by name."""
    validate(cfg)
    device = distributed.init(resolve_device(cfg.device), cfg)  # under torchrun: join the process group
    backend, dtype = select_backend(cfg.backend, cfg.dtype, device, cfg.grad_checkpointing, cfg.strategy)
    backend.prepare(device)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    reward_funcs = [reward_funcs] if callable(reward_funcs) else reward_funcs  # one function, as TRL allows
    used = {"reward": ",".join(getattr(f, "__name__", "reward") for f in reward_funcs)} if reward_funcs else {}
    if isinstance(task, Task):
        task.reward = parse_reward_spec(reward_funcs) if reward_funcs else task.reward
        task.on_error, task.acc_threshold = cfg.reward_errors, cfg.acc_threshold
        task.check()  # (get_task checks the tasks it builds)
        used["task"] = f"python:{task.name}"
    else:  # a name in the config, or a datasets.Dataset / DatasetDict
        used.update({"task": f"python:{type(task).__name__}"} if task is not None else {})
        task = task_from_config(cfg, source=task, reward=reward_funcs)
    if model is not None:
        used["model"] = f"python:{type(model).__name__}:{getattr(model.config, '_name_or_path', '')}"
    agent, named = make_agent(cfg, task, tools, environment_factory)  # named: tools given from Python
    cfg = dataclasses.replace(cfg, **used, **named)
    checkpoint.lock(ckpt.parent)  # one run per folder, before anything in it is read or removed
    return cfg, device, backend, dtype, task, check_resume(cfg, ckpt), agent


def make_agent(cfg, task: Task, tools=None, environment_factory=None):
    """-> (the run's Agent, the config's record of the tools given from Python) with tools or an environment (from
    Python, the config or the task: agents/episodes.py, loaded only then), else (None, {})."""
    given = (tools, environment_factory, task.tools, task.environment, getattr(cfg, "tools", ""))
    if not any(given) and not getattr(cfg, "environment", ""):
        return None, {}
    from nanorl.agents.episodes import make_agent

    return make_agent(cfg, task, tools, environment_factory)


def make_sampler(cfg, model, tok, stop_ids: list[int], backend: Backend = AUTO):
    """The run's sampler: a vLLM engine with --use_vllm (integrations/vllm.py, loaded only then), else nanorl's own."""
    if getattr(cfg, "use_vllm", False):
        from nanorl.integrations.vllm import make_vllm_sampler

        return make_vllm_sampler(cfg, model, tok, stop_ids)
    return LocalSampler(model, stop_ids, tok.pad_token_id, backend)


def load_models(cfg: OnlineConfig, device, dtype, start_from: str, model=None, tokenizer=None):
    """The policy (from `start_from`: the model, or the checkpoint being resumed; or a model object given from
    Python with its tokenizer) and its tokenizer, the frozen reference (only when kl_coef > 0), and the frozen
    reward model with its tokenizer (only with reward_model). Every model stays in eval mode: no dropout, so
    the rollout and the update see the same function."""
    if model is not None and start_from == cfg.model:
        if tokenizer is None:
            raise ConfigError("a model given from Python needs its tokenizer: train(cfg, model=..., tokenizer=...)")
        policy, tok = model.to(device), check_tokenizer(tokenizer, cfg.model)
    else:
        policy, tok = distributed.load(load_model, start_from, device, dtype, cfg)  # FSDP: the main process reads
    # the reference: a model given from Python (not an adapter), copied before it trains
    start = (
        copy.deepcopy(model) if model is not None and cfg.kl_coef > 0 and not hasattr(model, "peft_config") else None
    )
    policy = distributed.shard(trainable(policy, cfg), cfg).eval()  # LoRA adapters when cfg.lora_r > 0; FSDP
    ref = rm = None
    if cfg.kl_coef > 0 and hasattr(policy, "peft_config") and not is_adapter(cfg.model) and start is None:
        from nanorl.integrations.lora import AdapterOff

        ref = AdapterOff(policy)  # the starting model is the base: the adapters off, no second copy
    elif cfg.kl_coef > 0:
        ref = start if start is not None else distributed.load(load_model, cfg.model, device, dtype, cfg)[0]
        ref = distributed.shard(ref.eval().requires_grad_(False), cfg)
    if cfg.reward_model:  # reward_model.py loads only when a run has one
        from nanorl.reward_model import load_reward_model

        model, rm_tok = distributed.load(load_reward_model, cfg.reward_model, device, dtype, cfg)
        rm = (distributed.shard(model.eval().requires_grad_(False), cfg), rm_tok)  # FSDP: sharded like the policy
    return policy, tok, ref, rm


def check_context(cfg: OnlineConfig, policy, tok, task: Task) -> None:
    """The longest prompt plus max_new_tokens must fit the model's context (the 64 longest prompts in characters are
    rendered: every prompt would take minutes on a large dataset)."""
    context = getattr(policy.config, "max_position_embeddings", None)
    longest = sorted(task.train + task.eval, key=lambda ex: len(str(ex.prompt)))[-64:]
    longest = max(len(render_prompt(tok, ex.prompt, cfg.system_prompt)) for ex in longest)
    if context and longest + cfg.max_new_tokens > context:
        raise ConfigError(
            f"config key 'max_new_tokens': a prompt of {longest} tokens + max_new_tokens {cfg.max_new_tokens} "
            f"exceeds the model's context of {context} tokens"
        )


def describe(cfg: OnlineConfig, name: str, task: Task, models: dict, device, backend, out: Path) -> None:
    """Write config.json and print what runs: the config, the task's size, the model and its memory."""
    if not distributed.is_main():
        return
    source = model_source(cfg.model)  # a GGUF's weights: dequantized, not the hub checkpoint's
    text = Text.note if isinstance(task.train[0].prompt, Text) else ""
    notes = {k: v for k, v in (("_held_out", task.held_out), ("_model_source", source), ("_prompts", text)) if v}
    (out / "config.json").write_text(json.dumps({**to_dict(cfg), **notes}, indent=2))  # the logger made the folder
    policy = models["policy"]
    memory = ", ".join(
        f"{k} {sum(getattr(p, 'to_local', lambda p=p: p)().nbytes for p in m.parameters()) / 2**30:.2f} GiB"
        for k, m in models.items()
        if m is not None
    )  # FSDP: the shards this process holds
    print(f"[nanorl] {name} config: {json.dumps(to_dict(cfg))}")
    print(
        f"[nanorl] task '{task.name}': {len(task.train)} train / {len(task.eval)} held-out prompts"
        f"{f' (held out: {task.held_out})' if task.held_out else ''}{f', prompts {text}' if text else ''}; model "
        f"{cfg.model}{f' ({source})' if source else ''} ({sum(p.numel() for p in policy.parameters()) / 1e6:.0f}M "
        f"params) on {device} {next(policy.parameters()).dtype}"
        f"{f' with {backend.autocast} autocast' if backend.autocast else ''}; weights per process: {memory}"
    )


# ---------------------------------------------------------------------------- rollout and reward


def rollout(sampler, tok, examples, cfg: OnlineConfig, seed: int, timer: dict, agent=None):
    """Sample samples_per_prompt episodes of each example -> rollouts (N = prompts x group rows, ordered group by
    group) and the texts the reward scores. Without an agent an episode is one answer. With one (tools or an
    environment: agents/episodes.py) it goes on while the model calls tools: each turn the calls of the last
    replies run, their results are appended (tokens the model did not write), and every live episode's next
    reply is sampled in one batch."""
    t, group_size, params = time.perf_counter(), cfg.samples_per_prompt, sampling_params(cfg)
    first = distributed.rank() * len(examples)  # each prompt's draws come from its index in the global batch
    seeds = [derive_seed(seed, first + i, "prompt") for i in range(len(examples))]
    roll, texts = sample_episodes(
        sampler, tok, examples, group_size, params, seeds, cfg.system_prompt, agent, seed, first * group_size
    )
    timer["rollout"] += time.perf_counter() - t
    timer["tokens"] += sum(roll.model_tokens(i) for i in range(len(roll.completion_ids)))
    return roll, texts


def reward(task: Task, rm, examples, texts, roll, cfg: OnlineConfig, timer, device, backend=AUTO, step=0, agent=None):
    """Score each completion -> rewards (N,) and the reward's parts {name: (N,)} ("task" for a single rule, plus
    "rm" with a reward model); rewards = rule_weight * (weighted rule parts) + rm_weight * rm."""
    group_size, t = cfg.samples_per_prompt, time.perf_counter()
    rows, episodes = [examples[i // group_size] for i in range(len(texts))], agent and agent.trl_episodes()
    named, total, errors = task.score_parts(rows, texts, roll.completion_ids, step, cfg.steps, episodes)
    env = agent.environment_rewards() if agent else {}  # get_reward() of each episode's environment, by class name
    named.update(env)
    timer["reward_errors"] = timer.get("reward_errors", 0) + errors
    parts = {k: torch.tensor([float("nan") if x is None else x for x in v]) for k, v in named.items()}  # NaN: skipped
    # torchrun: every rank the same parts in one order (a flag a failed batch did not report on this rank is NaN)
    nan = torch.full((len(texts),), float("nan"))
    parts = {k: parts.get(k, nan) for k in dict.fromkeys(distributed.gather_objects(list(parts)))}
    rewards = cfg.rule_weight * torch.tensor(total)
    if rm is not None:
        from nanorl.reward_model import rm_score  # only with a reward model

        parts["rm"] = rm_score(*rm, examples, texts, cfg, device, backend)
        rewards = rewards + cfg.rm_weight * parts["rm"]
    for name in dict.fromkeys(distributed.gather_objects(list(env))):  # added to the reward as they are
        rewards = rewards + parts[name].nan_to_num(0.0)
    timer["reward"] += time.perf_counter() - t
    return rewards, parts


def informative_groups(rewards: torch.Tensor, group_size: int) -> list[int]:
    """Indices of the groups whose rewards are not all equal (the only ones with a learning signal)."""
    r = rewards.view(-1, group_size)  # (groups, group_size)
    return (r.amax(dim=1) > r.amin(dim=1)).nonzero().flatten().tolist()


def reward_metrics(rewards: torch.Tensor, parts: dict, group_size: int, threshold: float = 1.0) -> dict:
    return {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std(correction=0).item(),
        "reward/acc": (next(iter(parts.values())) >= threshold).float().mean().item(),  # of the first rule part
        "reward/frac_groups_with_variance": len(informative_groups(rewards, group_size)) / (len(rewards) // group_size),
        **{f"reward/{k}_mean": v.nanmean().item() for k, v in parts.items()},
    }  # over the samples it scored


def rollout_metrics(lengths: torch.Tensor, truncated: torch.Tensor) -> dict:
    return {
        "rollout/len_mean": lengths.float().mean().item(),
        "rollout/len_max": lengths.max().item(),
        "rollout/truncated_frac": truncated.float().mean().item(),
    }


def time_metrics(timer: dict, t0: float, t2: float, t3: float, trained_tokens: int, t_start: float) -> dict:
    """Seconds of the step's phases (rollout + reward from t0, update and weight sync from t2 to t3), token rates."""
    return {
        "time/rollout": timer["rollout"],
        "time/reward": timer["reward"],
        "time/update": t3 - t2 - timer.get("sync", 0.0),
        "time/sync": timer.get("sync", 0.0),  # the sampler's copy of the new weights (0 for nanorl's own)
        "time/step": t3 - t0,
        "perf/rollout_tokens_per_s": timer["tokens"] / timer["rollout"],
        "perf/update_tokens_per_s": trained_tokens / max(t3 - t2, 1e-9),
        "time/elapsed": time.perf_counter() - t_start,
    }


def sample_records(examples, texts, rewards, roll, group_size: int, every: bool = False) -> list[dict]:
    """A couple of the step's completions (or `every` one) with their rewards, for samples.jsonl; an episode's with
    every turn."""
    rows = range(len(texts)) if every else range(0, len(texts), group_size * max(1, len(examples) // 2))
    return [
        {
            "prompt": examples[i // group_size].prompt,
            "completion": texts[i],
            "reward": rewards[i].item(),
            "truncated": roll.truncated[i],
            **(roll.episodes[i] if roll.episodes else {}),
        }
        for i in rows
    ]


# ---------------------------------------------------------------------------- eval and finish


def run_eval(sampler, tok, task: Task, cfg: OnlineConfig, logger, out: Path, step: int, agent=None) -> dict:
    """Held-out greedy accuracy (and pass@k): logged to eval.jsonl, greedy completions to eval_samples.jsonl. With
    an agent, of whole episodes."""
    params, t = sampling_params(cfg), cfg.eval_temperature  # steps: a TRL reward's trainer_state
    metrics, samples = evaluate(
        sampler, tok, task, params, cfg.eval_k, cfg.system_prompt, step=step, steps=cfg.steps, agent=agent, t=t
    )
    logger.log_eval(metrics, step)
    if distributed.is_main():
        (out / "eval_samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
        tqdm.write(f"[nanorl] step {step} eval: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
    return metrics


def progress(start: int, cfg: OnlineConfig, name: str):
    quiet = None if distributed.is_main() else True
    return tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=name, dynamic_ncols=True, disable=quiet)


def due(step: int, every: int, total: int, at_end: bool) -> bool:
    """Whether something done every `every` steps (0 = never) happens after `step` (1-based) of `total`:
    evaluations also after the last step (at_end), checkpoints not (the final model is saved anyway)."""
    return (bool(every) and step % every == 0 and step < total) or (at_end and step == total)


def end_of_step(
    done: int, metrics: dict, samples: list[dict], cfg: OnlineConfig, logger, evaluate, save, last: dict, bad_steps: int
) -> tuple[dict, int]:
    """The tail of every online step, after step `done` (1-based): a few samples to samples.jsonl, the held-out
    evaluation when due (`evaluate(done)`, its metrics joining the step's), the step's metrics line, the NaN guard
    (learner.count_bad_steps), and a checkpoint when due (`save(done)`). -> the latest evaluation, bad steps."""
    logger.log_samples(samples, done)
    if due(done, cfg.eval_every, cfg.steps, at_end=True):
        last = evaluate(done)
        metrics.update(last)
    logger.log(metrics, done)
    bad_steps = count_bad_steps(metrics["optim/skipped_updates"], bad_steps, cfg.max_bad_steps, done)
    if due(done, cfg.save_every, cfg.steps, at_end=False):
        save(done)
    return last, bad_steps


def finish(cfg: OnlineConfig, out: Path, policy, tok, first: dict, last: dict, t_start: float, logger) -> dict:
    """Save the final model, write results.json (before / after), print the one-line summary."""
    kind = f"sampled (temperature {cfg.eval_temperature:g})" if cfg.eval_temperature else "greedy"
    key = "eval/sampled_acc" if cfg.eval_temperature else "eval/greedy_acc"
    before, after = f"{first[key]:.1%} -> " if first else "", f"{last.get(key, float('nan')):.1%}"

    def summary(wall: float) -> str:
        return (
            f"[nanorl] done: held-out {kind} accuracy {before}{after} in {cfg.steps} steps, {wall / 60:.1f} min "
            f"wall time; model saved to {out / 'model'}"
        )

    return checkpoint.finish(out, policy, tok, cfg, load_model, logger, t_start, cfg.steps, first, last, summary)

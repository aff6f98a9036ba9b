"""What the online loops (GRPO and its variants in grpo.py, PPO in ppo.py) share, besides their math:
the models, the task, sampling and scoring, evaluation, the run folder and checkpoints.

    run = Run(cfg, task, "grpo")                 # validate, load policy (+ reference, + reward model)
    for step in run.steps(opt, sched):           # the first eval, resume, a progress bar
        roll, texts, rewards, parts = run.rollout_and_score(examples, seed, timer)
        ...                                      # the algorithm: advantage and update
        run.end_step(step, metrics, ...)         # samples, eval, metrics.jsonl, checkpoint
    return run.finish()
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from nanorl import checkpoint
from nanorl.config import GRPOConfig, to_dict, validate
from nanorl.data import render_prompt
from nanorl.evaluate import evaluate
from nanorl.log import RunLog
from nanorl.backends.cpu import reuse_freed_memory
from nanorl.models import load_model, resolve_device, resolve_precision, stop_token_ids
from nanorl.sampling import SamplingParams, generate
from nanorl.tasks import Task, get_task


def prompt_order(n_train: int, seed: int, step: int, count: int) -> list[int]:
    """Indices of the training prompts for `step`: a seeded shuffle per pass over the split."""
    out = []
    for k in range(step * count, (step + 1) * count):
        epoch, i = divmod(k, n_train)
        out.append(random.Random(seed * 100_003 + epoch).sample(range(n_train), n_train)[i])
    return out


def param_gib(model) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30


class Run:
    def __init__(self, cfg: GRPOConfig, task: Task | None, name: str):
        validate(cfg)
        self.cfg, self.name, self.t_start = cfg, name, time.perf_counter()
        self.out = Path(cfg.out_dir)
        self.device = resolve_device(cfg.device)
        reuse_freed_memory(self.device)
        self.dtype, self.autocast = resolve_precision(cfg.dtype, self.device)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.task = task or get_task(cfg.task, reward=cfg.reward, digits=cfg.digits, operators=cfg.operators,
                                     eval_size=cfg.eval_size, prompt_field=cfg.prompt_field,
                                     answer_field=cfg.answer_field, on_error=cfg.reward_errors)
        self.task.on_error = cfg.reward_errors  # also for a Task built in Python
        self.ckpt_dir = self.out / "checkpoint"
        self.resuming = cfg.resume and (self.ckpt_dir / "trainer_state.pt").is_file()
        self.policy, self.tok = load_model(str(self.ckpt_dir) if self.resuming else cfg.model, self.device, self.dtype,
                                          self.autocast)
        self.policy.eval()  # no dropout: rollout and update see the same function
        self.ref = self.rm = None
        if cfg.kl_coef > 0:  # the reference model exists only when it is used
            self.ref, _ = load_model(cfg.model, self.device, self.dtype, self.autocast)
            self.ref.eval().requires_grad_(False)
        if cfg.reward_model:  # a frozen scalar-head model; only its weights, no optimizer state
            from nanorl.reward_model import load_reward_model

            self.rm, self.rm_tok = load_reward_model(cfg.reward_model, self.device, self.dtype, self.autocast)
            self.rm.eval().requires_grad_(False)
        self.stops, self.pad_id = stop_token_ids(self.policy, self.tok), self.tok.pad_token_id
        self.params = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k)
        context = getattr(self.policy.config, "max_position_embeddings", None)
        longest = max(len(render_prompt(self.tok, ex.prompt, cfg.system_prompt))
                      for ex in self.task.train[:1000] + self.task.eval)
        if context and longest + cfg.max_new_tokens > context:
            raise ValueError(f"a prompt of {longest} tokens + max_new_tokens {cfg.max_new_tokens} exceeds the "
                             f"model's context of {context} tokens")
        self.log = RunLog(self.out, append=self.resuming)
        (self.out / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
        models = {"policy": self.policy, "reference": self.ref, "reward model": self.rm}
        memory = ", ".join(f"{k} {param_gib(m):.2f} GiB" for k, m in models.items() if m is not None)
        print(f"[nanorl] {name} config: {json.dumps(to_dict(cfg))}")
        print(f"[nanorl] task '{self.task.name}': {len(self.task.train)} train / {len(self.task.eval)} held-out "
              f"prompts; model {cfg.model} ({sum(p.numel() for p in self.policy.parameters()) / 1e6:.0f}M params) "
              f"on {self.device} {self.dtype}"
              f"{f' with {self.autocast} autocast' if self.autocast else ''}; weights: {memory}")

    # ---------------------------------------------------------------------- rollout and reward
    def rollout_and_score(self, examples, seed: int, timer: dict):
        """Sample G completions per example and score them. -> rollouts, texts, rewards (N,), and the
        reward's parts {name: (N,)} ("task" for a single rule, plus "rm" with a reward model);
        rewards = rule_weight * (weighted rule parts) + rm_weight * rm."""
        cfg, G = self.cfg, self.cfg.samples_per_prompt
        t = time.perf_counter()
        prompts = [render_prompt(self.tok, ex.prompt, cfg.system_prompt) for ex in examples]
        roll = generate(self.policy, prompts, G, self.params, self.stops, seed=seed, pad_id=self.pad_id)
        timer["rollout"] += time.perf_counter() - t
        timer["tokens"] += sum(len(c) for c in roll.completion_ids)
        t = time.perf_counter()
        texts = [self.tok.decode(c, skip_special_tokens=True) for c in roll.completion_ids]
        named, total, errors = self.task.score_parts([examples[i // G] for i in range(len(texts))], texts)
        timer["reward_errors"] = timer.get("reward_errors", 0) + errors
        parts = {k: torch.tensor(v) for k, v in named.items()}
        rewards = cfg.rule_weight * torch.tensor(total)
        if self.rm is not None:
            parts["rm"] = self.rm_score(examples, texts)
            rewards = rewards + cfg.rm_weight * parts["rm"]
        timer["reward"] += time.perf_counter() - t
        return roll, texts, rewards, parts

    @torch.no_grad()
    def rm_score(self, examples, texts) -> torch.Tensor:
        """The reward model's scores, re-tokenised with its own tokenizer (it may differ from the policy's)."""
        from nanorl.data import encode_reply
        from nanorl.reward_model import rm_scores

        G, out = self.cfg.samples_per_prompt, []
        rows = [encode_reply(self.rm_tok, examples[i // G].prompt, t, self.cfg.system_prompt, 4096)[:2]
                for i, t in enumerate(texts)]
        for s in range(0, len(rows), self.cfg.micro_batch_size):
            part = rows[s:s + self.cfg.micro_batch_size]
            out.append(rm_scores(self.rm, [p for p, _ in part], [r for _, r in part], self.rm_tok.pad_token_id,
                                 self.device).cpu())
        return torch.cat(out)

    # ---------------------------------------------------------------------- eval, logging, checkpoints
    def evaluate(self, step: int) -> dict:
        cfg = self.cfg
        metrics, samples = evaluate(self.policy, self.tok, self.task, cfg.max_new_tokens, cfg.eval_k, cfg.temperature,
                                    cfg.system_prompt)
        self.log.write("eval", {"step": step, **metrics})
        (self.out / "eval_samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
        tqdm.write(f"[nanorl] step {step} eval: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
        return metrics

    def steps(self, opt, sched, extra_state=None):
        """Resume if asked (restoring optimizer and schedule), run the first eval, and yield step numbers."""
        start = checkpoint.load_state(self.ckpt_dir, opt, sched)["step"] if self.resuming else 0
        if self.resuming and extra_state is not None:
            extra_state(torch.load(self.ckpt_dir / "trainer_state.pt", weights_only=False))
        # on resume the "before" numbers are the first eval of the original run
        prior = (self.out / "eval.jsonl").read_text().splitlines() if self.resuming else []
        self.first_eval = json.loads(prior[0]) if prior else self.evaluate(start)
        self.last_eval = self.first_eval
        self.bar = tqdm(range(start, self.cfg.steps), initial=start, total=self.cfg.steps, desc=self.name,
                        dynamic_ncols=True, disable=None)
        return self.bar

    def end_step(self, step: int, metrics: dict, examples, texts, rewards, roll, opt, sched, extra=None) -> None:
        cfg, G = self.cfg, self.cfg.samples_per_prompt
        metrics["time/elapsed"] = time.perf_counter() - self.t_start
        for i in range(0, len(texts), G * max(1, len(examples) // 2)):  # a couple of samples per step
            self.log.write("samples", {"step": step + 1, "prompt": examples[i // G].prompt, "completion": texts[i],
                                       "reward": rewards[i].item(), "truncated": roll.truncated[i]})
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            self.last_eval = self.evaluate(step + 1)
            metrics.update(self.last_eval)
        self.log.write("metrics", metrics)
        self.bar.set_postfix(reward=f"{metrics['reward/mean']:.2f}", len=f"{metrics['rollout/len_mean']:.0f}",
                             s=f"{metrics['time/step']:.1f}")
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
            checkpoint.save(self.ckpt_dir, self.policy, self.tok, opt, sched, step + 1, extra() if extra else None)

    def finish(self) -> dict:
        checkpoint.save(self.out / "model", self.policy, self.tok)
        wall = time.perf_counter() - self.t_start
        first, last = self.first_eval, self.last_eval
        result = {"steps": self.cfg.steps, "wall_s": wall, "before": first, "after": last}
        (self.out / "results.json").write_text(json.dumps(result, indent=2))
        self.log.close()
        before = f"{first['eval/greedy_acc']:.1%} -> " if first else ""
        print(f"[nanorl] done: held-out greedy accuracy {before}{last.get('eval/greedy_acc', float('nan')):.1%} "
              f"in {self.cfg.steps} steps, {wall / 60:.1f} min wall time; model saved to {self.out / 'model'}")
        sys.stdout.flush()
        return result

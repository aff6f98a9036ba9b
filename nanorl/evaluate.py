"""Held-out evaluation: greedy accuracy and pass@k of any model on a task's eval split.

nanorl eval --model runs/grpo/model --task arithmetic --k 8
"""

from __future__ import annotations

import dataclasses

import torch

from nanorl import distributed
from nanorl.sampling import SamplingParams, sample_episodes
from nanorl.seeds import derive_seed


def evaluate(
    sampler, tok, task, params, k=1, system_prompt="", batch_prompts=64, seed=1234, step=0, steps=0, agent=None, t=0.0
):
    """-> (metrics, samples). `sampler` is a sampling.Sampler (e.g. LocalSampler(model, ...)); `params`
    (SamplingParams): the completion cap, and how the pass@k samples are drawn (the greedy pass takes its cap alone).
    Greedy accuracy = fraction of held-out prompts whose greedy completion gets reward >= task.acc_threshold (1
    by default). With k > 1 also pass@k: fraction of prompts with at least one of k sampled completions correct (Chen
    et al. 2021, the unbiased estimator with n = k samples). With a temperature `t` > 0 (eval_temperature; TRL
    evaluates at its sampling temperature) there is no greedy pass: max(k, 1) completions per prompt are sampled at t
    (eval/sampled_acc, eval/sampled_reward, pass@k; the samples are each prompt's first). The seed is the
    evaluation's own: every run and every model are scored on the same draws. With an `agent` (agents/episodes.py)
    each answer is an episode with tools, scored on its last reply."""
    metrics, samples = {"eval/temperature": t} if t else {}, []
    mine = distributed.share(len(task.eval))  # under torchrun each rank scores a share; the lists are gathered
    greedy = SamplingParams(params.max_new_tokens, temperature=0.0)
    settings = [("greedy", 1, greedy)] + ([(f"pass@{k}", k, params)] if k > 1 else [])
    settings = [("sampled", k, dataclasses.replace(params, temperature=t))] if t else settings
    with distributed.full_weights(getattr(sampler, "model", None)):  # FSDP: shares may take unequal batch counts
        for name, group_size, params in settings:
            correct, rewards, lengths = [], [], []
            for start in range(mine.start, mine.stop, batch_prompts):
                chunk = task.eval[start : min(start + batch_prompts, mine.stop)]
                seeds = [derive_seed(seed, start + i, "prompt") for i in range(len(chunk))]
                out, texts = sample_episodes(
                    sampler, tok, chunk, group_size, params, seeds, system_prompt, agent, seed, start * group_size
                )
                episodes = agent.trl_episodes() if agent else None
                rows = [chunk[i // group_size] for i in range(len(texts))]
                scores = task.score_parts(rows, texts, out.completion_ids, step, steps, episodes)[1]
                rewards += scores
                correct += [r >= task.acc_threshold for r in scores]
                lengths += [out.model_tokens(i) for i in range(len(out.completion_ids))]
                if name in ("greedy", "sampled"):  # a completion per prompt (an episode: its messages, env reward)
                    more = agent.eval_records() if agent else [{}] * len(texts)
                    samples += [
                        {"prompt": ex.prompt, "completion": text, "reward": r, **ex.fields, **x}
                        for ex, text, r, x in zip(chunk, *(v[::group_size] for v in (texts, scores, more)))
                    ]
            correct, rewards, lengths = map(distributed.gather_objects, (correct, rewards, lengths))
            per_prompt = torch.tensor(correct, dtype=torch.float).view(-1, group_size)
            if name in ("greedy", "sampled"):
                metrics[f"eval/{name}_acc"] = per_prompt.mean().item()
                metrics[f"eval/{name}_reward"] = sum(rewards) / len(rewards)
                metrics["eval/len_mean"] = sum(lengths) / len(lengths)
            if group_size > 1:
                metrics[f"eval/pass@{k}"] = (per_prompt.max(dim=1).values).mean().item()
                metrics["eval/sampled_acc"] = per_prompt.mean().item()
    samples = distributed.gather_objects(samples)
    return {**metrics, **(agent.eval_metrics(samples) if agent else {})}, samples

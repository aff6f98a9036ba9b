"""Held-out evaluation: greedy accuracy and pass@k of any model on a task's eval split.

nanorl eval --model runs/grpo/model --task arithmetic --k 8
"""

from __future__ import annotations

import torch

from nanorl import distributed
from nanorl.sampling import SamplingParams, sample_episodes
from nanorl.seeds import derive_seed


def evaluate(
    sampler, tok, task, params, k=1, system_prompt="", batch_prompts=64, seed=1234, step=0, steps=0, agent=None
):
    """-> (metrics, samples). `sampler` is a sampling.Sampler (e.g. LocalSampler(model, ...)); `params`
    (SamplingParams): the completion cap, and how the pass@k samples are drawn (the greedy pass takes its cap alone).
    Greedy accuracy = fraction of held-out prompts whose greedy completion gets reward >= task.acc_threshold (1
    by default). With k > 1
    also pass@k: fraction of prompts with at least one of k sampled completions correct (Chen et al. 2021,
    the unbiased estimator with n = k samples). The seed is the evaluation's own: every run and every
    model are scored on the same draws. With an `agent` (agents/episodes.py) each answer is an episode with tools,
    scored on its last reply."""
    metrics, samples = {}, []
    mine = distributed.share(len(task.eval))  # under torchrun each rank scores a share; the lists are gathered
    greedy = SamplingParams(params.max_new_tokens, temperature=0.0)
    settings = [("greedy", 1, greedy)] + ([(f"pass@{k}", k, params)] if k > 1 else [])
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
                if name == "greedy":  # one completion per prompt (an episode: its messages, environment reward)
                    more = agent.eval_records() if agent else [{}] * len(chunk)
                    samples += [
                        {"prompt": ex.prompt, "completion": text, "reward": r, **ex.fields, **x}
                        for ex, text, r, x in zip(chunk, texts, scores, more)
                    ]
            correct, rewards, lengths = map(distributed.gather_objects, (correct, rewards, lengths))
            per_prompt = torch.tensor(correct, dtype=torch.float).view(-1, group_size)
            if name == "greedy":
                metrics["eval/greedy_acc"] = per_prompt.mean().item()
                metrics["eval/greedy_reward"] = sum(rewards) / len(rewards)
                metrics["eval/len_mean"] = sum(lengths) / len(lengths)
            else:
                metrics[f"eval/pass@{k}"] = (per_prompt.max(dim=1).values).mean().item()
                metrics["eval/sampled_acc"] = per_prompt.mean().item()
    samples = distributed.gather_objects(samples)
    return {**metrics, **(agent.eval_metrics(samples) if agent else {})}, samples

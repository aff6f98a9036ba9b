"""Episodes: the model answers, calls tools or acts in an environment, reads the results, and goes on, over several
turns; the reward scores the whole episode. online.rollout runs the turns; this file is what an episode adds to a
single answer: the prompt with the tools (and an environment's opening text), the calls of each reply run and
their results appended as tokens the model did not write (Rollouts.model_mask 0: never trained, never counted),
and what the episode ends with.

    agent = Agent(tools=[calculate], environment_factory=None, max_tool_calls=4)
    prompts = agent.prompts(tok, examples, cfg)       # one per example, or one per episode with an environment
    live = agent.act(tok, roll)                       # run the calls of the last replies; rows that go on
    answers = agent.answers(tok, roll)                # each episode's last reply, for the reward

An episode ends when a reply calls no tool, after max_tool_calls rounds of calls, when its model tokens reach
max_new_tokens, when model and tool tokens together reach max_episode_tokens (0: no cap of its own), or when the
next tool results and reply would not fit the sampler's context (the model's, or the engine's max_model_len).
"""

from __future__ import annotations

import dataclasses
import inspect

import torch

from nanorl import distributed
from nanorl.agents.prefixes import reuse_prefixes
from nanorl.agents.tools import (
    environment_tools,
    fallback_system_prompt,
    parse_tool_calls,
    run_tool_calls,
    template_supports_tools,
    tools_by_name,
)
from nanorl.errors import ConfigError
from nanorl.seeds import derive_seed


def render(tok, messages: list[dict], tools: list, generation_prompt: bool) -> str:
    """The chat template's text of `messages`; the tools rendered by the template, or told in the system prompt
    (fallback_system_prompt) when the template has no tool support."""
    if tools and not template_supports_tools(tok):
        told = fallback_system_prompt(tools)
        if messages and messages[0]["role"] == "system":
            messages = [{"role": "system", "content": messages[0]["content"] + "\n\n" + told}, *messages[1:]]
        else:
            messages = [{"role": "system", "content": told}, *messages]
        tools = []
    return tok.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=False
    )


class Agent:
    """The tools and environments of a run, and the state of one rollout's episodes (rows as in Rollouts)."""

    def __init__(
        self,
        tools=(),
        environment_factory=None,
        max_tool_calls: int = 8,
        max_new_tokens: int = 32,
        max_episode_tokens: int = 0,
        timeout_s: float = 10.0,
    ):
        self.tools, self.factory = list(tools), environment_factory
        self.max_tool_calls, self.max_new_tokens, self.max_episode_tokens = (
            max_tool_calls,
            max_new_tokens,
            max_episode_tokens,
        )
        self.timeout_s, self.context = timeout_s, 0  # context: play() reads the sampler's
        if not self.tools and environment_factory is None:
            raise ValueError("an agent needs tools or an environment_factory")
        tools_by_name(self.tools)  # two tools with one name: an error now, before any model loads

    # ---------------------------------------------------------------- the start of a rollout's episodes

    def _factory(self, fields: dict):
        """The environment class of a row: the factory, or with a dict of them the row's `environment` column."""
        if isinstance(self.factory, dict):
            name = fields.get("environment")
            if name not in self.factory:
                raise ValueError(f"row's environment {name!r} is not one of {sorted(self.factory)}")
            return self.factory[name]
        return self.factory

    def prompts(self, tok, examples, group_size: int, system_prompt: str = "") -> list[list[int]]:
        """Prompt ids of the rollout's episodes: one per example (its group shares it), or with an environment one
        per episode (row), each with a fresh instance reset on the example's fields; reset's text, when it returns
        one, is appended to the last user message, as TRL does."""
        self.envs, self.messages, self.prompt_lengths = [], [], []
        prompts = []
        for ex in examples:
            base = [{"role": "user", "content": ex.prompt}] if isinstance(ex.prompt, str) else list(ex.prompt)
            if system_prompt and base[0]["role"] != "system":
                base = [{"role": "system", "content": system_prompt}, *base]
            for _ in range(group_size if self.factory is not None else 1):
                messages, tools = [dict(m) for m in base], list(self.tools)
                if self.factory is not None:
                    fields = {
                        k: v for k, v in ex.fields.items() if not isinstance(self.factory, dict) or k != "environment"
                    }
                    env = self._factory(ex.fields)()
                    opening = env.reset(**fields)
                    if opening:
                        messages[-1]["content"] += opening
                    self.envs.append(env)
                    tools += environment_tools(env)
                text = render(tok, messages, tools, generation_prompt=True)
                self.prompt_lengths.append(len(messages))
                prompts.append(tok(text, add_special_tokens=False)["input_ids"])
                self.messages.append(messages)
        if self.factory is None:  # one prompt per example: every episode of a group starts from it
            self.messages = [list(m) for m in self.messages for _ in range(group_size)]
            self.prompt_lengths = [n for n in self.prompt_lengths for _ in range(group_size)]
        n = len(self.messages)
        self.calls, self.failures, self.turn_start = [0] * n, [0] * n, [0] * n
        self.done, self.rounds = [False] * n, [0] * n
        return prompts

    def row_tools(self, i: int) -> list:
        return self.tools + (environment_tools(self.envs[i]) if self.factory is not None else [])

    reuse_prefixes = staticmethod(reuse_prefixes)  # later turns prefill only what the last turn added

    @staticmethod
    def seeds(per_prompt: list[int], n_prompts: int, seed: int, first_row: int) -> list[int]:
        """The first reply's seeds: one per prompt; with an environment one per episode (its prompt its own)."""
        if n_prompts == len(per_prompt):
            return per_prompt
        return [derive_seed(seed, first_row + i, "episode") for i in range(n_prompts)]

    def play(self, sampler, tok, roll, params, seed: int, first_row: int) -> None:
        """The turns after the first reply: while some episodes called tools, run the calls (act) and sample every
        live episode's next reply in one batch, each within its token budget. `first_row`: this process's first
        row in the global batch (each episode's draws come from its row and the turn)."""
        turn, self.context = 0, context_of(sampler)
        while live := self.act(tok, roll):
            turn += 1
            turn_params = dataclasses.replace(params, max_new_tokens=max(self.budget(roll, i) for i in live))
            seeds = [derive_seed(seed, first_row + i, "turn", turn) for i in live]
            prefixes = [roll.prompt_ids[i] + roll.completion_ids[i] for i in live]
            self.extend(roll, live, sampler.generate(prefixes, 1, turn_params, seeds))
        roll.episodes = [self.records(i) for i in range(len(roll.completion_ids))]  # kept with the rows they are

    # ---------------------------------------------------------------- a turn

    def act(self, tok, roll) -> list[int]:
        """Run the tool calls of each live episode's last reply and append their results (model_mask 0) -> the rows
        whose episodes go on (their next reply is sampled by the caller)."""
        if roll.model_mask is None:  # the first reply: every token the model's
            roll.model_mask = [torch.ones(len(c)) for c in roll.completion_ids]
        live = []
        for i, ids in enumerate(roll.completion_ids):
            if self.done[i]:
                continue
            reply = tok.decode(ids[self.turn_start[i] :], skip_special_tokens=True)
            content, calls = parse_tool_calls(reply)
            written = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
            self.messages[i].append(
                {"role": "assistant", "content": content, **({"tool_calls": written} if calls else {})}
            )
            if (
                not calls
                or roll.truncated[i]
                or self.rounds[i] >= self.max_tool_calls
                or roll.model_tokens(i) >= self.max_new_tokens
            ):
                self.done[i] = True
                continue
            results, failed = run_tool_calls(calls, tools_by_name(self.row_tools(i)), self.timeout_s)
            self.calls[i], self.failures[i], self.rounds[i] = (
                self.calls[i] + len(calls),
                self.failures[i] + failed,
                self.rounds[i] + 1,
            )
            suffix = self.suffix(tok, results, self.row_tools(i), tok.decode(ids[-1:]))
            if (self.max_episode_tokens and len(ids) + len(suffix) >= self.max_episode_tokens) or (
                self.context and len(roll.prompt_ids[i]) + len(ids) + len(suffix) >= self.context
            ):
                self.done[i] = True  # no room for the results and a reply: the episode ends here
                continue
            self.messages[i] += results
            append(roll, i, suffix, [0.0] * len(suffix), model=False)
            self.turn_start[i] = len(roll.completion_ids[i])
            live.append(i)
        return live

    def suffix(self, tok, results: list[dict], tools: list, end: str) -> list[int]:
        """Token ids that follow a reply ending in `end` (its stop token's text): the tool messages and the next
        assistant header, as the chat template renders them after a reply (found by rendering a short conversation
        with a marker for the reply; templates that rewrite earlier turns, as Qwen3's does with its thinking, are
        fine, since only what follows the reply is taken)."""
        marker = "NANORL-REPLY-MARKER"
        head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}]
        full = render(tok, head + results, tools, generation_prompt=True)
        after = full[full.rindex(marker) + len(marker) :]
        if not after.startswith(end):
            raise ValueError(f"the chat template does not end a reply with its stop token {end!r}: {after[:40]!r}")
        return tok(after[len(end) :], add_special_tokens=False)["input_ids"]

    def budget(self, roll, i: int) -> int:
        """How many more tokens the model may write in episode i."""
        left = self.max_new_tokens - roll.model_tokens(i)
        if self.max_episode_tokens:
            left = min(left, self.max_episode_tokens - len(roll.completion_ids[i]))
        if self.context:  # the whole episode, prompt included, within the sampler's context
            left = min(left, self.context - len(roll.prompt_ids[i]) - len(roll.completion_ids[i]))
        return max(left, 0)

    def extend(self, roll, live: list[int], more) -> None:
        """Append each live episode's new reply (`more`, one row per live episode), cut to its budget."""
        for k, i in enumerate(live):
            keep = self.budget(roll, i)
            ids, logps = more.completion_ids[k][:keep], more.logprobs[k][:keep]
            append(roll, i, ids, logps, model=True, truncated=more.truncated[k] or keep < len(more.completion_ids[k]))

    # ---------------------------------------------------------------- the end

    def answers(self, tok, roll) -> list[str]:
        """Each episode's last reply (what a reward of nanorl's form scores as `completion`)."""
        return [tok.decode(ids[s:], skip_special_tokens=True) for ids, s in zip(roll.completion_ids, self.turn_start)]

    def environment_rewards(self) -> dict[str, list]:
        """{class name: get_reward() of each episode's environment, None for another class's} (TRL's naming)."""
        out: dict[str, list] = {}
        for i, env in enumerate(getattr(self, "envs", []) if self.factory is not None else []):
            if hasattr(env, "get_reward"):
                reward = env.get_reward()
                out.setdefault(type(env).__name__, [None] * len(self.envs))[i] = (
                    float(reward) if not inspect.isawaitable(reward) else float(_await(reward))
                )
        return out

    def trl_episodes(self) -> dict:
        """What a TRL-form reward gets of the episodes: `completions`, each the messages after its prompt (the
        model's replies and the tool results), and `environments`, each episode's instance (or None)."""
        completions = [m[n:] for m, n in zip(self.messages, self.prompt_lengths)]
        return {"completions": completions, **({"environments": self.envs} if self.factory is not None else {})}

    def metrics(self, roll) -> dict:
        """The step's tool calls, failures, turns and tokens per episode, over every process's episodes."""
        rows = [
            [e["tool_calls"], e["tool_failures"], e["turns"], roll.model_tokens(i), len(roll.completion_ids[i])]
            for i, e in enumerate(roll.episodes)
        ]
        calls, failures, turns, model, length = distributed.gather(torch.tensor(rows, dtype=torch.float64)).sum(0)
        n = distributed.reduce(len(rows))
        return {
            "tools/call_frequency": (calls / n).item(),
            "tools/failure_frequency": (failures / max(calls, 1)).item(),
            "episode/turns_mean": (turns / n).item(),
            "episode/model_tokens_mean": (model / n).item(),
            "episode/tool_tokens_mean": ((length - model) / n).item(),
            "episode/len_mean": (length / n).item(),
        }

    def records(self, i: int) -> dict:
        """What samples.jsonl shows of episode i: every turn, tool call and tool result."""
        return {
            "messages": self.messages[i],
            "tool_calls": self.calls[i],
            "tool_failures": self.failures[i],
            "turns": self.rounds[i] + 1,
        }

    def eval_records(self) -> list[dict]:
        """What an evaluation's samples show of each episode: its messages, tool calls and environment reward."""
        rewards = self.environment_rewards()
        return [
            {**self.records(i), **{name: v[i] for name, v in rewards.items() if v[i] is not None}}
            for i in range(len(self.messages))
        ]

    def eval_metrics(self, samples: list[dict]) -> dict:
        """An evaluation's tool calls and failures per episode and environment rewards, from its samples."""
        n, out = max(len(samples), 1), {}
        out["eval/tool_calls_mean"] = sum(s["tool_calls"] for s in samples) / n
        out["eval/tool_failures_mean"] = sum(s["tool_failures"] for s in samples) / n
        for name in {type(env).__name__ for env in getattr(self, "envs", []) if hasattr(env, "get_reward")}:
            values = [s[name] for s in samples if name in s]
            out[f"eval/{name}_mean"] = sum(values) / max(len(values), 1)
        return out


def make_agent(cfg, task, tools=None, environment_factory=None):
    """The run's Agent, from the tools and environment given from Python, in the config (--tools, --environment) and
    the task's own (`Task.tools`, e.g. the calculator's; `Task.environment`, e.g. guess's) -> (agent, the config's
    record of those given from Python: {key: "python:name"})."""
    from nanorl.tasks.builtin import load_object

    names = [n.strip() for n in getattr(cfg, "tools", "").split(",") if n.strip()]
    python_tools = list(tools or [])
    tools = python_tools + list(task.tools) + [load_object(n, "tools") for n in names]
    env = environment_factory or (
        load_object(cfg.environment, "environment") if getattr(cfg, "environment", "") else task.environment
    )
    if not hasattr(cfg, "max_tool_calls"):
        raise ConfigError("tools and environments: `nanorl train` and `nanorl eval` only so far (not PPO)")
    if distributed.world_size() > 1 and getattr(cfg, "strategy", "ddp") == "fsdp":  # ranks' turns differ in number
        raise ConfigError("tools and environments: not yet under --strategy fsdp (each turn gathers the weights)")
    named = {}
    if python_tools:
        named["tools"] = ",".join(f"python:{getattr(f, '__name__', 'tool')}" for f in python_tools)
    if environment_factory is not None:
        factories = environment_factory if isinstance(environment_factory, dict) else {"": environment_factory}
        named["environment"] = ",".join(f"python:{getattr(f, '__name__', 'environment')}" for f in factories.values())
    return Agent(tools, env, cfg.max_tool_calls, cfg.max_new_tokens, cfg.max_episode_tokens), named


def context_of(sampler) -> int:
    """The longest sequence (prompt + reply) the sampler's model takes: a vLLM sampler's max_model_len, the local
    model's max_position_embeddings, or 0 when unknown."""
    if getattr(sampler, "context", 0):
        return sampler.context
    return getattr(getattr(getattr(sampler, "model", None), "config", None), "max_position_embeddings", 0) or 0


def _await(coroutine):
    import asyncio

    return asyncio.run(coroutine)


def append(roll, i: int, ids: list[int], logprobs: list[float], model: bool, truncated: bool = False) -> None:
    """Extend row i of the rollouts: tokens, their sampler log-probs, and whether the model wrote them."""
    roll.completion_ids[i] = list(roll.completion_ids[i]) + list(ids)
    roll.logprobs[i] = torch.cat([roll.logprobs[i], torch.as_tensor(logprobs, dtype=roll.logprobs[i].dtype)])
    roll.model_mask[i] = torch.cat([roll.model_mask[i], torch.full((len(ids),), float(model))])
    roll.truncated[i] = truncated

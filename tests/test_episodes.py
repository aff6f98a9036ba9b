"""Episodes with tools and environments (agents/episodes.py, online.rollout): the loop runs the calls of each
reply, appends their results as tokens the model did not write, samples the next reply, and ends; only the
model's tokens are trained and counted. A random tiny model never writes a tool call, so most tests drive the loop
with a sampler that replays scripted replies (the Sampler interface the loop calls) and train on its rows."""

import json

import pytest
import torch

from nanorl import online
from nanorl.agents.episodes import Agent
from nanorl.config import GRPOConfig
from nanorl.hub import tiny_model_and_tokenizer
from nanorl.logprobs import token_logprobs
from nanorl.sampling import Rollouts
from nanorl.tasks import Example, Task
from nanorl.update import policy_backward, rows_batch


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def call(name: str, **args) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


class Scripted:
    """A sampler (sampling.Sampler) whose replies are scripted: script(prompt text, turn) -> reply text. Every
    sampled token gets log-prob -1 (the loss tests use the learner's own)."""

    def __init__(self, tok, script):
        self.tok, self.script, self.turn, self.prompts = tok, script, 0, []

    def generate(self, prompts, group_size, params, seed):
        self.turn += 1
        rows, out = [p for p in prompts for _ in range(group_size)], []
        for p in rows:
            self.prompts.append(self.tok.decode(p))
            ids = self.tok(self.script(self.tok.decode(p), self.turn), add_special_tokens=False)["input_ids"]
            ids = ids + [self.tok.eos_token_id]
            out.append(ids[: params.max_new_tokens])
        logps = [torch.full((len(c),), -1.0) for c in out]
        truncated = [c[-1] != self.tok.eos_token_id for c in out]
        return Rollouts([list(p) for p in rows], out, logps, truncated, group_size)

    def sync_weights(self, model):
        pass


def setup(script, agent_kwargs=None, **cfg_kwargs):
    _, tok = tiny_model_and_tokenizer()
    cfg = GRPOConfig(
        **{"model": "tiny", "prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 200, **cfg_kwargs}
    )
    agent = Agent(**{"tools": [multiply], "max_new_tokens": cfg.max_new_tokens, **(agent_kwargs or {})})
    return tok, cfg, agent, Scripted(tok, script)


def test_a_tool_call_runs_its_result_is_appended_and_the_episode_goes_on_to_its_answer():
    def script(prompt, turn):
        return call("multiply", a=6, b=7) if turn == 1 else "It is 42."

    tok, cfg, agent, sampler = setup(script)
    examples = [Example("What is 6 * 7?", {"answer": 42}), Example("And 6 x 7?", {"answer": 42})]
    timer = {"rollout": 0.0, "reward": 0.0, "tokens": 0}
    roll, texts = online.rollout(sampler, tok, examples, cfg, 0, timer, agent)
    assert texts == ["It is 42."] * 4 and sampler.turn == 2  # all four episodes' second replies in one batch
    assert "You can call these tools" in sampler.prompts[0] and '"name": "multiply"' in sampler.prompts[0]
    first = tok(call("multiply", a=6, b=7), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    second = tok("It is 42.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    for i in range(4):
        ids, mask = roll.completion_ids[i], roll.model_mask[i]
        tool = ids[len(first) : len(ids) - len(second)]  # the tool message and the next assistant header
        assert ids[: len(first)] == first and ids[len(ids) - len(second) :] == second
        assert tok.decode(tool) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
        assert mask.tolist() == [1.0] * len(first) + [0.0] * len(tool) + [1.0] * len(second)
        assert (roll.logprobs[i][mask == 0] == 0).all() and roll.model_tokens(i) == len(first) + len(second)
    assert timer["tokens"] == 4 * (len(first) + len(second))  # model tokens only
    assert [m["role"] for m in agent.messages[0]] == ["user", "assistant", "tool", "assistant"]
    metrics = agent.metrics(roll)
    assert metrics["tools/call_frequency"] == 1.0 and metrics["episode/turns_mean"] == 2.0
    assert metrics["tools/failure_frequency"] == 0.0 and metrics["episode/tool_tokens_mean"] == len(tool)


def test_an_episode_ends_after_max_tool_calls_and_failures_are_counted():
    tok, cfg, agent, sampler = setup(lambda p, t: call("divide", a=1, b=2), {"max_tool_calls": 2})
    roll, texts = online.rollout(
        sampler, tok, [Example("Go.", {})], cfg, 0, {"rollout": 0, "reward": 0, "tokens": 0}, agent
    )
    assert sampler.turn == 3 and agent.rounds == [2, 2]  # two rounds of calls, then the last reply ends it
    assert agent.metrics(roll)["tools/failure_frequency"] == 1.0
    assert "unknown tool 'divide'" in agent.messages[0][2]["content"]


def test_the_model_token_budget_cuts_the_episode():
    tok, cfg, agent, sampler = setup(lambda p, t: call("multiply", a=2, b=3) + " and more words", max_new_tokens=100)
    roll, _ = online.rollout(
        sampler, tok, [Example("Go.", {})], cfg, 0, {"rollout": 0, "reward": 0, "tokens": 0}, agent
    )
    assert [roll.model_tokens(i) for i in range(2)] == [100, 100] and all(roll.truncated)  # the second reply cut


def test_an_episode_ends_before_it_outgrows_the_samplers_context():
    def script(prompt, turn):
        return call("multiply", a=123456789, b=987654321)  # calls on and on: only the context ends it

    tok, cfg, agent, sampler = setup(script, {"max_tool_calls": 50}, max_new_tokens=1000)
    sampler.context = 900  # the engine's max_model_len (a local sampler: its model's max_position_embeddings)
    roll, _ = online.rollout(
        sampler, tok, [Example("Go.", {})], cfg, 0, {"rollout": 0, "reward": 0, "tokens": 0}, agent
    )
    for i in range(2):
        assert len(roll.prompt_ids[i]) + len(roll.completion_ids[i]) <= 900
        assert 1 <= agent.rounds[i] < 50 and agent.done[i]
    sampler.context = 0  # unknown: the model's context is read from its config
    sampler.model = type("M", (), {"config": type("C", (), {"max_position_embeddings": 1200})()})()
    roll, _ = online.rollout(
        sampler, tok, [Example("Go.", {})], cfg, 0, {"rollout": 0, "reward": 0, "tokens": 0}, agent
    )
    assert agent.context == 1200 and all(len(p) + len(c) <= 1200 for p, c in zip(roll.prompt_ids, roll.completion_ids))


class Guess:
    """A guessing game in the shape of TRL's documented environments: reset opens it, `guess` is its tool,
    get_reward scores it."""

    made = 0

    def reset(self, target: int = 5, **row) -> str:
        Guess.made += 1
        self.target, self.guesses, self.solved = target, 0, False
        return " Guess my number."

    def guess(self, number: int) -> str:
        """Guess the number.

        Args:
            number: the guess
        """
        self.guesses += 1
        self.solved = number == self.target
        return "right" if self.solved else ("higher" if number < self.target else "lower")

    def get_reward(self) -> float:
        return float(self.solved) / self.guesses if self.guesses else 0.0


def test_an_environment_per_episode_its_opening_its_tools_and_its_reward():
    def script(prompt, turn):
        return call("guess", number=3 + 2 * (turn - 1)) if turn <= 2 else "Done."

    tok, cfg, agent, sampler = setup(script, {"tools": [], "environment_factory": Guess})
    Guess.made = 0
    examples = [Example("Play.", {"target": 5}), Example("Play again.", {"target": 7})]
    roll, texts = online.rollout(sampler, tok, examples, cfg, 0, {"rollout": 0, "reward": 0, "tokens": 0}, agent)
    assert Guess.made == 4 and len({id(e) for e in agent.envs}) == 4  # one instance per episode
    assert "Play. Guess my number." in sampler.prompts[0] and '"name": "guess"' in sampler.prompts[0]
    rewards = agent.environment_rewards()["Guess"]
    assert rewards == [0.5, 0.5, 0.0, 0.0]  # target 5: 3 then 5 (two guesses); target 7: never
    assert [m["content"] for m in agent.messages[2] if m["role"] == "tool"] == ["higher", "higher"]
    seen = {}

    def solved(completions, environments, **kwargs):  # a TRL-form reward: the episodes' messages, their instances
        seen["completions"] = completions
        return [float(env.solved) for env in environments]

    task = Task(
        "guess", train=examples, eval=examples, reward=[("task", lambda p, c, **f: 0.25, 1.0), ("solved", solved, 1.0)]
    )
    r, parts = online.reward(task, None, examples, texts, roll, cfg, {"reward": 0.0}, "cpu", agent=agent)
    assert parts["Guess"].tolist() == rewards and parts["solved"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert torch.allclose(r, parts["task"] + parts["solved"] + parts["Guess"])
    turns = seen["completions"][0]  # TRL's shape: the messages after the prompt
    assert [m["role"] for m in turns] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert turns[0]["tool_calls"][0]["function"] == {"name": "guess", "arguments": {"number": 3}}
    assert turns[0]["content"] == "" and turns[-1] == {"role": "assistant", "content": "Done."}


def test_only_model_tokens_are_trained_loss_by_hand_and_on_policy_ratio_one():
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer()

    def script(prompt, turn):
        return call("multiply", a=2, b=2) if turn == 1 else "4"

    _, cfg, agent, sampler = setup(script, samples_per_prompt=2, prompts_per_step=1)
    roll, _ = online.rollout(
        sampler, tok, [Example("2*2?", {})], cfg, 0, {"rollout": 0, "reward": 0, "tokens": 0}, agent
    )
    adv = torch.tensor([1.0, -0.5])
    model.zero_grad()
    stats = policy_backward(model, roll, adv, [0, 1], cfg, True, tok.pad_token_id, "cpu")
    got = [p.grad.clone() for p in model.parameters()]
    assert stats["ratio_min"] == stats["ratio_max"] == 1.0  # on-policy across turns: exactly 1
    assert stats["tokens"] == roll.model_tokens(0) + roll.model_tokens(1)
    # by hand: -sum over model tokens of A * logp, over the number of model tokens (token-level normaliser)
    model.zero_grad()
    b = rows_batch(roll, [0, 1], tok.pad_token_id, "cpu")
    logp, _ = token_logprobs(model, b, cfg.temperature)
    mask = torch.nn.utils.rnn.pad_sequence(roll.model_mask, batch_first=True)[:, : logp.shape[1]]
    (-(adv[:, None] * logp * mask).sum() / mask.sum()).backward()
    for g, p in zip(got, model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-6)
    assert mask.sum() < sum(len(c) for c in roll.completion_ids)  # there were tool tokens to leave out
    # off-policy with the sampler's log-probs equal to the learner's on model tokens (0 on tool tokens): every
    # trained ratio is 1 and the sampler/learner gap 0 only if the tool tokens are left out of both
    from nanorl.update import learner_logprobs

    roll.logprobs = [
        lp * m for lp, m in zip(learner_logprobs(model, roll, cfg, tok.pad_token_id, "cpu"), roll.model_mask)
    ]
    stats = policy_backward(model, roll, adv, [0, 1], cfg, False, tok.pad_token_id, "cpu")
    assert abs(stats["ratio_min"] - 1) < 1e-5 and abs(stats["ratio_max"] - 1) < 1e-5
    assert stats["logp_diff"] < 1e-4 * stats["tokens"]


def test_train_with_tools_from_python_records_them_and_logs_episode_metrics(tmp_path):
    from nanorl.grpo import train

    cfg = GRPOConfig(
        model="tiny",
        steps=1,
        prompts_per_step=2,
        samples_per_prompt=2,
        max_new_tokens=8,
        eval_size=2,
        out_dir=str(tmp_path / "run"),
    )
    train(cfg, tools=[multiply])
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert config["tools"] == "python:multiply" and "tools/call_frequency" in metrics
    assert sample["messages"][0]["role"] == "user" and sample["tool_calls"] == 0  # a random model calls nothing
    assert sample["messages"][-1]["role"] == "assistant"


def test_tools_from_the_command_line_and_bad_ones(tmp_path):
    from nanorl.cli import main

    (tmp_path / "mytools.py").write_text(
        "def add(a: int, b: int) -> int:\n    '''Add.\n\n    Args:\n        a: one\n        b: two\n    '''\n"
        "    return a + b\n"
    )
    out = tmp_path / "run"
    args = ["train", "--model", "tiny", "--steps", "1", "--prompts-per-step", "2", "--samples-per-prompt", "2"]
    main(
        args
        + ["--max-new-tokens", "8", "--eval-size", "2", "--out-dir", str(out), "--tools", f"{tmp_path}/mytools.py:add"]
    )
    assert json.loads((out / "config.json").read_text())["tools"].endswith("mytools.py:add")
    with pytest.raises(SystemExit):
        main(args + ["--out-dir", str(tmp_path / "bad"), "--tools", f"{tmp_path}/mytools.py:nothing"])
    dapo = tmp_path / "dapo"  # dynamic sampling: the tiny model's groups all score 0, so every refill is drawn
    main(args + ["--out-dir", str(dapo), "--tools", f"{tmp_path}/mytools.py:add", "--algo", "dapo", "--eval-size", "2"])
    assert json.loads((dapo / "metrics.jsonl").read_text())["rollout/refills"] > 0


def test_refilled_and_selected_episodes_keep_their_records_and_masks():
    """DAPO's dynamic sampling joins a step's rollouts and keeps some groups: each row keeps its own episode."""

    def script(prompt, turn):
        return call("multiply", a=2, b=3) if "Call." in prompt and "<|im_start|>tool" not in prompt else "done"

    tok, cfg, agent, sampler = setup(script)
    timer = {"rollout": 0, "reward": 0, "tokens": 0}
    first, _ = online.rollout(sampler, tok, [Example("Call."), Example("No.")], cfg, 0, timer, agent)
    more, _ = online.rollout(sampler, tok, [Example("No."), Example("Call.")], cfg, 1, timer, agent)
    joined = (first + more).groups([3, 1])  # the second rollout's "Call." group, then the first's "No."
    assert [e["tool_calls"] for e in joined.episodes] == [1, 1, 0, 0]
    assert [int(m.sum()) < len(m) for m in joined.model_mask] == [True, True, False, False]  # tool tokens
    assert joined.episodes[0]["messages"][-2] == {"role": "tool", "name": "multiply", "content": "6"}
    assert agent.metrics(joined)["tools/call_frequency"] == 0.5


def test_the_calculator_task_and_its_tool():
    from nanorl.tasks import get_task
    from nanorl.tasks.calculator import calculate

    assert calculate("123 * 45") == "5535" and calculate("(7 - 10) / 2") == "-1.5"
    for bad in ("__import__('os')", "2 ** 10", "x + 1", "9" * 300):
        with pytest.raises(ValueError):
            calculate(bad)
    task = get_task("calculator", eval_size=10)
    assert task.tools == [calculate] and len(task.eval) == 10
    assert not {e.prompt for e in task.eval} & {e.prompt for e in task.train[:2000]}
    ex = task.eval[0]
    a, b = (int(x) for x in ex.prompt.split("What is ")[1].split("?")[0].split(" * "))
    assert ex.fields["answer"] == a * b and task.score([ex], [f"So it is {a * b}."]) == [1.0]


def test_a_scripted_model_that_uses_the_calculator_is_rewarded(tmp_path):
    from nanorl.tasks import get_task

    task = get_task("calculator", eval_size=2)

    def script(prompt, turn):
        a, b = prompt.split("What is ")[1].split("?")[0].split(" * ")
        return call("calculate", expression=f"{a} * {b}") if turn == 1 else f"The answer is {int(a) * int(b)}."

    tok, cfg, agent, sampler = setup(script, {"tools": task.tools})
    roll, texts = online.rollout(sampler, tok, task.eval, cfg, 0, {"rollout": 0, "reward": 0, "tokens": 0}, agent)
    r, _ = online.reward(task, None, task.eval, texts, roll, cfg, {"reward": 0.0}, "cpu", agent=agent)
    assert r.tolist() == [1.0] * 4 and agent.metrics(roll)["tools/call_frequency"] == 1.0


def test_held_out_evaluation_runs_whole_episodes():
    from nanorl.evaluate import evaluate
    from nanorl.sampling import SamplingParams
    from nanorl.tasks import get_task

    task = get_task("calculator", eval_size=3)

    def script(prompt, turn):
        a, b = prompt.split("What is ")[1].split("?")[0].split(" * ")
        return call("calculate", expression=f"{a} * {b}") if "<|im_start|>tool" not in prompt else f"{int(a) * int(b)}"

    tok, cfg, agent, sampler = setup(script, {"tools": task.tools})
    metrics, samples = evaluate(sampler, tok, task, SamplingParams(200), k=2, agent=agent)
    assert metrics["eval/greedy_acc"] == 1.0 and metrics["eval/pass@2"] == 1.0
    metrics, _ = evaluate(Scripted(tok, script), tok, task, SamplingParams(200))  # no tools: one answer, a call
    assert metrics["eval/greedy_acc"] == 0.0


def test_later_turns_are_sampled_by_the_real_sampler_with_the_learners_log_probs():
    """The first reply scripted (a tool call), the second sampled by LocalSampler from the whole episode so far: its
    log-probs are those the learner computes for the same tokens."""
    from nanorl.sampling import LocalSampler
    from nanorl.update import learner_logprobs

    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer()
    model.eval()
    local = LocalSampler(model, [tok.eos_token_id], tok.pad_token_id)
    scripted = Scripted(tok, lambda p, t: call("multiply", a=3, b=4))

    class FirstScripted:
        def generate(self, prompts, group_size, params, seed):
            return (scripted if scripted.turn == 0 else local).generate(prompts, group_size, params, seed)

    _, cfg, agent, _ = setup(None, {"max_new_tokens": 120}, max_new_tokens=120)
    roll, _ = online.rollout(
        FirstScripted(), tok, [Example("3*4?", {})], cfg, 7, {"rollout": 0, "reward": 0, "tokens": 0}, agent
    )
    learner = learner_logprobs(model, roll, cfg, tok.pad_token_id, "cpu")
    for i in range(2):
        start = len(tok(call("multiply", a=3, b=4), add_special_tokens=False)["input_ids"]) + 1  # first reply + stop
        tool = int((roll.model_mask[i][start:] == 0).sum())
        rest = slice(start + tool, len(roll.completion_ids[i]))
        assert rest.stop > rest.start and roll.model_tokens(i) <= 120
        assert torch.allclose(roll.logprobs[i][rest], learner[i][rest], atol=1e-4)


QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and loop.last %}<think>\n\n</think>\n\n{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_rewrites_the_last_reply_still_gives_the_tool_suffix():
    _, tok = tiny_model_and_tokenizer()
    tok.chat_template = QWEN3_LIKE  # the last assistant turn gets an empty thinking block, earlier ones do not
    agent = Agent(tools=[multiply])
    ids = agent.suffix(tok, [{"role": "tool", "name": "multiply", "content": "12"}], [multiply], "<|im_end|>")
    assert tok.decode(ids) == "\n<|im_start|>tool\n12<|im_end|>\n<|im_start|>assistant\n"


def test_a_failing_trl_reward_is_scored_sample_by_sample_in_episodes():
    from nanorl.tasks import Task

    def picky(completions, **kwargs):  # TRL form: fails on the batch when any episode's last reply says "bad"
        if any("bad" in c[-1]["content"] for c in completions):
            raise ValueError("bad reply")
        return [1.0] * len(completions)

    tok, cfg, agent, sampler = setup(lambda p, t: "bad" if "Two" in p else "good", reward_errors="zero")
    examples = [Example("One.", {}), Example("Two.", {})]
    roll, texts = online.rollout(sampler, tok, examples, cfg, 0, {"rollout": 0, "reward": 0, "tokens": 0}, agent)
    task = Task("t", train=examples, eval=examples, reward=[("picky", picky, 1.0)], on_error="zero")
    r, _ = online.reward(task, None, examples, texts, roll, cfg, {"reward": 0.0}, "cpu", agent=agent)
    assert r.tolist() == [1.0, 1.0, 0.0, 0.0]


class Coin:
    def reset(self, **row) -> None:
        self.flips = 0

    def flip(self) -> str:
        """Flip the coin."""
        self.flips += 1
        return "heads"

    def get_reward(self) -> float:
        return float(self.flips)


def test_a_dict_of_environments_picks_one_per_row_and_train_takes_a_factory(tmp_path):
    def script(prompt, turn):
        return call("guess", number=5) if "guess" in prompt and turn == 1 else call("flip") if turn == 1 else "ok"

    tok, cfg, agent, sampler = setup(script, {"tools": [], "environment_factory": {"game": Guess, "coin": Coin}})
    examples = [Example("Play.", {"environment": "game", "target": 5}), Example("Flip.", {"environment": "coin"})]
    roll, _ = online.rollout(sampler, tok, examples, cfg, 0, {"rollout": 0, "reward": 0, "tokens": 0}, agent)
    assert [type(e).__name__ for e in agent.envs] == ["Guess", "Guess", "Coin", "Coin"]
    rewards = agent.environment_rewards()
    assert rewards["Guess"] == [1.0, 1.0, None, None] and rewards["Coin"] == [None, None, 1.0, 1.0]
    from nanorl.grpo import train

    out = tmp_path / "run"
    cfg = GRPOConfig(
        model="tiny", steps=1, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=8, eval_size=2, out_dir=str(out)
    )
    train(cfg, environment_factory=Guess)
    assert json.loads((out / "config.json").read_text())["environment"] == "python:Guess"
    assert "reward/Guess_mean" in json.loads((out / "metrics.jsonl").read_text().splitlines()[0])


def test_what_is_refused_before_any_model_loads(tmp_path):
    from nanorl.cli import main

    tiny = ["--model", "tiny", "--out-dir", str(tmp_path / "x")]
    for args in (["ppo", "--task", "calculator"], ["train", "--task", "calculator", "--max-episode-tokens", "4"]):
        with pytest.raises(SystemExit):
            main(args + tiny)


def bisect(prompt, turn):
    """A scripted player of the guessing game: the middle of the numbers still possible, read from the episode so
    far; the number once the environment says correct."""
    import re

    guesses = [int(g) for g in re.findall(r'"number": (\d+)', prompt.split("<|im_start|>user")[-1])]
    answers = re.findall(r"<\|im_start\|>tool\n(higher|lower|correct)", prompt)
    if answers and answers[-1] == "correct":
        return f"The number is {guesses[-1]}."
    low, high = 1, 32
    for g, a in zip(guesses, answers):
        low, high = (g + 1, high) if a == "higher" else (low, g - 1)
    return call("guess", number=(low + high) // 2)


def test_the_guess_task_an_environment_played_by_bisection_is_rewarded_by_its_guesses():
    from nanorl.evaluate import evaluate
    from nanorl.sampling import SamplingParams
    from nanorl.tasks import get_task
    from nanorl.tasks.guess import GuessNumber

    env = GuessNumber()
    env.reset(secret=11)
    answers = [env.guess(16), env.guess(8), env.guess(20), env.guess(11)]  # 20: outside what is still possible
    assert answers == ["lower: from 1 to 15", "higher: from 9 to 15", "lower: from 9 to 15", "correct: 11 in 4 guesses"]
    assert env.get_reward() == pytest.approx(2 / 6)
    with pytest.raises(ValueError):
        env.guess(11)  # solved: no more guesses, and the call is charged
    assert env.get_reward() == pytest.approx(1 / 6)
    task = get_task("guess", eval_size=4)
    assert task.environment is GuessNumber and all(1 <= e.fields["secret"] <= 32 for e in task.eval)

    tok, cfg, _, sampler = setup(bisect, max_new_tokens=1000)  # the tiny tokenizer's tokens are short
    agent = Agent(environment_factory=task.environment, max_new_tokens=1000)
    roll, texts = online.rollout(sampler, tok, task.eval[:2], cfg, 0, {"rollout": 0, "reward": 0, "tokens": 0}, agent)
    r, parts = online.reward(task, None, task.eval[:2], texts, roll, cfg, {"reward": 0.0}, "cpu", agent=agent)
    moves = [env.guesses for env in agent.envs]
    assert parts["solved"].tolist() == [1.0] * 4 and all(1 <= m <= 6 for m in moves)
    assert r.tolist() == pytest.approx([1 + (6 - m) / 6 for m in moves])
    assert texts == [f"The number is {task.eval[i // 2].fields['secret']}." for i in range(4)]

    metrics, samples = evaluate(Scripted(tok, bisect), tok, task, SamplingParams(1000), agent=agent)
    assert metrics["eval/greedy_acc"] == 1.0 and metrics["eval/tool_calls_mean"] == sum(
        s["tool_calls"] for s in samples
    ) / len(samples)
    assert metrics["eval/GuessNumber_mean"] == pytest.approx(sum(s["GuessNumber"] for s in samples) / 4)
    assert samples[0]["messages"][-1] == {"role": "assistant", "content": samples[0]["completion"]}
    assert [m["role"] for m in samples[0]["messages"][1:3]] == ["assistant", "tool"]


def test_nanorl_eval_with_tools_and_with_an_environment(tmp_path, capsys):
    from nanorl.cli import main

    (tmp_path / "mytools.py").write_text(
        'def add(a: int, b: int) -> int:\n    """Add.\n\n    Args:\n        a: one\n        b: two\n    """\n'
        "    return a + b\n"
    )
    tiny = ["--model", "tiny", "--eval-size", "2", "--max-new-tokens", "8"]
    main(["eval", *tiny, "--tools", f"{tmp_path}/mytools.py:add", "--out", str(tmp_path / "a.json")])
    out = json.loads((tmp_path / "a.json").read_text())
    assert out["metrics"]["eval/tool_calls_mean"] == 0.0  # a random tiny model writes no call
    assert [m["role"] for m in out["samples"][0]["messages"]] == ["user", "assistant"]  # the whole episode
    main(["eval", *tiny, "--task", "guess", "--out", str(tmp_path / "b.json")])
    assert json.loads((tmp_path / "b.json").read_text())["metrics"]["eval/GuessNumber_mean"] == 0.0
    with pytest.raises(SystemExit):
        main(["eval", *tiny, "--tools", f"{tmp_path}/mytools.py:nothing"])


def test_a_resumed_run_with_an_environment_equals_an_uninterrupted_one(tmp_path):
    """Environments are made anew for every episode from the row and the step's seeds, so a run stopped after its
    checkpoint and resumed logs what the uninterrupted run logs (the environment's reward part included)."""
    from nanorl.grpo import train

    def digits(completions, environments, **kw):  # reads the episodes' last replies and their environments
        return [
            sum(ch.isdigit() for ch in c[-1]["content"]) / 8 + e.target / 100 for c, e in zip(completions, environments)
        ]

    task = Task(
        "t", train=[Example(f"Play {i}.", {"target": i}) for i in range(16)], eval=[Example("Play.", {})], reward=digits
    )
    base = dict(model="tiny", prompts_per_step=2, samples_per_prompt=4, max_new_tokens=6, lr=1e-2, warmup_steps=0)
    base.update(lr_schedule="constant", eval_every=100, report_to="none", steps=4)
    train(GRPOConfig(out_dir=str(tmp_path / "straight"), **base), task, environment_factory=Guess)
    stopped = tmp_path / "stopped"
    train(GRPOConfig(out_dir=str(stopped), **{**base, "steps": 3, "save_every": 2}), task, environment_factory=Guess)
    train(GRPOConfig(out_dir=str(stopped), resume=True, **{**base, "save_every": 2}), task, environment_factory=Guess)
    a, b = ([json.loads(x) for x in open(p / "metrics.jsonl")] for p in (tmp_path / "straight", stopped))
    assert [x["step"] for x in a] == [x["step"] for x in b] == [1, 2, 3, 4]
    assert len({x["reward/task_mean"] for x in a}) > 1 and "reward/Guess_mean" in a[0]
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if not k.startswith(("time/", "perf/"))} == {
            k: v for k, v in y.items() if not k.startswith(("time/", "perf/"))
        }, x["step"]

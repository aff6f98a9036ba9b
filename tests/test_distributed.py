"""Data parallel training under torchrun (gloo on CPU): two processes take the same steps as one process on the
same global batch, and write one run folder. Each case launches real processes: `torchrun --nproc_per_node 2`
against a plain `python -m nanorl.cli`, on the tiny random model."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from same_run import assert_same_run, metrics

import nanorl

REWARD = """
def digits(completions, **kw):  # a reward the tiny random model's samples differ on: a learning signal
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


class Letters:  # an environment: its reward reads the episode's last reply, which the tool result leads into
    def reset(self, **row):
        self.text = ""
        return " Spell it."

    def spell(self, word: str) -> str:
        \"\"\"Spell a word.

        Args:
            word: the word
        \"\"\"
        return " ".join(word)

    def get_reward(self):
        return 0.5


def letters(completions, environments, **kw):  # TRL form: the episodes' messages and their environments
    return [sum(ch.isalpha() for ch in c[-1]["content"]) / 8 + e.get_reward()
            for c, e in zip(completions, environments)]
"""
GRPO = ["train", "--steps", "3", "--lr", "3e-3", "--reward", "r.py:digits"]
CASES = {  # on-policy GRPO; off-policy minibatches over 2 epochs with a KL loss, batch whitening, filtered overlong;
    # DPO on 30 pairs (24 trained: 3 steps of 8 rows, 3 per rank and micro-batch, so ranks hold 4 rows each)
    "grpo": GRPO,
    "offpolicy": GRPO
    + [
        "--algo",
        "reinforce_pp",
        "--minibatch-size",
        "16",
        "--epochs",
        "2",
        "--kl-coef",
        "0.05",
        "--overlong",
        "filter",
        "--max-new-tokens",
        "12",
    ],
    "episodes": ["train", "--steps", "3", "--lr", "3e-3", "--reward", "r.py:letters", "--environment", "r.py:Letters"],
    "ppo": [
        "ppo",
        "--steps",
        "3",
        "--lr",
        "3e-3",
        "--critic-lr",
        "3e-3",
        "--reward",
        "r.py:digits",
        "--minibatch-size",
        "16",
        "--epochs",
        "2",
        "--kl-coef",
        "0.05",
        "--max-new-tokens",
        "12",
    ],
    "dpo": [
        "dpo",
        "--data",
        "pairs.jsonl",
        "--batch-size",
        "8",
        "--micro-batch-size",
        "3",
        "--lr",
        "1e-3",
        "--eval-every",
        "2",
        "--max-new-tokens",
        "8",
    ],
}


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def command(tmp_path, name: str, args: list[str], procs: int, torchrun: bool = False) -> list[str]:
    """`nanorl` on the tiny model into tmp_path/name, under torchrun when procs > 1 (or asked); writes the reward
    and pairs."""
    (tmp_path / "r.py").write_text(REWARD)
    (tmp_path / "pairs.jsonl").write_text(
        "".join(
            json.dumps({"prompt": f"{a} + {b} =", "chosen": f" {a + b}", "rejected": f" {a * b + 1}"}) + "\n"
            for a in range(5)
            for b in range(6)
        )
    )
    launch = (
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs)]
        if procs > 1 or torchrun
        else [sys.executable]
    )
    return launch + [
        "-m",
        "nanorl.cli",
        *args,
        "--model",
        "tiny",
        *(["--eval-size", "10"] if args[0] != "rm" else []),  # a reward model has no task: no eval_size
        "--out-dir",
        str(tmp_path / name),
        "--report-to",
        "none",
    ]


def run(tmp_path, name: str, args: list[str], procs: int, torchrun: bool = False) -> subprocess.CompletedProcess:
    out = subprocess.run(
        command(tmp_path, name, args, procs, torchrun),
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_train_as_one(tmp_path, case):
    run(tmp_path, "one", CASES[case], 1)
    run(tmp_path, "two", CASES[case], 2)
    atol = 1e-5 if case == "ppo" else 1e-6  # PPO: two models' sums in another order, then Adam (~3e-6 seen)
    assert_same_run(tmp_path, ["model", "critic"] if case == "ppo" else ["model"], atol)  # PPO: and its critic
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "pairs.jsonl", "r.py", "two"]  # one run folder each


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_nodes_train_as_one_process(tmp_path, strategy):
    """Multi-node torchrun, as two launchers of one process each (`--nnodes 2`, c10d rendezvous on this host): every
    process is local rank 0 of its node, only global rank 0 writes, and the run equals one process (the nodes share
    the run folder's filesystem, as several nodes must: docs/scaling.md)."""
    args = GRPO + ["--kl-coef", "0.05", "--save-every", "2", "--strategy", strategy]
    run(tmp_path, "one", args[:-2] + ["--backend", "torch"], 1)
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = command(tmp_path, "two", args, 2)
    cmd[cmd.index("--nproc_per_node") : cmd.index("--nproc_per_node") + 2] = [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "nodes",
    ]
    nodes = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)
        for _ in range(2)
    ]
    try:
        outs = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in nodes:  # a hung rendezvous or run: leave no launcher behind
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert_same_run(tmp_path, ["model"], 1e-6)
    assert sum("[nanorl] done" in out for out, _ in outs) == 1  # one summary: the main process's


def test_an_offline_batch_with_fewer_rows_than_processes(tmp_path):
    """24 rows in batches of 23: the last batch has one row, so rank 1 holds none of it. It still runs one
    zero-weight micro-batch and reports the same statistics (collectives) as rank 0 (it used to stop with a
    collective mismatch under ddp)."""
    args = [
        "dpo",
        "--data",
        "pairs.jsonl",
        "--batch-size",
        "23",
        "--micro-batch-size",
        "8",
        "--lr",
        "1e-3",
        "--max-new-tokens",
        "8",
    ]
    run(tmp_path, "two", args, 2)
    run(tmp_path, "one", args, 1)
    assert_same_run(tmp_path, ["model"], 1e-6, steps=2)


def test_a_reward_batch_that_fails_on_one_rank_only(tmp_path):
    """A reward's own `.batch` returning flags (tasks.Scores) breaks on rank 1, which then scores its samples one
    by one, without flags: every rank still gathers the same parts (the missing flags are NaN there)."""
    (tmp_path / "flagged.py").write_text(
        "import os\nfrom nanorl.tasks import Scores\n\n\ndef odd(prompt, completion, **kw):\n"
        "    return float(len(completion) % 2)\n\n\ndef _batch(prompts, completions, fields, *a, **kw):\n"
        "    if os.environ['RANK'] == '1' and len(completions) > 1:\n        raise ValueError('breaks here')\n"
        "    return Scores([odd(p, c) for p, c in zip(prompts, completions)],\n"
        "                  {'odd': [len(c) % 2 for c in completions]})"
        "\n\n\nodd.batch = _batch\n"
    )
    run(tmp_path, "two", ["train", "--steps", "2", "--reward", "flagged.py:odd"], 2)
    rows = metrics(tmp_path / "two")
    assert len(rows) == 2 and all(0 <= r["reward/odd_odd_mean"] <= 1 for r in rows)  # rank 0's flags
    assert all(r["reward/odd_mean"] == pytest.approx(r["reward/mean"]) for r in rows)  # flags are not reward


@pytest.mark.parametrize(
    "more",
    [
        [],
        ["--kl-placement", "reward", "--is-mode", "token_truncate"],
        ["--lora-r", "4", "--grad-checkpointing", "true"],
    ],
)
def test_fsdp_shards_the_model_and_trains_as_one_process(tmp_path, more):
    """strategy fsdp: each rank holds half of every weight, gradient and AdamW state; the sums run in another
    order than in one process (reduce-scatter), so the weights agree to float rounding (3.4e-7 seen), not in every
    bit. Off-policy minibatches with a sharded reference for the KL (in the loss: one more forward per
    micro-batch; in the reward: a no-grad pass), and filtered overlong rows: the ranks hold different numbers of
    micro-batches (zero-weight fillers even them out). With LoRA (the reference: the adapters off) and gradient
    checkpointing (recomputed layers inside FSDP's gathers): the final model is merged from the saved adapter."""
    out = run(tmp_path, "two", CASES["offpolicy"] + more + ["--strategy", "fsdp"], 2)
    run(tmp_path, "one", CASES["offpolicy"] + more + ["--backend", "torch"], 1)  # FSDP runs plain PyTorch
    assert_same_run(tmp_path, ["model"], 1e-6)
    assert out.stdout.count("[nanorl] done:") == 1  # the main process speaks for the run
    assert "lm_head.weight" not in load_file(tmp_path / "two" / "model" / "model.safetensors")  # tied: saved once


OFFLINE = [
    "--data",
    "pairs.jsonl",
    "--batch-size",
    "9",
    "--micro-batch-size",
    "2",
    "--lr",
    "1e-3",
    "--eval-every",
    "2",
    "--max-new-tokens",
    "8",
]  # 24 rows: batches of 9, 9, 6; 4 and 5 rows per rank, so 2 and 3 micro-batches


def stopped_after_step_2(src, dst) -> None:
    """dst: the run folder src would have been had it stopped after its checkpoint of step 2."""
    shutil.copytree(src / "checkpoint", dst / "checkpoint")
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "out_dir": str(dst)}))
    for name in ("metrics", "eval", "samples"):
        lines = (src / f"{name}.jsonl").read_text().splitlines(keepends=True)
        (dst / f"{name}.jsonl").write_text("".join(x for x in lines if json.loads(x)["step"] <= 2))


@pytest.mark.parametrize("case", ["dpo", "sft", "rm", "ppo"])
def test_fsdp_trains_the_other_trainers_as_one_process(tmp_path, case):
    """strategy fsdp for DPO, SFT, the reward model with LoRA (its backbone and scalar head each an FSDP unit:
    nanorl runs them one by one) and PPO (policy and critic sharded, the critic's AdamW state written per rank too). The
    offline ranks hold unequal numbers of micro-batches; fillers of weight 0 pair their passes. Resumed from its
    checkpoint of step 2, the sharded run ends where it did, bit for bit."""
    offline = OFFLINE[:-2] if case == "rm" else OFFLINE  # a reward model does not generate: no max_new_tokens
    args = (CASES["ppo"] if case == "ppo" else [case, *offline]) + ["--save-every", "2"]
    args += ["--lora-r", "4"] if case == "rm" else []  # peft's wrapper around the backbone and head
    models = ["model", "critic"] if case == "ppo" else ["model"]
    out = run(tmp_path, "two", args + ["--strategy", "fsdp"], 2)
    run(tmp_path, "one", args + ["--backend", "torch"], 1)
    assert_same_run(tmp_path, models, 1e-5 if case == "ppo" else 1e-6)
    assert out.stdout.count(" done") == 1 and out.stdout.count("step 0 eval") == 1  # the main process speaks

    stopped_after_step_2(tmp_path / "two", tmp_path / "again")
    run(tmp_path, "again", args + ["--strategy", "fsdp", "--resume", "true"], 2)
    assert metrics(tmp_path / "again") == metrics(tmp_path / "two")
    for model in models:
        a, b = (load_file(tmp_path / r / model / "model.safetensors") for r in ("two", "again"))
        assert all(torch.equal(a[k], b[k]) for k in a), model


def test_an_fsdp_run_stopped_on_one_rank_resumes_to_the_uninterrupted_run(tmp_path):
    """SIGTERM reaching only rank 1: both ranks finish the same step and write its checkpoint (a collective), stop,
    and --resume continues to the same metrics and weights, bit for bit, as a run never stopped."""
    args = GRPO[:1] + [
        "--lr",
        "3e-3",
        "--reward",
        "r.py:digits",
        "--strategy",
        "fsdp",
        "--lr-schedule",
        "constant",
        "--kl-coef",
        "0.05",
        "--eval-every",
        "1000",
    ]
    run(tmp_path, "straight", args + ["--steps", "6"], 2)
    job = subprocess.Popen(
        command(tmp_path, "stopped", args + ["--steps", "500"], 2),
        cwd=tmp_path,
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
    )
    log, deadline = tmp_path / "stopped" / "metrics.jsonl", time.time() + 120
    while not (log.is_file() and log.read_text().strip()) and time.time() < deadline and job.poll() is None:
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
    env = {
        pid: dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ").read().split("\0") if "=" in kv)
        for pid in workers
    }
    ranks = {e["RANK"]: int(pid) for pid, e in env.items()}
    os.kill(ranks["1"], signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode != 0 and "stopped by SIGTERM after step" in err, err[-3000:]
    done = int((tmp_path / "stopped" / "checkpoint" / "step").read_text())
    assert 1 <= done < 6 and len(metrics(tmp_path / "stopped")) == done, err[-3000:]
    run(tmp_path, "stopped", args + ["--steps", "6", "--resume", "true"], 2)
    assert metrics(tmp_path / "stopped") == metrics(tmp_path / "straight")
    one, two = (load_file(tmp_path / r / "model" / "model.safetensors") for r in ("straight", "stopped"))
    assert all(torch.equal(one[k], two[k]) for k in one)


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--prompts-per-step", "3"], "'prompts_per_step': 3 must be divisible by the 2 processes"),
        (["train", "--algo", "dapo"], "'dynamic_sampling': not yet under torchrun"),
    ],
)
def test_what_cannot_run_sharded_is_refused_before_any_model_loads(tmp_path, args, message):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "-m",
        "nanorl.cli",
        *args,
        "--model",
        "tiny",
        "--out-dir",
        str(tmp_path / "run"),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert out.returncode != 0 and message in out.stderr, out.stderr[-2000:]
    # one line from each rank, no traceback through nanorl's code (torchrun adds its own report of the exit codes)
    assert f'File "{os.path.dirname(nanorl.__file__)}' not in out.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_fsdp_under_torchrun_in_one_process_shards_over_a_world_of_one(tmp_path):
    """`torchrun --nproc_per_node 1 ... --strategy fsdp`: the process group of one process, FSDP's units, its
    sharded optimizer checkpoint; the same steps as a plain process. What a single lent GPU can check of the nccl
    path (benchmarks/strategies.py in benchmarks/gpu.sh)."""
    args = GRPO + ["--kl-coef", "0.05", "--save-every", "2"]
    run(tmp_path, "two", args + ["--strategy", "fsdp"], 1, torchrun=True)
    run(tmp_path, "one", args + ["--backend", "torch"], 1)
    assert_same_run(tmp_path, ["model"], 1e-6)
    assert (tmp_path / "two" / "checkpoint" / "optimizer" / ".metadata").is_file()  # written by dcp: it was sharded


SLOW_END = """
import datetime, functools, os, sys, time
import torch.distributed as dist
dist.init_process_group = functools.partial(dist.init_process_group, timeout=datetime.timedelta(seconds=10))
from nanorl import checkpoint
unlock = checkpoint.unlock


def slow_unlock(out):  # after the final model and results.json: the main process still busy, past the timeout
    if os.environ["RANK"] == "0":
        time.sleep(25)
    unlock(out)


checkpoint.unlock = slow_unlock
from nanorl.cli import main
main(sys.argv[1:])
"""


def test_under_fsdp_the_others_wait_for_the_main_process_past_the_groups_timeout(tmp_path):
    """Under FSDP the end of a run waits for the main process (which writes the final model, and merges LoRA into
    its base read back from disk) on a side group with a long timeout: the default group's collectives give up
    sooner (nccl: 10 minutes; here the group is made with 10 seconds, and the main process ends 25 seconds after
    the other)."""
    (tmp_path / "slow_end.py").write_text(SLOW_END)
    cmd = command(tmp_path, "two", GRPO + ["--steps", "1", "--strategy", "fsdp", "--lora-r", "4"], 2)
    cmd[cmd.index("-m", 2) : cmd.index("nanorl.cli") + 1] = [str(tmp_path / "slow_end.py")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "two" / "results.json").is_file() and (tmp_path / "two" / "model" / "config.json").is_file()


def test_fsdp_in_one_process_is_refused_naming_the_key(tmp_path, capsys):
    from nanorl.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--model", "tiny", "--strategy", "fsdp", "--out-dir", str(tmp_path / "run")])
    assert (
        e.value.code == 2
        and "config key 'strategy': fsdp shards the model over torchrun's processes" in capsys.readouterr().err
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


LOADER = """
import json, sys, torch
from types import SimpleNamespace
from nanorl import distributed
from nanorl.models import load_model

cfg = SimpleNamespace(strategy="fsdp")
distributed.init(torch.device("cpu"), cfg)
model, tok = distributed.load(load_model, "tiny", "cpu", torch.float32, cfg)
meta = any(p.is_meta for p in model.parameters())
model = distributed.shard(model, cfg).eval()
ids = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14], [15, 16, 17, 18], [19, 20, 21, 22]])
seen = []


def last_logits(part):  # a forward under FSDP: every rank must run as many
    seen.append(part)
    with torch.no_grad():
        return model(input_ids=ids[part:part + 1]).logits[0, -1].tolist()


out = distributed.spread(model, list(range(5)), last_logits)
gathered = {}  # the dtype of the weights gathered for a pass: fp32, and bf16 under bf16-mixed (MixedPrecisionPolicy)
for dtype in ("float32", "bf16-mixed"):
    other = distributed.shard(load_model("tiny")[0], SimpleNamespace(strategy="fsdp", dtype=dtype))
    with distributed.full_weights(other):
        gathered[dtype] = str(next(other.parameters()).dtype)
try:
    distributed.load(load_model, sys.argv[1], "cpu", torch.float32, cfg)  # a folder that holds no model
except ValueError as e:
    error = str(e)


def unpicklable(name, device, dtype):  # a model with something pickle cannot send (a lambda)
    model, tok = load_model(name, device, dtype)
    model.hook = lambda: 0
    return model, tok


try:
    distributed.load(unpicklable, "tiny", "cpu", torch.float32, cfg)
except RuntimeError as e:
    unsent = str(e)
json.dump({"meta": meta, "seen": seen, "out": out, "error": error, "tok": tok.eos_token_id, "gathered": gathered,
           "unsent": unsent}, open(f"{sys.argv[1]}/{distributed.rank()}.json", "w"))
distributed.finish()
"""


def test_fsdp_loads_the_weights_once_and_spreads_held_out_passes_over_the_ranks(tmp_path):
    """Under FSDP only the main process reads the model; the other gets its skeleton on the meta device and its
    shards from the main process, and computes what one process would. A load that fails on the main process
    fails on every rank with its message (none waits), and so does a model whose skeleton cannot be pickled.
    `spread`: rank 0 computes parts 0-1 (and repeats part 0 to pair its FSDP forwards with rank 1's three), rank 1
    parts 2-4, and both get all five results in order. With dtype bf16-mixed the gathered weights are bf16 (the
    shards stay fp32)."""
    from nanorl.models import load_model

    (tmp_path / "load.py").write_text(LOADER)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            str(tmp_path / "load.py"),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert [r["meta"] for r in ranks] == [False, True]
    assert [r["seen"] for r in ranks] == [[0, 1, 0], [2, 3, 4]]
    model, tok = load_model("tiny")
    ids = torch.arange(3, 23).view(5, 4)
    with torch.no_grad():
        want = model(input_ids=ids).logits[:, -1]  # (5, V)
    for r in ranks:
        assert torch.allclose(torch.tensor(r["out"]), want, atol=1e-5)
        assert f"model {str(tmp_path)!r}: cannot be loaded" in r["error"] and r["tok"] == tok.eos_token_id
        assert r["gathered"] == {"float32": "torch.float32", "bf16-mixed": "torch.bfloat16"}
        assert "model 'tiny' loaded, but its skeleton cannot be sent" in r["unsent"] and "pickle" in r["unsent"]


def test_fsdp_shards_a_frozen_reward_model_and_trains_as_one_process(tmp_path):
    """GRPO with a reward model beside the rule reward under fsdp: the reward model is loaded by the main process
    and sharded like the policy (each rank scores its own rows, as many as the others: the per-layer gathers
    pair up), and the run takes the same steps as one process. Micro-batches of 4 rows: each rank's 16 rows chunk
    as one process's 32 do, so the reward model sees the same padded shapes (else scores differ by float rounding,
    2e-7, and the weights by 5e-6)."""
    from nanorl.reward_model import load_reward_model

    rm, tok = load_reward_model("tiny", "cpu")
    torch.nn.init.normal_(rm.score.weight, std=0.5, generator=torch.Generator().manual_seed(0))  # scores that differ
    rm.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    args = GRPO + ["--reward-model", str(tmp_path / "rm"), "--rm-weight", "0.5", "--micro-batch-size", "4"]
    out = run(tmp_path, "two", args + ["--strategy", "fsdp"], 2)
    run(tmp_path, "one", args + ["--backend", "torch"], 1)
    assert_same_run(tmp_path, ["model"], 3e-6)  # 1.1e-6 seen: larger rewards, so larger sums in another order
    rm_means = [[r["reward/rm_mean"] for r in metrics(tmp_path / run)] for run in ("one", "two")]
    assert rm_means[0] == rm_means[1] and 0 not in rm_means[0]  # the sharded reward model scores bit for bit
    assert "reward model" in out.stdout


@pytest.mark.parametrize("case", ["ddp-to-fsdp", "fsdp-to-one"])
def test_a_checkpoint_resumes_under_the_other_strategy(tmp_path, case):
    """A ddp checkpoint (AdamW's whole state, keyed by position) resumes under fsdp: renamed by parameter, each
    rank keeps its shards. An fsdp checkpoint (the shards, written by torch.distributed.checkpoint) resumes in
    one plain process, whole. Either ends where the uninterrupted run ends: the same metrics (rel 1e-5), weights
    within 1e-6 (the sums of FSDP's reduce-scatter run in another order)."""
    first, then = case.split("-to-")
    args = CASES["offpolicy"] + ["--save-every", "2", "--backend", "torch"]
    run(tmp_path, "one", args + ["--strategy", first], 2)  # uninterrupted; its checkpoint of step 2 stays
    stopped_after_step_2(tmp_path / "one", tmp_path / "two")
    resumed = run(
        tmp_path,
        "two",
        args + ["--resume", "true"] + (["--strategy", "fsdp"] if then == "fsdp" else []),
        2 if then == "fsdp" else 1,
    )
    assert "differ from the run being resumed" not in resumed.stderr
    assert_same_run(tmp_path, ["model"], 1e-6)


def test_fsdp_in_bf16_mixed_trains_in_two_processes_as_in_one(tmp_path):
    """dtype bf16-mixed under fsdp: bf16 gathers, fp32 gradient reductions into fp32 shards. Two processes take
    the same steps as a world of one with the same precision (bit for bit on this CPU); neither is one plain
    process's bf16-mixed (fp32 weights under autocast), which keeps the residual stream and norms in fp32."""
    args = GRPO + ["--dtype", "bf16-mixed", "--strategy", "fsdp"]
    run(tmp_path, "two", args, 2)
    run(tmp_path, "one", args, 1, torchrun=True)
    assert_same_run(tmp_path, ["model"], 1e-6)

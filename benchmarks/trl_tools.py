"""Tool-using episodes side by side: TRL 1.16's GRPOTrainer(tools=...) and nanorl's GRPO on the calculator task
(issue 35), from the same warmed-up model with the same settings: seconds per step, reward, tool calls and
held-out accuracy.

    pip install -e ".[bench]" trl==1.16.0          # TRL only for this benchmark; nanorl never imports it
    python benchmarks/trl_tools.py                 # warm-up, then 5 steps each: ~1 h on a 2-core CPU (TRL ~85%)
    python benchmarks/trl_tools.py --steps 2 --prompts-per-step 2 --group-size 4 --sft-rows 32 --eval-size 8 \
        --max-episode-tokens 96 --out /tmp/trl_tools_smoke --work /tmp/trl_tools_smoke_work   # smoke run
    python benchmarks/trl_tools.py --report-only   # redo table.md from OUT/curves.json

The model: SmolLM2-135M-Instruct (`--model`) with Qwen2.5's chat template, the very string TRL ships
(trl.chat_template_utils.qwen2_5_chat_template): TRL takes `tools=` only with a template it recognises
(`supports_tool_calling`, `add_response_schema`), and SmolLM2's is not one; both are ChatML
(<|im_start|>/<|im_end|>), so only the text around the turns changes. Both trainers then render the tool's schema
through that template and read `<tool_call>{json}</tool_call>` replies (TRL with the tokenizer's response parser,
nanorl with agents/tools.py). Untrained, the model never calls the tool (runs/calculator_cpu.sh), so a short SFT
warm-up comes first: `nanorl sft` on transcripts of training problems (call, result, answer) rendered by this
template with the tool. Its model is where both runs start.

The same settings, with nanorl's GRPOConfig the one source (TRL's config is built from it, as in
benchmarks/trl_curve.py): 8 prompts x 8 episodes a step, in nanorl's prompt order; one optimizer step on the 64
episodes in micro-batches of 8 (TRL: per_device_train_batch_size 8, gradient_accumulation_steps 8); an episode
capped at 128 tokens in all (TRL's max_completion_length counts model and tool tokens; nanorl gets
--max-episode-tokens 128 with --max-new-tokens 128, which then never binds first); at most 3 rounds of tool calls
(--max-tool-calls / max_tool_calling_iterations); temperature 1, no top-k/top-p; beta 0; token-level loss (TRL
"dapo"); group advantages with the sample std (nanorl --std-correction 1, as TRL); clip 0.2; AdamW lr 2e-5 (betas
0.9/0.99), cosine to 10% with no warmup (TRL's warmup starts at lr 0 and nanorl's at lr / (warmup + 1); without
one the two schedules are the same); gradient clip 1; fp32 (TRL's bf16 default off); no gradient checkpointing;
seed 0. Both rewards are nanorl's task reward (the last number of the episode's last reply; for TRL decoded from
the episode's tokens after the last assistant header, as nanorl's Agent.answers does). Held-out accuracy is
nanorl's `evaluate` with the run's agent (greedy whole episodes on 50 held-out problems): nanorl's in its run
(the warm-up model at step 0, then its final model), TRL's final model by `nanorl eval`, so the same code scores
both.

Times are training time only (rollout + reward + update; no evaluation, loading or saving): nanorl's
`time/step`, and TRL's clock from on_step_begin to on_step_end. The two run in turn, one step each (nanorl in a
spawned process, as `nanorl train` with these settings, TRL in this one; each waits while the other steps), so
that both see the same load from whatever else runs on the machine. Large files (models, run folders) go to
--work; OUT gets curves.json, table.md and the small logs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from trl_curve import nanorl_curve, trl_args  # benchmarks/ is on sys.path when this file runs as a script


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def cpu_model() -> str:
    info = dict(
        line.split(":", 1) for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    )
    fields = ("Model name", "CPU family", "Model", "CPU(s)")
    return ", ".join(f"{k.strip()}: {info[k].strip()}" for k in fields if k in info)


def flags(settings: dict) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]


def run(cmd: list[str], log: Path) -> None:
    """A command with its output to the console and to `log`; a failure stops the benchmark."""
    print("[trl_tools] $ " + " ".join(cmd), flush=True)
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
    if proc.wait():
        raise SystemExit(f"[trl_tools] failed ({proc.returncode}): {' '.join(cmd)}; log in {log}")


# ----------------------------------------------------------------------------- the warm-up


def tools_system(tok, tools) -> str:
    """The system message the chat template writes when given `tools` (Qwen2.5: its default text, then the tools)."""
    text = tok.apply_chat_template([{"role": "user", "content": "x"}], tools=tools, tokenize=False)
    return text.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]


def transcripts(task, tok, n: int) -> list[dict]:
    """SFT rows {messages}: a training problem, the call, its result, the answer. `nanorl sft` renders a
    conversation without tools, so the template's tool text is given as the system message: the tokens are those
    of the conversation rendered with tools=[calculate] (checked in warm_up)."""
    from nanorl.tasks.calculator import calculate

    system = tools_system(tok, task.tools)
    rows = []
    for ex in task.train[:n]:  # training problems only; the held-out ones are never seen
        a, b = ex.prompt.split("What is ")[1].split("?")[0].split(" * ")
        call = {"type": "function", "function": {"name": "calculate", "arguments": {"expression": f"{a} * {b}"}}}
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": ex.prompt},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "name": "calculate", "content": calculate(f"{a} * {b}")},
                    {"role": "assistant", "content": f"{a} * {b} = {ex.fields['answer']}"},
                ]
            }
        )
    return rows


def warm_up(a, work: Path, out: Path) -> Path:
    """SmolLM2 with Qwen2.5's template (work/base), then `nanorl sft` on tool-using transcripts -> work/warm/model."""
    from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling

    from nanorl.config import SFTConfig
    from nanorl.models import load_model
    from nanorl.tasks.calculator import calculator_task
    from nanorl.tasks.preferences import encode_sft, read_pairs

    model_dir = work / "warm" / "model"
    if (model_dir / "config.json").is_file() and not a.redo:
        print(f"[trl_tools] warm-up: reusing {model_dir}")
        return model_dir
    model, tok = load_model(a.model, "cpu", torch.float32)
    tok.chat_template = qwen2_5_chat_template
    assert supports_tool_calling(tok)
    model.save_pretrained(work / "base")
    tok.save_pretrained(work / "base")
    task = calculator_task(eval_size=a.eval_size, seed=0)
    rows = transcripts(task, tok, a.sft_rows)
    (work / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the rows as `nanorl sft` will encode them (read through datasets) == the conversations rendered with the tool
    cfg = SFTConfig(max_length=a.sft_max_length)
    pairs, held = read_pairs(str(work / "sft.jsonl"), "sft", cfg.eval_fraction, cfg.seed)
    for pair, row in zip(pairs + held, encode_sft(tok, pairs + held, cfg)):
        with_tools = tok.apply_chat_template(pair.turns[1:], tools=task.tools, tokenize=False)
        ids = tok(with_tools, add_special_tokens=False)["input_ids"]
        assert row["prompt"] + row["chosen"] == ids[: len(row["prompt"]) + len(row["chosen"])], "SFT tokens differ"
        assert not row["cut"], f"--sft-max-length {a.sft_max_length} cuts a transcript"
    settings = dict(
        model=work / "base",
        data=work / "sft.jsonl",
        task="",
        max_length=a.sft_max_length,
        epochs=1,
        batch_size=16,
        micro_batch_size=4,  # no effect on the math; less memory next to the other work on the machine
        eval_every=100,
        save_every=0,
        dtype="float32",
        device="cpu",
        report_to="none",
        out_dir=work / "warm",
    )
    run(["nanorl", "sft", *flags(settings)], out / "sft.log")
    shutil.copy(work / "warm" / "metrics.jsonl", out / "sft_metrics.jsonl")
    _, tok = load_model(str(model_dir))
    assert tok.chat_template == qwen2_5_chat_template, "the warm-up model's template is not TRL's Qwen2.5 string"
    return model_dir


# ----------------------------------------------------------------------------- the two runs, a step each in turn


def grpo_settings(a, start: Path, work: Path) -> dict:
    """nanorl's GRPOConfig keys of the run (the rest at their defaults); TRL's config is built from the same."""
    return dict(
        model=str(start),
        task="calculator",
        steps=a.steps,
        prompts_per_step=a.prompts_per_step,
        samples_per_prompt=a.group_size,
        max_new_tokens=a.max_episode_tokens,  # an episode's model tokens: never more than its cap in all
        max_episode_tokens=a.max_episode_tokens,  # TRL's max_completion_length: model and tool tokens
        max_tool_calls=a.max_tool_calls,
        std_correction=1,  # TRL's group std is torch.std (the sample std)
        warmup_steps=0,  # TRL's warmup starts at lr 0, nanorl's at lr / (warmup + 1); without one they are the same
        eval_every=a.steps,  # held-out before and after
        eval_size=a.eval_size,
        save_every=0,
        dtype="float32",
        device="cpu",
        seed=0,
        report_to="none",
        out_dir=str(work / "nanorl"),
    )


def nanorl_side(settings: dict, conn) -> None:
    """nanorl's run, in a process of its own: `nanorl train` with `settings`, handing the machine to TRL after each
    step (its evaluations included) and waiting for TRL's step to end."""
    from nanorl.config import GRPOConfig
    from nanorl.grpo import train

    def baton(step, _metrics):
        conn.send(step)  # TRL's turn
        conn.recv()  # ours again

    train(GRPOConfig(**settings), callbacks=[baton])
    conn.send("done")


def nanorl_record(settings: dict, out: Path) -> dict:
    """nanorl's steps and held-out accuracy from its run folder (a copy of its small files goes to OUT)."""
    run_dir = Path(settings["out_dir"])
    for name in ("config.json", "metrics.jsonl", "eval.jsonl", "samples.jsonl", "results.json"):
        shutil.copy(run_dir / name, out / f"nanorl_{name}")
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(x) for x in (run_dir / "eval.jsonl").read_text().splitlines()]
    return {
        "command": " ".join(["nanorl", "train", *flags(settings)]),
        "steps": [
            {
                "step": m["step"],
                "s": m["time/step"],
                "rollout_s": m["time/rollout"] + m["time/reward"],
                "reward": m["reward/mean"],
                "tool_calls": m["tools/call_frequency"],
                "tool_failures": m["tools/failure_frequency"],
                "model_tokens": m["episode/model_tokens_mean"],
                "episode_tokens": m["episode/len_mean"],
            }
            for m in metrics
        ],
        "held_out": {e["step"]: e["eval/greedy_acc"] for e in evals},
        "curve": nanorl_curve(run_dir),
    }


def last_reply(tok, ids: list[int]) -> str:
    """The episode's last reply: its tokens after the last assistant header (all of them when it made no call),
    decoded as nanorl's Agent.answers does."""
    header = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    starts = [i + len(header) for i in range(len(ids) - len(header) + 1) if ids[i : i + len(header)] == header]
    return tok.decode(ids[starts[-1] if starts else 0 :], skip_special_tokens=True)


def run_both(settings: dict, work: Path, out: Path) -> tuple[dict, dict]:
    """TRL's GRPOTrainer here and nanorl in a spawned process, one step each in turn (nanorl first), so that both
    see the same load from whatever else runs on the machine; then TRL's model scored by `nanorl eval`."""
    import multiprocessing

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from nanorl.config import GRPOConfig
    from nanorl.models import load_model
    from nanorl.online import prompt_order
    from nanorl.tasks import task_from_config

    for d in (work / "nanorl", work / "trl"):
        shutil.rmtree(d, ignore_errors=True)
    cfg = GRPOConfig(**settings)
    assert cfg.max_new_tokens == cfg.max_episode_tokens, "TRL's max_completion_length caps the whole episode"
    torch.manual_seed(cfg.seed)
    task = task_from_config(cfg)
    model, tok = load_model(cfg.model, "cpu", torch.float32)
    order = [i for s in range(cfg.steps) for i in prompt_order(len(task.train), cfg.seed, s, cfg.prompts_per_step)]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": task.train[i].prompt}], "row": i} for i in order])

    def reward(prompts, completions, completion_ids, row, **_):  # nanorl's task reward on the last reply
        return task.score([task.train[i] for i in row], [last_reply(tok, ids) for ids in completion_ids])

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=trl_args(
            cfg,
            str(work / "trl"),
            max_completion_length=cfg.max_episode_tokens,
            max_tool_calling_iterations=cfg.max_tool_calls,
        ),
        train_dataset=data,
        processing_class=tok,
        tools=task.tools,
    )
    assert trainer.accelerator.mixed_precision == "no", "TRL must run in fp32, as nanorl does on CPU"

    # ----------------------------------------------------------------------------- clock and turns
    rec = {"step_s": [], "rollout_s": [], "logs": [], "load": []}  # load: 1-min load average after each side's step
    generate = trainer._generate

    def timed_generate(*args, **kw):  # TRL's rollout: first replies, tool calls, later replies
        t = time.perf_counter()
        result = generate(*args, **kw)
        rec["rollout_s"].append(time.perf_counter() - t)
        return result

    trainer._generate = timed_generate
    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    nanorl = ctx.Process(target=nanorl_side, args=(settings, child_conn), daemon=True)

    class Turns(TrainerCallback):
        def on_step_begin(self, *_a, **_kw):
            done = conn.recv()  # nanorl's step `done` is over (EOFError: its process died)
            if not isinstance(done, int):
                raise RuntimeError(f"nanorl ended before TRL's step: {done}")
            rec["load"].append([os.getloadavg()[0]])
            self.t = time.perf_counter()

        def on_step_end(self, _args, state, *_a, **_kw):
            rec["step_s"].append(time.perf_counter() - self.t)
            rec["load"][-1].append(os.getloadavg()[0])
            print(f"[trl_tools] TRL step {state.global_step}: {rec['step_s'][-1]:.1f} s", flush=True)
            conn.send("go")

        def on_log(self, _args, state, _control, logs=None, **_kw):
            rec["logs"].append({"step": state.global_step, **(logs or {})})
            (out / "trl_logs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rec["logs"]))

    trainer.add_callback(Turns())
    nanorl.start()
    child_conn.close()  # the child's end: only the child holds it now, so its death reads as EOF here
    trainer.train()
    assert conn.recv() == "done"
    nanorl.join()
    trainer.save_model(str(work / "trl" / "model"))
    tok.save_pretrained(work / "trl" / "model")

    # ----------------------------------------------------------------------------- TRL's model, scored by nanorl
    keys = ("task", "eval_size", "max_new_tokens", "max_episode_tokens", "max_tool_calls", "dtype", "device")
    evaluation = {"model": work / "trl" / "model", **{k: settings[k] for k in keys}, "out": work / "trl_eval.json"}
    run(["nanorl", "eval", *flags(evaluation)], out / "trl_eval.log")
    acc = json.loads((work / "trl_eval.json").read_text())["metrics"]["eval/greedy_acc"]
    logs = [x for x in rec["logs"] if "reward" in x]
    trl_rec = {
        "config": {k: v for k, v in trl_args(cfg, str(work / "trl")).to_dict().items() if not k.startswith("_")},
        "steps": [
            {
                "step": x["step"],
                "s": s,
                "rollout_s": r,
                "reward": x["reward"],
                "tool_calls": x["tools/call_frequency"],
                "tool_failures": x["tools/failure_frequency"],
                "model_tokens": x["completions/mean_length"],
                "load": load,
            }
            for x, s, r, load in zip(logs, rec["step_s"], rec["rollout_s"], rec["load"])
        ],
        "held_out": {cfg.steps: acc},
        "eval_command": " ".join(["nanorl", "eval", *flags(evaluation)]),
    }
    return nanorl_record(settings, out), trl_rec


# ----------------------------------------------------------------------------- main and report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-episode-tokens", type=int, default=128)
    p.add_argument("--max-tool-calls", type=int, default=3)
    p.add_argument("--eval-size", type=int, default=50)
    p.add_argument("--sft-rows", type=int, default=140, help="warm-up transcripts (a fifth held out by nanorl sft)")
    p.add_argument("--sft-max-length", type=int, default=384)
    p.add_argument("--out", default=f"results/trl_tools_{commit()}")
    p.add_argument("--work", default="/tmp/trl_tools_work", help="models and run folders (large files)")
    p.add_argument("--redo", action="store_true", help="redo the warm-up and both runs even if their files exist")
    p.add_argument("--report-only", action="store_true", help="redo table.md from OUT/curves.json; no training")
    a = p.parse_args()
    out, work = Path(a.out), Path(a.work)
    if a.report_only:
        report(json.loads((out / "curves.json").read_text()), out)
        return
    if a.redo and work.exists():
        shutil.rmtree(work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)

    import accelerate
    import datasets
    import transformers
    import trl

    import nanorl

    res = {
        "command": "python " + " ".join(sys.argv),
        "commit": commit(),
        "dirty": bool(subprocess.run(["git", "status", "--porcelain", "-uno"], capture_output=True, text=True).stdout),
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
            "accelerate": accelerate.__version__,
            "datasets": datasets.__version__,
            "nanorl": getattr(nanorl, "__version__", "?"),
        },
        "args": vars(a),
    }
    start = warm_up(a, work, out)
    settings = grpo_settings(a, start, work)
    res["nanorl"], res["trl"] = run_both(settings, work, out)
    (out / "curves.json").write_text(json.dumps(res, indent=1, default=str))
    report(res, out)


def report(res: dict, out: Path) -> None:
    """OUT/table.md from the two runs' steps, and the ratios printed."""
    ours, theirs = res["nanorl"]["steps"], res["trl"]["steps"]
    rows = [
        "| step | nanorl s | TRL s | TRL / nanorl | reward nanorl | reward TRL | calls/ep nanorl | calls/ep TRL "
        "| failed calls nanorl | failed calls TRL | model tokens/ep nanorl | model tokens/ep TRL | load nanorl / TRL |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o, t in zip(ours, theirs):
        rows.append(
            f"| {o['step']} | {o['s']:.1f} | {t['s']:.1f} | {t['s'] / o['s']:.2f} | {o['reward']:.2f} "
            f"| {t['reward']:.2f} | {o['tool_calls']:.2f} | {t['tool_calls']:.2f} | {o['tool_failures']:.0%} "
            f"| {t['tool_failures']:.0%} | {o['model_tokens']:.1f} | {t['model_tokens']:.1f} "
            f"| {' / '.join(f'{x:.1f}' for x in t.get('load', []))} |"
        )
    total_o, total_t = sum(o["s"] for o in ours), sum(t["s"] for t in theirs)
    roll_o, roll_t = sum(o["rollout_s"] for o in ours), sum(t["rollout_s"] for t in theirs)
    rows.append(f"| all | {total_o:.0f} | {total_t:.0f} | {total_t / total_o:.2f} | | | | | | | | | |")
    held_o, held_t = res["nanorl"]["held_out"], res["trl"]["held_out"]
    before = held_o.get("0", held_o.get(0))
    after_o = held_o.get(str(len(ours)), held_o.get(len(ours)))
    after_t = held_t.get(str(len(theirs)), held_t.get(len(theirs)))
    lines = [
        f"commit {res['commit']}{' (dirty tree)' if res.get('dirty') else ''}; {res['cpu']}; "
        + ", ".join(f"{k} {v}" for k, v in res["versions"].items()),
        "",
        *rows,
        "",
        f"Training seconds (rollout + reward + update): nanorl {total_o:.0f}, TRL {total_t:.0f}, TRL / nanorl "
        f"{total_t / total_o:.2f}; of it rollouts (nanorl: rollout + reward; TRL: _generate): nanorl {roll_o:.0f}, "
        f"TRL {roll_t:.0f} ({roll_t / roll_o:.2f}); the rest (update): nanorl {total_o - roll_o:.0f}, "
        f"TRL {total_t - roll_t:.0f} ({(total_t - roll_t) / max(total_o - roll_o, 1e-9):.2f}).",
        f"Held-out greedy accuracy (nanorl's evaluate, whole episodes): warm-up model {before:.0%}; after "
        f"{len(ours)} steps nanorl {after_o:.0%}, TRL {after_t:.0%}.",
        "",
        f"nanorl: `{res['nanorl']['command']}`",
        "",
        f"benchmark: `{res['command']}`",
    ]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

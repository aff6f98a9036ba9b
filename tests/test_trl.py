"""A TRL user's work runs unchanged: reward functions in TRL's batched form (the examples of TRL's GRPO
documentation, written here so TRL is not needed), TRL's config names, and datasets in TRL's standard and
conversational formats, from the CLI and from Python, on the tiny model."""

import dataclasses
import json
import re

import pytest
import torch

from nanorl.cli import main
from nanorl.config import ConfigError, DPOConfig, GRPOConfig, PPOConfig, SFTConfig, from_dict, parse_args
from nanorl.tasks import Example, RewardSetupError, Task, get_task, parse_reward_spec

datasets = pytest.importorskip("datasets")


# --- TRL's documented reward functions (trl docs, "Using a custom reward function")
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(pattern, content) else 0.0 for content in completion_contents]


def reward_func(completions, ground_truth, **kwargs):
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def math_only(prompts, completions, task, **kwargs):  # multi-task: None = "not mine"
    return [float("4" in c) if t == "math" else None for c, t in zip(completions, task)]


def step_and_ids(completion_ids, trainer_state, **kwargs):  # no `completions`: still TRL's form
    return [trainer_state.global_step + len(ids) / 100 for ids in completion_ids]


def test_trl_reward_functions_score_batches_as_trl_calls_them():
    rows = [Example("q1", {"ground_truth": "4", "task": "math"}), Example("q2", {"ground_truth": "5", "task": "code"})]
    task = Task(
        "t",
        train=rows,
        eval=rows,
        reward=[
            ("len", reward_len, 1.0),
            ("boxed", reward_func, 2.0),
            ("math", math_only, 1.0),
            ("state", step_and_ids, 0.0),
        ],
    )
    task.check()
    completions = ["so \\boxed{4}", "x" * 20]
    parts, total, errors = task.score_parts(rows, completions, completion_ids=[[1, 2], [3]], step=7)
    assert parts["len"] == [-8.0, 0.0] and parts["boxed"] == [1.0, 0.0] and errors == 0
    assert parts["math"] == [1.0, None]  # the code row is not scored by the math reward ...
    assert total == [-8.0 + 2.0 + 1.0, 0.0]  # ... and its None adds nothing, as TRL's nansum
    assert parts["state"] == [7.02, 7.01]  # trainer_state.global_step and completion_ids reach the reward
    # conversational prompts get conversational completions
    chat = [Example([{"role": "user", "content": "hi"}])]
    t2 = Task("c", train=chat, eval=[], reward=format_reward_func)
    assert t2.score(chat, ["<think>a</think><answer>b</answer>"]) == [1.0]
    # nanorl's per-sample form keeps working beside them
    t3 = Task(
        "n",
        train=rows,
        eval=[],
        reward=[("mine", lambda p, c, **f: float(c == f["ground_truth"]), 1.0), ("len", reward_len, 1.0)],
    )
    assert t3.score(rows, ["4", "6"]) == [1.0 - 19, -19.0]


def test_rewards_that_fail_for_a_reason_not_the_sample_stop_the_run_whatever_reward_errors_says(tmp_path):
    rows = [Example("q", {"answer": 1})]

    def needs_a_column(completions, solution, **kwargs):
        return [1.0] * len(completions)

    def imports_missing(completions, **kwargs):
        import nanorl_no_such_module  # noqa: F401

    def wrong_length(completions, **kwargs):
        return [1.0]

    with pytest.raises(RewardSetupError, match="solution"):  # found by check(), before any model is loaded
        Task("t", train=rows, eval=rows, reward=needs_a_column, on_error="zero").check()
    with pytest.raises(RewardSetupError, match="nanorl_no_such_module"):
        Task("t", train=rows, eval=rows, reward=imports_missing, on_error="zero").score(rows * 2, ["a", "b"])
    with pytest.raises(RewardSetupError, match="list of 2 values"):
        Task("t", train=rows, eval=rows, reward=wrong_length, on_error="zero").score(rows * 2, ["a", "b"])

    def flaky(completions, **kwargs):  # fails on one sample: the others still count under reward_errors zero
        return [1 / len(c) for c in completions]

    parts, total, errors = Task("t", train=rows, eval=rows, reward=flaky, on_error="zero").score_parts(
        rows * 3, ["ab", "", "a"]
    )
    assert total == [0.5, 0.0, 1.0] and errors == 1
    with pytest.raises(RuntimeError, match="completion ''"):
        Task("t", train=rows, eval=rows, reward=flaky).score(rows * 3, ["ab", "", "a"])
    # a missing column of a data file is named before the model loads (this model does not exist)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "solution": "1"}) + "\n" for i in range(4)))
    with pytest.raises(RewardSetupError, match="answer"):
        from nanorl.grpo import train

        train(GRPOConfig(model="no/such-model", task=str(data), out_dir=str(tmp_path / "r")))


def test_trl_names_are_aliases_and_near_misses_get_a_suggestion(tmp_path):
    cfg = from_dict(
        GRPOConfig,
        {
            "num_generations": 4,
            "max_completion_length": 16,
            "beta": 0.04,
            "epsilon": 0.3,
            "learning_rate": 1e-6,
            "loss_type": "dr_grpo",
            "scale_rewards": False,
            "num_iterations": 2,
            "importance_sampling_level": "sequence",
        },
    )
    assert (cfg.samples_per_prompt, cfg.max_new_tokens, cfg.kl_coef, cfg.clip_low, cfg.clip_high, cfg.lr) == (
        4,
        16,
        0.04,
        0.3,
        0.3,
        1e-6,
    )  # TRL's epsilon_high defaults to epsilon
    assert (cfg.loss_agg, cfg.scale_adv_by_std, cfg.epochs, cfg.ratio_level) == ("constant", False, 2, "sequence")
    assert cfg.std_correction == 1 and GRPOConfig().std_correction == 0  # TRL's group std (sample) with TRL names
    assert from_dict(GRPOConfig, {"num_generations": 4, "std_correction": 0}).std_correction == 0  # unless given
    cfg = from_dict(GRPOConfig, {"epsilon": 0.2, "epsilon_high": 0.28})
    assert (cfg.clip_low, cfg.clip_high) == (0.2, 0.28)
    with pytest.raises(ConfigError, match="'batch' .group mean, batch std. has no exact equivalent"):
        from_dict(GRPOConfig, {"scale_rewards": "batch"})
    with pytest.raises(ConfigError, match="num_train_epochs.*set `steps`"):
        from_dict(GRPOConfig, {"num_train_epochs": 3})  # TRL: passes over the data; here epochs is per batch
    with pytest.raises(ConfigError, match="'samples_per_prompt' is given twice"):  # which one was meant?
        from_dict(GRPOConfig, {"num_generations": 4, "samples_per_prompt": 6})
    f = tmp_path / "run.yaml"  # a flag beats the file, whichever name each uses; a YAML list is comma-separated
    f.write_text("samples_per_prompt: 2\nlora_target: [q_proj, v_proj]\n")
    cfg = parse_args(GRPOConfig, ["--config", str(f), "--num_generations", "8", "--resume"])
    assert (cfg.samples_per_prompt, cfg.lora_target, cfg.resume) == (8, "q_proj,v_proj", True)
    dpo = parse_args(DPOConfig, ["--loss_type", "ipo", "--beta", "0.2", "--num_train_epochs", "2"])
    assert (dpo.loss, dpo.beta, dpo.epochs) == ("ipo", 0.2, 2)
    with pytest.raises(ConfigError, match="did you mean 'num_generations' .TRL's name for 'samples_per_prompt'"):
        parse_args(GRPOConfig, ["--num-generaions", "4"])
    with pytest.raises(ConfigError, match="did you mean 'max_new_tokens'"):
        from_dict(GRPOConfig, {"max_new_token": 4})
    with pytest.raises(ConfigError, match="gradient_accumulation_steps.*micro_batch_size"):
        parse_args(GRPOConfig, ["--gradient_accumulation_steps", "4"])
    with pytest.raises(ConfigError, match="loss_type.*--algo dapo. also turns on dynamic sampling"):
        from_dict(GRPOConfig, {"loss_type": "cispo"})


def test_trl_schedule_and_adamw_names_mean_what_they_mean_in_transformers():
    """transformers' cosine / linear schedules decay to 0 (nanorl's to lr_min_ratio, 0.1), its AdamW beta2 is 0.999
    (nanorl's 0.99): a TRL name gives transformers' meaning, a nanorl key given beside it wins, and the optimizer
    is built from the config's values."""
    from nanorl.learner import lr_factor, make_optimizer

    assert (GRPOConfig().lr_min_ratio, GRPOConfig().adam_beta2) == (0.1, 0.99)  # nanorl's defaults, in config.json
    cfg = from_dict(GRPOConfig, {"lr_scheduler_type": "cosine", "adam_beta2": 0.999, "adam_epsilon": 1e-6})
    assert (cfg.lr_schedule, cfg.lr_min_ratio, cfg.warmup_steps) == ("cosine", 0.0, 3)
    assert from_dict(GRPOConfig, {"lr_scheduler_type": "linear", "lr_min_ratio": 0.2}).lr_min_ratio == 0.2
    assert from_dict(SFTConfig, {"lr_scheduler_type": "constant"}).warmup_steps == 0  # transformers': no warmup
    assert lr_factor(9, 0, 9, cfg.lr_schedule, cfg.lr_min_ratio) == 0.0 and lr_factor(9, 0, 9, "cosine", 0.1) == 0.1
    opt, sched = make_optimizer(torch.nn.Linear(2, 2), dataclasses.replace(cfg, warmup_steps=0), total_steps=4)
    assert opt.param_groups[0]["betas"] == (0.9, 0.999) and opt.param_groups[0]["eps"] == 1e-6
    for _ in range(4):
        opt.step(), sched.step()
    assert opt.param_groups[0]["lr"] == 0.0  # decayed to transformers' end
    assert (
        from_dict(GRPOConfig, {"save_strategy": "no"}).save_every,
        from_dict(DPOConfig, {"save_total_limit": 3}).keep_last,
    ) == (0, 3)
    with pytest.raises(ConfigError, match="lr_scheduler_type.*schedules are constant, cosine and linear"):
        from_dict(GRPOConfig, {"lr_scheduler_type": "cosine_with_restarts"})


def test_held_out_rows_say_where_they_come_from_and_eval_dataset_gives_them(tmp_path):
    """A data file without a test split gives up eval_size of its rows as the held-out set: the console and
    config.json say so (how many, the shuffle seed); eval_data (TRL's eval_dataset) gives another file instead."""
    rows = [{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(40)]
    _write(tmp_path / "train.jsonl", rows)
    _write(tmp_path / "test.jsonl", [{"prompt": "7 + 7 =", "answer": "14"}] * 3)
    task = get_task(str(tmp_path / "train.jsonl"), eval_size=8)
    assert (len(task.train), len(task.eval)) == (32, 8) and "8 training rows set aside" in task.held_out
    assert "shuffle seed 0" in task.held_out
    task = get_task(str(tmp_path / "train.jsonl"), eval_size=8, eval_data=str(tmp_path / "test.jsonl"))
    assert (len(task.train), len(task.eval)) == (40, 3) and task.held_out == f"3 rows of {tmp_path / 'test.jsonl'}"
    with pytest.raises(ConfigError, match="'eval_data': held-out rows from a file are for a task from data"):
        get_task("arithmetic", eval_data=str(tmp_path / "test.jsonl"))
    out = tmp_path / "run"
    args = ["train", "--model", "tiny", "--task", str(tmp_path / "train.jsonl"), "--steps", "1", "--eval-size", "4"]
    main(
        [*args, "--prompts-per-step", "2", "--samples-per-prompt", "2", "--max-new-tokens", "4", "--out-dir", str(out)]
    )
    saved = json.loads((out / "config.json").read_text())
    assert saved["_held_out"].startswith("4 training rows set aside") and saved["eval_data"] == ""
    assert from_dict(GRPOConfig, saved).eval_size == 4  # the notes (_held_out) read back as nothing
    assert from_dict(GRPOConfig, {"eval_dataset": "t.jsonl"}).eval_data == "t.jsonl"
    assert "_model_source" not in saved  # the tiny model; a GGUF's weights are noted (hub.model_source)


def test_trl_names_nanorl_lacks_get_their_own_answer_never_a_near_miss_of_another_meaning():
    """TRL names close in spelling to a nanorl key of another meaning (steps_per_generation ~ num_generations,
    save_strategy ~ strategy, adam_epsilon ~ epsilon) are answered for what they are."""
    answers = {
        "steps_per_generation": "set minibatch_size",
        "save_strategy": "every save_every steps",
        "eval_strategy": "every eval_every steps",
        "warmup_ratio": "set warmup_steps",
        "generation_kwargs": "sampling keys are temperature",
        "push_to_hub": "hub-ready",
    }
    for name, answer in answers.items():
        value = "epoch" if name.endswith("strategy") else 2
        with pytest.raises(ConfigError, match=f"'{name}' .a TRL name.: .*{answer}") as e:
            from_dict(SFTConfig, {name: value})
        assert "did you mean" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        from_dict(SFTConfig, {"temperature": 1.0})  # a sampling key: SFT samples nothing, and it is not 'operators'
    assert "did you mean" not in str(e.value)


def test_trl_vllm_names_mean_the_same_or_say_what_to_write():
    """TRL's vLLM correction fields, read together as TRL reads them, where nanorl's is_mode / is_cap mean the same
    (off; truncation, clip_max 3 unless given); the settings nanorl does not have (sleep mode, a tensor-parallel
    colocated engine) pass at their do-nothing value only."""
    off = {"vllm_importance_sampling_correction": False, "vllm_importance_sampling_mode": "token_truncate"}
    for values in (off, dict(reversed(off.items()))):  # off wins, in either order
        assert from_dict(GRPOConfig, values).is_mode == "none"
    cfg = from_dict(GRPOConfig, {**off, "vllm_importance_sampling_correction": True})
    assert (cfg.is_mode, cfg.is_cap) == ("token_truncate", 3.0)  # TRL's clip_max default
    cfg = from_dict(
        GRPOConfig, {"vllm_importance_sampling_mode": "sequence_truncate", "vllm_importance_sampling_cap": 4}
    )
    assert (cfg.is_mode, cfg.is_cap) == ("sequence_truncate", 4.0)  # cap: TRL's older name of clip_max
    cfg = parse_args(PPOConfig, ["--vllm_importance_sampling_correction", "false", "--vllm_enable_sleep_mode", "false"])
    assert cfg.is_mode == "none" and not cfg.use_vllm
    assert parse_args(GRPOConfig, ["--vllm_tensor_parallel_size", "1"]) == GRPOConfig()
    for values in ({"vllm_importance_sampling_correction": True}, {"vllm_importance_sampling_clip_max": 2.0}):
        with pytest.raises(ConfigError, match=r"sequence_mask\): nanorl's token_mask / sequence_mask also drop"):
            from_dict(GRPOConfig, values)  # TRL's default mode, a mask: its band differs here
    with pytest.raises(ConfigError, match="sleep mode .* not in nanorl yet"):
        parse_args(GRPOConfig, ["--vllm_enable_sleep_mode", "true"])
    with pytest.raises(ConfigError, match="vllm-serve --tensor_parallel_size N"):
        from_dict(GRPOConfig, {"vllm_tensor_parallel_size": 2})


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_data_format_datasets_reads(tmp_path):
    import gzip

    from nanorl.tasks.files import load_rows

    rows = [{"prompt": f"What is {i} + 1?", "answer": i + 1} for i in range(6)]
    ds = datasets.Dataset.from_list(rows)
    (tmp_path / "a.json").write_text(json.dumps(rows))
    ds.to_csv(str(tmp_path / "a.csv"))
    ds.to_parquet(str(tmp_path / "a.parquet"))
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "saved"))
    for name in ("a.json", "a.csv", "a.parquet", "a.jsonl.gz"):
        train, held = load_rows(tmp_path / name)
        assert [int(r["answer"]) for r in train] == list(range(1, 7)) and held is None, name
    train, held = load_rows(tmp_path / "saved")
    assert len(train) == 6 and len(held) == 2  # the test split is the held-out set
    task = get_task(str(tmp_path / "saved"))
    assert len(task.train) == 6 and [e.prompt for e in task.eval] == [r["prompt"] for r in rows[:2]]
    assert len(get_task(ds, eval_size=2).eval) == 2  # a Dataset from Python
    _write(tmp_path / "bad.jsonl", rows[:2]).write_text(json.dumps(rows[0]) + "\n{oops\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not valid JSON"):
        load_rows(tmp_path / "bad.jsonl")
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        load_rows(tmp_path / "missing.parquet")


def test_preference_and_sft_formats(tmp_path):
    from nanorl.hub import tiny_model_and_tokenizer
    from nanorl.tasks.preferences import encode_sft, load_preferences, load_replies

    user = [{"role": "user", "content": "hi"}]
    prefs = _write(
        tmp_path / "p.jsonl",
        [
            {
                "prompt": user,
                "chosen": [{"role": "assistant", "content": "hello"}],
                "rejected": [{"role": "assistant", "content": "go"}],
            },  # explicit, conversational
            {
                "chosen": user + [{"role": "assistant", "content": "hey"}],
                "rejected": user + [{"role": "assistant", "content": "no"}],
            },  # implicit, conversational
            {"chosen": "The sky is blue.", "rejected": "The sky is green."},  # implicit, standard
        ],
    )
    got = load_preferences(prefs)
    assert [(p.prompt, p.chosen, p.rejected) for p in got] == [
        (user, "hello", "go"),
        (user, "hey", "no"),
        ("The sky is", " blue.", " green."),
    ]
    convo = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "XY"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "ZW"},
    ]
    sft = _write(
        tmp_path / "s.jsonl", [{"messages": convo}, {"text": "plain words"}, {"prompt": "p", "completion": "c"}]
    )
    pairs = load_replies(sft)
    _, tok = tiny_model_and_tokenizer()
    rows = encode_sft(tok, pairs, SFTConfig(max_length=256))
    conv, text, plain = rows
    trained = [t for t, w in zip(conv["chosen"], conv["weight"]) if w]
    assert tok.decode(trained) == "XY<|im_end|>\nZW<|im_end|>\n"  # both assistant turns, no user turn
    assert tok.decode(conv["prompt"] + conv["chosen"]).count("<|im_start|>user") == 2
    assert tok.decode(text["prompt"] + text["chosen"]).startswith("plain words") and all(text["weight"])
    assert tok.decode(plain["chosen"]) == "c" + tok.eos_token


def test_trl_datasets_and_rewards_through_the_cli(tmp_path, capsys):
    helper = tmp_path / "helpers.py"
    helper.write_text("def score(text):\n    return float('4' in text)\n")
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(
        "from helpers import score  # a module beside the reward file\n\n\n"
        "def accuracy(completions, solution, **kwargs):\n"
        "    return [score(c[0]['content']) if s == '4' else 0.0 for c, s in zip(completions, solution)]\n"
    )
    rows = [{"prompt": [{"role": "user", "content": f"2 + 2 = ? ({i})"}], "solution": "4"} for i in range(8)]
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:2])}
    ).save_to_disk(str(tmp_path / "ds"))
    out = tmp_path / "run"
    main(
        [
            "train",
            "--model",
            "tiny",
            "--task",
            str(tmp_path / "ds"),
            "--reward",
            f"{rewards}:accuracy",
            "--num_generations",
            "2",
            "--max_completion_length",
            "4",
            "--max_steps",
            "2",
            "--prompts-per-step",
            "2",
            "--out-dir",
            str(out),
            "--report-to",
            "none",
            "--backend",
            "torch",
        ]
    )
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and "reward/accuracy_mean" in lines[0]
    assert (
        len(json.loads((out / "eval_samples.jsonl").read_text().splitlines()[0]))
        and len((out / "eval_samples.jsonl").read_text().splitlines()) == 2
    )  # the test split was the held-out set
    for split in ("dpo", "sft"):  # Parquet data for the offline commands
        prefs = [{"prompt": f"q{i}", "chosen": "a", "rejected": "b", "completion": "a"} for i in range(6)]
        datasets.Dataset.from_list(prefs).to_parquet(str(tmp_path / "p.parquet"))
        main(
            [
                split,
                "--model",
                "tiny",
                "--data",
                str(tmp_path / "p.parquet"),
                "--task",
                "",
                "--num_train_epochs",
                "1",
                "--out-dir",
                str(tmp_path / split),
                "--report-to",
                "none",
                "--backend",
                "torch",
            ]
        )
        assert (tmp_path / split / "model").is_dir()
    with pytest.raises(SystemExit):
        main(["train", "--model", "tiny", "--per_device_train_batch_size", "4"])
    assert "micro_batch_size" in capsys.readouterr().err


def test_train_from_python_takes_a_model_a_dataset_rewards_and_callbacks(tmp_path):
    from nanorl.grpo import train
    from nanorl.hub import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    ds = datasets.Dataset.from_list([{"prompt": f"say {i}", "answer": i} for i in range(8)])
    seen = []
    result = train(
        GRPOConfig(
            steps=2,
            prompts_per_step=2,
            samples_per_prompt=2,
            max_new_tokens=4,
            eval_size=2,
            kl_coef=0.1,
            out_dir=str(tmp_path / "run"),
            report_to="none",
            backend="torch",
        ),
        ds,
        model=model,
        tokenizer=tok,
        reward_funcs=reward_len,  # one function, as TRL allows
        callbacks=[lambda step, metrics: seen.append((step, metrics["reward/mean"]))],
    )
    assert [s for s, _ in seen] == [1, 2] and result["steps"] == 2
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["task"] == "python:Dataset" and saved["reward"] == "reward_len"
    assert saved["model"].startswith("python:LlamaForCausalLM")
    tok.eos_token = None
    tok.pad_token = None
    with pytest.raises(ConfigError, match="no EOS token"):
        train(
            GRPOConfig(steps=1, out_dir=str(tmp_path / "r2"), report_to="none"),
            ds,
            model=model,
            tokenizer=tok,
            reward_funcs=[reward_len],
        )


def test_accuracy_threshold_for_rewards_that_are_not_0_or_1():
    from nanorl.evaluate import evaluate
    from nanorl.hub import tiny_model_and_tokenizer
    from nanorl.models import stop_token_ids
    from nanorl.sampling import LocalSampler, SamplingParams

    model, tok = tiny_model_and_tokenizer()
    rows = [Example(f"q{i}") for i in range(4)]
    for threshold, acc in ((1.0, 0.0), (0.5, 1.0)):
        task = Task("half", train=rows, eval=rows, reward=lambda p, c, **f: 0.5, acc_threshold=threshold)
        metrics, _ = evaluate(
            LocalSampler(model, stop_token_ids(model, tok), tok.pad_token_id), tok, task, SamplingParams(4)
        )
        assert metrics["eval/greedy_acc"] == acc and metrics["eval/greedy_reward"] == 0.5


def test_migration_page_runs(tmp_path, monkeypatch):
    """docs/trl.md: each nanorl block runs (tiny model, a few steps), and so does its shell command."""
    import shlex
    from pathlib import Path

    page = (Path(__file__).parents[1] / "docs" / "trl.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if b.startswith("# nanorl")]
    shared = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if b.startswith("# shared")]
    shell = re.findall(r"```bash\n(nanorl train .*?)```", page, re.S)
    assert len(blocks) == 4 and len(shell) == 1 and len(shared) == 1
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "prompts.jsonl", [{"prompt": f"Say something about {i}."} for i in range(8)])
    _write(tmp_path / "prefs.jsonl", [{"prompt": f"q{i}", "chosen": "yes", "rejected": "no"} for i in range(8)])
    _write(
        tmp_path / "chat.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": f"u{i}"},
                    {"role": "assistant", "content": "a"},
                    {"role": "user", "content": "more"},
                    {"role": "assistant", "content": "b"},
                ]
            }
            for i in range(8)
        ],
    )
    (tmp_path / "my_rewards.py").write_text(re.search(r"def reward_len.*?\n\n", blocks[0], re.S).group(0))
    small = {
        '"smollm2-135m"': '"tiny"',
        '"report_to"': '"report_to"',
        '"max_steps": 40': '"max_steps": 2, "prompts_per_step": 2, "eval_size": 2, "report_to": "none"',
        '"num_train_epochs": 1': '"num_train_epochs": 1, "task": "", "batch_size": 4, "report_to": "none"',
    }
    for block in blocks:
        for old, new in small.items():
            block = block.replace(old, new)
        names = {}  # the tools section's nanorl block runs on the definitions its "# shared" block makes
        exec(compile(shared[0] if "environment_factory" in block else "", "docs/trl.md", "exec"), names)
        exec(compile(block, "docs/trl.md", "exec"), names)
    for out in ("runs/nanorl-grpo", "runs/nanorl-dpo", "runs/nanorl-sft", "runs/nanorl-tools"):
        assert (tmp_path / out / "model").is_dir() and (tmp_path / out / "metrics.jsonl").is_file(), out
    first = json.loads((tmp_path / "runs/nanorl-tools/metrics.jsonl").read_text().splitlines()[0])
    assert {"reward/Counter_mean", "reward/used_a_tool_mean", "tools/call_frequency"} <= set(first)
    argv = shlex.split(shell[0].replace("\\\n", " "))[1:] + [
        "--model",
        "tiny",
        "--prompts-per-step",
        "2",
        "--eval-size",
        "2",
        "--report-to",
        "none",
        "--max_steps",
        "2",
        "--output_dir",
        "runs/cli",
    ]
    main(argv)
    assert len((tmp_path / "runs/cli/metrics.jsonl").read_text().splitlines()) == 2


def test_review_cases_none_nan_duplicates_every_sample_failing_and_trainer_state_in_eval():
    rows = [Example("q", {"answer": 1})] * 3
    nan_skip = Task("t", train=rows, eval=rows, reward=lambda completions, **k: [float("nan"), 1.0, None])
    assert nan_skip.score_parts(rows, ["a", "b", "c"])[0]["task"] == [None, 1.0, None]  # NaN is TRL's None

    def one(completions, **kwargs):
        return [1.0] * len(completions)

    def ten(completions, **kwargs):
        return [10.0] * len(completions)

    ten.__name__ = "one"  # two rewards of one name: each keeps its own metric, the total counts both
    parts, total, _ = Task("t", train=rows, eval=rows, reward=parse_reward_spec([one, ten])).score_parts(
        rows, ["a"] * 3
    )
    assert sorted(parts) == ["one", "one_2"] and total == [11.0] * 3
    assert parse_reward_spec(one)[0][0] == "one"  # a single callable, as TRL allows

    def missing_column(completions, **kwargs):
        return [float(kwargs["solution"])] * len(completions)

    with pytest.raises(RewardSetupError, match="every completion"):  # not the samples' fault, even with zero
        Task("t", train=rows, eval=rows, reward=missing_column, on_error="zero").score(rows, ["a", "b", "c"])

    def garbage_is_fine(prompt, completion, **f):
        return float(int(completion))  # ValueError on text: the samples' fault, scored 0 under zero

    garbage = Task("t", train=rows, eval=rows, reward=garbage_is_fine, on_error="zero")
    assert garbage.score(rows, ["x", "y", "z"]) == [0.0] * 3

    def curriculum(completions, trainer_state, **kwargs):
        return [trainer_state.global_step / trainer_state.max_steps] * len(completions)

    assert Task("t", train=rows, eval=rows, reward=curriculum).score(rows, ["a"] * 3) == [0.0] * 3  # no 0 division


def test_trl_own_rewards_when_trl_is_installed(tmp_path):
    """`--reward trl.rewards:accuracy_reward` with TRL installed (skipped without it; seen with trl 1.16.0)."""
    pytest.importorskip("trl.rewards")
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "solution": f"${i + 1}$"} for i in range(4)]
    task = get_task(
        datasets.Dataset.from_list(rows), reward="trl.rewards:accuracy_reward,trl.rewards:think_format_reward"
    )
    ex = task.train[:2]
    right = f"<think>x</think>\\boxed{{{ex[0].fields['solution'][1:-1]}}}"
    parts, total, _ = task.score_parts(ex, [right, "no"])
    assert parts == {"accuracy_reward": [1.0, 0.0], "think_format_reward": [1.0, 0.0]} and total == [2.0, 0.0]


def test_a_batched_reward_returning_numpy_scores_in_one_call():
    """A nanorl reward's own `.batch` (as code_reward has) may return a numpy array: it is the batch's scores, in
    one call, and no flags are logged (numpy's own `.flags` attribute is not tasks.Scores')."""
    import numpy as np

    from nanorl.tasks import Example, Task

    calls = []

    def lengths(prompt, completion, **kw):
        return float(len(completion))

    def batch(prompts, completions, fields, *_, **__):
        calls.append(len(completions))
        return np.array([float(len(c)) for c in completions])

    lengths.batch = batch
    rows = [Example("p", {})] * 3
    parts, total, errors = Task("t", train=rows, eval=rows, reward=[("len", lengths, 1.0)]).score_parts(
        rows, ["a", "bb", "ccc"]
    )
    assert parts == {"len": [1.0, 2.0, 3.0]} and total == [1.0, 2.0, 3.0] and calls == [3]


def test_string_prompts_are_read_as_given_as_trl_reads_its_standard_format(tmp_path, capsys):
    """TRL applies the chat template to conversational prompts only: a data file's plain-string prompt is tokenized
    as it is (GRPO, and SFT / DPO rows alike). apply_chat_template always / never forces either; built-in tasks keep
    the template (their prompts are written for chat models); the run says which in config.json and on the console."""
    from nanorl.data import Text, encode_reply, render_prompt
    from nanorl.hub import tiny_model_and_tokenizer
    from nanorl.tasks.preferences import read_pairs

    tok = tiny_model_and_tokenizer()[1]
    assert tok.chat_template
    plain, chat = render_prompt(tok, Text("2 + 2 =")), render_prompt(tok, "2 + 2 =")
    assert plain == tok("2 + 2 =")["input_ids"] and chat != plain  # TRL: processing_class(text=prompts)
    text = tok.apply_chat_template([{"role": "user", "content": "2 + 2 ="}], add_generation_prompt=True, tokenize=False)
    assert chat == tok(text, add_special_tokens=False)["input_ids"]
    assert encode_reply(tok, Text("2 + 2 ="), " 4", "", 64)[0] == plain

    rows = [{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(20)]
    rows += [{"prompt": [{"role": "user", "content": "1 + 1 ="}], "answer": "2"}]
    _write(tmp_path / "train.jsonl", rows)
    data = str(tmp_path / "train.jsonl")
    kinds = lambda task: {type(ex.prompt).__name__ for ex in task.train + task.eval}  # noqa: E731
    assert kinds(get_task(data, eval_size=4)) == {"Text", "list"}  # strings as given, messages templated
    assert kinds(get_task(data, eval_size=4, apply_chat_template="always")) == {"str", "list"}
    assert kinds(get_task("arithmetic", eval_size=4)) == {"str"}  # a built-in task: through the template
    assert kinds(get_task("arithmetic", eval_size=4, apply_chat_template="never")) == {"Text"}
    with pytest.raises(ConfigError, match="'apply_chat_template': 'never', but a prompt is chat messages"):
        get_task(data, eval_size=4, apply_chat_template="never")
    with pytest.raises(ConfigError, match="'apply_chat_template': expected auto|always|never"):
        from_dict(GRPOConfig, {"apply_chat_template": "yes"})

    sft = tmp_path / "sft.jsonl"
    _write(sft, [{"prompt": f"{i} + 1 =", "completion": f" {i + 1}"} for i in range(10)])
    assert {type(p.prompt) for p in read_pairs(str(sft), "sft")[0]} == {Text}
    assert {type(p.prompt) for p in read_pairs(str(sft), "sft", template="always")[0]} == {str}
    assert {type(p.prompt) for p in read_pairs("builtin:arithmetic", "preference")[0]} == {str}

    out = tmp_path / "run"
    args = ["--model", "tiny", "--task", data, "--steps", "1", "--eval-size", "4", "--max-new-tokens", "4"]
    main(["train", *args, "--prompts-per-step", "2", "--samples-per-prompt", "2", "--out-dir", str(out)])
    assert json.loads((out / "config.json").read_text())["_prompts"] == Text.note
    assert f"prompts {Text.note}" in capsys.readouterr().out
    main(["sft", "--model", "tiny", "--data", str(sft), "--task", "", "--out-dir", str(tmp_path / "s")])
    assert json.loads((tmp_path / "s" / "config.json").read_text())["_prompts"] == Text.note
    assert f"[nanorl] prompts: {Text.note}" in capsys.readouterr().out
    main(["train", *args[:3], "arithmetic", *args[4:], "--prompts-per-step", "2", "--out-dir", str(tmp_path / "a")])
    assert "_prompts" not in json.loads((tmp_path / "a" / "config.json").read_text())


def test_eval_temperature_samples_the_held_out_evaluation_and_says_so(tmp_path, capsys):
    """nanorl evaluates greedily; TRL evaluates at its sampling temperature. eval_temperature > 0 samples max(k, 1)
    completions per held-out prompt at it, from the evaluation's own seed: eval/sampled_acc (and pass@k) in place of
    eval/greedy_acc, eval/temperature in the results, the first completion of each prompt in the samples."""
    from nanorl.evaluate import evaluate
    from nanorl.hub import tiny_model_and_tokenizer
    from nanorl.models import stop_token_ids
    from nanorl.sampling import LocalSampler, SamplingParams

    model, tok = tiny_model_and_tokenizer()
    sampler = LocalSampler(model.eval(), stop_token_ids(model, tok), tok.pad_token_id)
    rows = [Example(f"{i} + {i} =", {"answer": str(2 * i)}) for i in range(6)]
    task = Task("t", train=rows, eval=rows, reward=lambda prompt, completion, **f: float("a" in completion))
    params = SamplingParams(8, temperature=1.0)
    greedy, g_samples = evaluate(sampler, tok, task, params)
    assert "eval/greedy_acc" in greedy and "eval/sampled_acc" not in greedy and "eval/temperature" not in greedy
    hot, h_samples = evaluate(sampler, tok, task, params, t=5.0)
    assert set(hot) == {"eval/sampled_acc", "eval/sampled_reward", "eval/len_mean", "eval/temperature"}
    assert hot["eval/temperature"] == 5.0 and len(h_samples) == len(rows)
    assert [s["completion"] for s in h_samples] != [s["completion"] for s in g_samples]  # sampled, not greedy
    assert evaluate(sampler, tok, task, params, t=5.0)[1] == h_samples  # the evaluation's own seed: same draws
    k3, k3_samples = evaluate(sampler, tok, task, params, k=3, t=5.0)
    assert k3["eval/pass@3"] >= k3["eval/sampled_acc"] and len(k3_samples) == len(rows)
    expected = [float("a" in s["completion"]) for s in k3_samples]
    assert [s["reward"] for s in k3_samples] == expected

    out = tmp_path / "run"
    args = ["--model", "tiny", "--steps", "1", "--eval-size", "4", "--max-new-tokens", "4", "--eval-temperature", "0.7"]
    main(["train", *args, "--prompts-per-step", "2", "--samples-per-prompt", "2", "--out-dir", str(out)])
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines()]
    assert all(e["eval/temperature"] == 0.7 and "eval/greedy_acc" not in e and "eval/sampled_acc" in e for e in evals)
    assert "held-out sampled (temperature 0.7) accuracy" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="'eval_temperature': must be >= 0"):
        from_dict(GRPOConfig, {"eval_temperature": -1})


def test_chat_template_kwargs_reach_every_rendering_of_the_template(tmp_path):
    """TRL's chat_template_kwargs (Qwen3's enable_thinking=False): a JSON object on the command line, a mapping in
    YAML; the tokenizer every command loads renders prompts (and conversations) with them."""
    from nanorl import distributed
    from nanorl.data import render_prompt
    from nanorl.hub import tiny_model_and_tokenizer
    from nanorl.models import load_model

    model, tok = tiny_model_and_tokenizer()
    tok.chat_template = tok.chat_template.replace(
        "assistant\n{% endif %}", "assistant\n{% if enable_thinking is false %}<think></think>{% endif %}{% endif %}"
    )
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    (tmp_path / "c.yaml").write_text("chat_template_kwargs: {enable_thinking: false}\n")
    cfg = parse_args(GRPOConfig, ["--config", str(tmp_path / "c.yaml")])
    assert json.loads(cfg.chat_template_kwargs) == {"enable_thinking": False}
    flag = parse_args(SFTConfig, ["--chat-template-kwargs", '{"enable_thinking": false}'])
    assert flag.chat_template_kwargs == '{"enable_thinking": false}'
    for bad in ("{enable_thinking: false}", "[1]", "false"):
        with pytest.raises(ConfigError, match="'chat_template_kwargs': must be a JSON object"):
            from_dict(GRPOConfig, {"chat_template_kwargs": bad})

    plain = distributed.load(load_model, str(tmp_path / "m"), "cpu", torch.float32, GRPOConfig())[1]
    _, tok = distributed.load(load_model, str(tmp_path / "m"), "cpu", torch.float32, cfg)
    assert tok.decode(render_prompt(tok, "2 + 2 =")).endswith("assistant\n<think></think>")
    assert not tok.decode(render_prompt(plain, "2 + 2 =")).endswith("</think>")
    turns = [{"role": "user", "content": "hi"}]
    assert (
        tok.apply_chat_template(turns, add_generation_prompt=False, tokenize=False)
        == "<|im_start|>user\nhi<|im_end|>\n"
    )


# The fields TRL 1.16's configs add to transformers' TrainingArguments (test_trl_own_config_fields_are_these checks
# the list against TRL where it is installed), and the TrainingArguments a practitioner sets.
TRL_FIELDS = {
    GRPOConfig: """model_init_kwargs trust_remote_code router_aux_loss_coef disable_dropout cast_lm_head_to_fp32
    num_generations num_generations_eval max_completion_length ds3_gather_for_generation shuffle_dataset
    pad_to_multiple_of generation_batch_size steps_per_generation temperature top_p top_k min_p generation_kwargs
    chat_template_kwargs repetition_penalty cache_implementation use_vllm vllm_mode vllm_model_impl
    vllm_enable_sleep_mode vllm_structured_outputs_regex vllm_server_base_url vllm_server_host vllm_server_port
    vllm_server_timeout vllm_group_port vllm_gpu_memory_utilization vllm_max_model_length vllm_tensor_parallel_size
    beta num_iterations epsilon delta epsilon_high sapo_temperature_neg sapo_temperature_pos vespo_k_pos
    vespo_lambda_pos vespo_k_neg vespo_lambda_neg importance_sampling_level reward_weights multi_objective_aggregation
    scale_rewards loss_type mask_truncated_completions sync_ref_model ref_model_mixup_alpha ref_model_sync_steps
    top_entropy_quantile entropy_coef use_adaptive_entropy entropy_coef_min entropy_coef_max entropy_coef_delta
    entropy_target max_tool_calling_iterations vllm_importance_sampling_correction vllm_importance_sampling_mode
    vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min off_policy_mask_threshold
    use_bias_correction_kl log_completions log_multimodal num_completions_to_print log_unique_prompts
    log_completions_hub_repo use_transformers_continuous_batching transformers_continuous_batching_config
    use_transformers_paged vllm_importance_sampling_cap""".split(),
    DPOConfig: """model_init_kwargs trust_remote_code router_aux_loss_coef disable_dropout dataset_num_proc max_length
    truncation_mode padding_free pad_to_multiple_of precompute_ref_log_probs precompute_ref_batch_size loss_type
    loss_weights ld_alpha f_divergence_type f_alpha_divergence_coef label_smoothing beta use_weighting discopop_tau
    activation_offloading sync_ref_model ref_model_mixup_alpha ref_model_sync_steps pad_token""".split(),
    SFTConfig: """model_init_kwargs trust_remote_code router_aux_loss_coef chat_template_path dataset_text_field
    dataset_kwargs dataset_num_proc eos_token max_length truncation_mode shuffle_dataset packing packing_strategy
    padding_free pad_to_multiple_of eval_packing completion_only_loss assistant_only_loss loss_type
    activation_offloading pad_token""".split(),
}
TRAINING_ARGUMENTS = """output_dir learning_rate num_train_epochs max_steps per_device_train_batch_size
per_device_eval_batch_size gradient_accumulation_steps lr_scheduler_type lr_scheduler_kwargs warmup_steps
weight_decay adam_beta1 adam_beta2 adam_epsilon max_grad_norm logging_steps logging_strategy logging_first_step
save_strategy save_steps save_total_limit save_only_model eval_strategy eval_steps eval_on_start seed data_seed bf16
fp16 tf32 gradient_checkpointing gradient_checkpointing_kwargs optim report_to run_name project trackio_space_id
push_to_hub hub_model_id hub_token hub_private_repo hub_strategy resume_from_checkpoint load_best_model_at_end
metric_for_best_model greater_is_better use_cpu torch_compile neftune_noise_alpha dataloader_num_workers
remove_unused_columns ddp_backend ddp_timeout fsdp fsdp_config deepspeed full_determinism disable_tqdm
use_liger_kernel label_smoothing_factor""".split()


@pytest.mark.parametrize("cls", [GRPOConfig, DPOConfig, SFTConfig])
def test_every_field_of_trls_config_is_mapped_or_answered(cls):
    """Each field of TRL's GRPOConfig / DPOConfig / SFTConfig, and the TrainingArguments a practitioner sets, is
    either a nanorl key, renamed to one, accepted as meaning what nanorl does anyway, or answered with what to write
    instead: never 'unknown config key' (which would read as a typo)."""
    for name in TRL_FIELDS[cls] + TRAINING_ARGUMENTS:
        for value in (1, True, False, "x"):
            try:
                from_dict(cls, {name: value})
            except ConfigError as e:
                assert "unknown config key" not in str(e), (cls.__name__, name, str(e))
    # values that mean what nanorl does anyway pass; others are answered
    assert from_dict(SFTConfig, {"completion_only_loss": True, "assistant_only_loss": "true"}) == SFTConfig()
    assert from_dict(SFTConfig, {"loss_type": "nll", "truncation_mode": "keep_start"}) == SFTConfig()
    assert from_dict(GRPOConfig, {"disable_dropout": True, "eval_on_start": True}).std_correction == 0
    with pytest.raises(ConfigError, match="'assistant_only_loss' .a TRL name.: messages rows train the assistant"):
        from_dict(SFTConfig, {"assistant_only_loss": False})
    with pytest.raises(ConfigError, match="'loss_type' .a TRL name.: .*dft is not in nanorl"):
        from_dict(SFTConfig, {"loss_type": "dft"})
    assert from_dict(GRPOConfig, {"use_cpu": True}).device == "cpu"


def test_trl_own_config_fields_are_these():
    """The list above is TRL's (run where TRL is installed: tests/vllm.sh)."""
    pytest.importorskip("trl")
    from transformers import TrainingArguments
    from trl import DPOConfig as TrlDPO
    from trl import GRPOConfig as TrlGRPO
    from trl import SFTConfig as TrlSFT

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(TRAINING_ARGUMENTS) <= base
    for trl, ours in ((TrlGRPO, GRPOConfig), (TrlDPO, DPOConfig), (TrlSFT, SFTConfig)):
        assert [f.name for f in dataclasses.fields(trl) if f.name not in base] == TRL_FIELDS[ours], trl.__name__

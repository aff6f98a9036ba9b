import subprocess
import sys

import pytest

from nanorl.config import ConfigError, GRPOConfig, parse_args


def test_defaults_and_overrides(tmp_path):
    cfg = parse_args(GRPOConfig, [])
    assert cfg == GRPOConfig()
    f = tmp_path / "run.yaml"
    f.write_text("lr: 3.0e-6\nsteps: 7\nscale_adv_by_std: false\n")
    cfg = parse_args(GRPOConfig, ["--config", str(f), "--lr", "1e-4", "--max-new-tokens=12", "--top_p", "0.9"])
    assert cfg.lr == 1e-4 and cfg.steps == 7 and cfg.max_new_tokens == 12 and cfg.top_p == 0.9
    assert cfg.scale_adv_by_std is False


def test_unknown_key_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="larning_rate.*did you mean .learning_rate"):
        parse_args(GRPOConfig, ["--larning-rate", "1e-5"])
    f = tmp_path / "bad.yaml"
    f.write_text("stepz: 3\n")
    with pytest.raises(ConfigError, match="stepz"):
        parse_args(GRPOConfig, ["--config", str(f)])


def test_wrong_type_is_an_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="'steps'"):
        parse_args(GRPOConfig, ["--steps", "many"])
    with pytest.raises(ConfigError, match="'resume'"):
        parse_args(GRPOConfig, ["--resume", "maybe"])
    f = tmp_path / "bad.yaml"
    f.write_text("lr: fast\n")
    with pytest.raises(ConfigError, match="'lr'"):
        parse_args(GRPOConfig, ["--config", str(f)])
    with pytest.raises(ConfigError, match="minibatch_size"):
        parse_args(GRPOConfig, ["--minibatch-size", "7"])
    with pytest.raises(ConfigError, match="config file not found"):
        parse_args(GRPOConfig, ["--config", str(tmp_path / "missing.yaml")])


def test_help_lists_every_field():
    import dataclasses

    out = subprocess.run([sys.executable, "-m", "nanorl.cli", "train", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for f in dataclasses.fields(GRPOConfig):
        assert "--" + f.name.replace("_", "-") in out.stdout
        assert f.metadata["help"].split()[0] in out.stdout


def test_cli_reports_bad_key_without_traceback():
    out = subprocess.run([sys.executable, "-m", "nanorl.cli", "train", "--bogus", "1"], capture_output=True, text=True)
    assert out.returncode == 2 and "bogus" in out.stderr and "Traceback" not in out.stderr

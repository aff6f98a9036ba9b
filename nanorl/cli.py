"""The `nanorl` command.

nanorl train [--config run.yaml] [--key value ...]   # GRPO and its family; `nanorl train --help` lists every field
nanorl ppo [--key value ...]                          # PPO with a critic (RLHF form)
nanorl eval --model PATH_OR_ID --task arithmetic [--k 8] [--tools module:fn]
nanorl dpo [--data prefs.jsonl] [--key value ...]     # DPO / IPO / hinge on preference pairs
nanorl sft [--data rows.jsonl] [--key value ...]      # supervised fine-tuning (loss on replies only)
nanorl rm [--data prefs.jsonl] [--key value ...]      # Bradley-Terry reward model
nanorl plot RUN_DIR [RUN_DIR ...] [--out curve.png]   # every curve of the runs, overlaid
nanorl report RUN_DIR [--out report.html]             # one self-contained HTML page: evals, curves, samples
nanorl vllm-serve [--model M] [--port 8000]           # a vLLM server for --use_vllm true --vllm_mode server
"""

from __future__ import annotations

import importlib
import json
import os
import sys

from nanorl.checkpoint import Interrupted
from nanorl.config import DPOConfig, EvalConfig, GRPOConfig, PPOConfig, RMConfig, SFTConfig, parse_args
from nanorl.errors import ConfigError, RewardSetupError

TRAINERS = {
    "train": ("nanorl.grpo", GRPOConfig),
    "ppo": ("nanorl.ppo", PPOConfig),
    "dpo": ("nanorl.dpo", DPOConfig),
    "sft": ("nanorl.sft", SFTConfig),
    "rm": ("nanorl.reward_model", RMConfig),
}


def eval_main(cfg: EvalConfig) -> None:
    from nanorl.backends import select_backend
    from nanorl.evaluate import evaluate
    from nanorl.models import load_model, resolve_device, stop_token_ids, with_chat_kwargs
    from nanorl.online import make_agent, make_sampler, sampling_params
    from nanorl.tasks import task_from_config

    task = task_from_config(cfg)
    agent = make_agent(cfg, task)[0]  # tools or an environment: whole episodes (agents/)
    device = resolve_device(cfg.device)
    backend, dtype = select_backend(cfg.backend, cfg.dtype, device)
    model, tok = with_chat_kwargs(*load_model(cfg.model, device, dtype), cfg)
    model.eval()
    sampler = make_sampler(cfg, model, tok, stop_token_ids(model, tok), backend)
    params = sampling_params(cfg)
    metrics, samples = evaluate(
        sampler, tok, task, params, cfg.k, cfg.system_prompt, agent=agent, t=cfg.eval_temperature
    )
    print(json.dumps(metrics, indent=2))
    if cfg.out:
        with open(cfg.out, "w") as f:
            json.dump({"model": cfg.model, "task": cfg.task, "metrics": metrics, "samples": samples}, f, indent=2)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    command, rest = argv[0], argv[1:]
    try:
        if command in TRAINERS:
            module, cls = TRAINERS[command]
            importlib.import_module(module).train(parse_args(cls, rest))
        elif command == "eval":
            eval_main(parse_args(EvalConfig, rest))
        elif command in ("plot", "report", "vllm-serve"):  # integrations/plot.py, report.py, vllm.py (the server)
            importlib.import_module(f"nanorl.integrations.{command.removesuffix('-serve')}").main(rest)
        else:
            raise ConfigError(
                f"unknown command '{command}' (use train, ppo, dpo, sft, rm, eval, plot, report or vllm-serve)"
            )
    except (ConfigError, FileNotFoundError, RewardSetupError, ConnectionError) as e:
        print(f"nanorl: error: {e}", file=sys.stderr)
        sys.exit(2)
    except Interrupted as e:  # SIGINT / SIGTERM: the checkpoint is written
        print(f"nanorl: {e}", file=sys.stderr)
        sys.exit(128 + e.signum)
    if "LOCAL_RANK" in os.environ:  # under torchrun, the run done and its process group left: exit here. After a
        sys.stdout.flush()  # torch.distributed.checkpoint save, gloo's teardown in the interpreter's finalization
        sys.stderr.flush()  # aborted 3 of 40 two-process runs (SIGABRT), 0 of 30 that exit here (notes/LOG.md)
        os._exit(0)


if __name__ == "__main__":
    main()

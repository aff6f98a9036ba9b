"""The `nanorl` command.

    nanorl train [--config run.yaml] [--key value ...]   # GRPO; `nanorl train --help` lists every field
    nanorl eval --model PATH_OR_ID --task arithmetic [--k 8]
    nanorl dpo [--data prefs.jsonl] [--key value ...]     # DPO / IPO / hinge on preference pairs
    nanorl sft [--data rows.jsonl] [--key value ...]      # supervised fine-tuning (loss on replies only)
    nanorl rm [--data prefs.jsonl] [--key value ...]      # Bradley-Terry reward model
    nanorl plot RUN_DIR [--out curve.png]                 # reward and held-out accuracy curves
"""

from __future__ import annotations

import argparse
import json
import sys

from nanorl.config import ConfigError, DPOConfig, GRPOConfig, RMConfig, SFTConfig, parse_args

OFFLINE = {"dpo": ("nanorl.dpo", DPOConfig), "sft": ("nanorl.sft", SFTConfig), "rm": ("nanorl.reward_model", RMConfig)}


def eval_main(argv: list[str]) -> None:
    from nanorl.evaluate import evaluate
    from nanorl.models import load_model, resolve_device, resolve_precision
    from nanorl.tasks import get_task

    p = argparse.ArgumentParser(prog="nanorl eval", description="Held-out greedy accuracy and pass@k of a model.")
    p.add_argument("--model", required=True, help="alias, hub id, local folder or .gguf file")
    p.add_argument("--task", default="arithmetic", help="a built-in task or a data file (see `nanorl train --help`)")
    p.add_argument("--reward", default="", help="reward spec replacing the task's own, e.g. 'math=1'")
    p.add_argument("--prompt-field", default="prompt")
    p.add_argument("--answer-field", default="answer")
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--operators", default="+")
    p.add_argument("--eval-size", type=int, default=200)
    p.add_argument("--k", type=int, default=1, help="also report pass@k with k samples (1 = greedy only)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for pass@k")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--system-prompt", default="")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", help="write metrics and greedy samples to this .json file")
    a = p.parse_args(argv)
    task = get_task(a.task, reward=a.reward, digits=a.digits, operators=a.operators, eval_size=a.eval_size,
                    prompt_field=a.prompt_field, answer_field=a.answer_field)
    device = resolve_device(a.device)
    model, tok = load_model(a.model, device, *resolve_precision("auto", device))
    metrics, samples = evaluate(model, tok, task, a.max_new_tokens, a.k, a.temperature, a.system_prompt)
    print(json.dumps(metrics, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "task": a.task, "metrics": metrics, "samples": samples}, f, indent=2)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    command, rest = argv[0], argv[1:]
    try:
        if command == "train":
            from nanorl.grpo import train

            train(parse_args(GRPOConfig, rest, prog="nanorl train"))
        elif command in OFFLINE:
            import importlib

            module, cls = OFFLINE[command]
            importlib.import_module(module).train(parse_args(cls, rest, prog=f"nanorl {command}"))
        elif command == "eval":
            eval_main(rest)
        elif command == "plot":
            from nanorl.plot import plot_run

            p = argparse.ArgumentParser(prog="nanorl plot", description="Plot a run folder's curves.")
            p.add_argument("run_dir")
            p.add_argument("--out", help="PNG path (default: RUN_DIR/curve.png)")
            a = p.parse_args(rest)
            print(plot_run(a.run_dir, a.out))
        else:
            raise ConfigError(f"unknown command '{command}' (use train, dpo, sft, rm, eval or plot)")
    except (ConfigError, FileNotFoundError) as e:
        print(f"nanorl: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

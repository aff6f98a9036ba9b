"""TRL's config names: a TRL user's keys (`--num_generations 8`, `beta: 0.04` in YAML) mean what they mean in
TRL, renamed to nanorl's before a config is built (config.from_dict, config.parse_args).

    values = resolve_names(GRPOConfig, {"num_generations": 8, "beta": 0.04}, "nanorl train")
    # -> {"samples_per_prompt": 8, "kl_coef": 0.04, "std_correction": 1}; a TRL name that means something else
    #    here is an error that says what to write instead, and a near miss of a key gets "did you mean"

A config with any TRL name is a TRL user's: the group std is then TRL's, the sample std (std_correction 1; nanorl's
default is the population std, 0), unless std_correction is given too; config.json records which.
"""

from __future__ import annotations

import difflib

from nanorl.errors import ConfigError

# TRL name -> nanorl key, or (nanorl key, {TRL value: nanorl value}) where the values are spelled differently.
SAME = {
    "num_generations": "samples_per_prompt",
    "max_completion_length": "max_new_tokens",
    "beta": "kl_coef",
    "epsilon": "clip_low",
    "epsilon_high": "clip_high",
    "learning_rate": "lr",
    "model_name_or_path": "model",
    "output_dir": "out_dir",
    "max_steps": "steps",
    "num_iterations": "epochs",
    "max_grad_norm": "grad_clip",
    # transformers' schedules decay to 0 (nanorl's to lr_min_ratio, 0.1 unless given); constant has no warmup there
    "lr_scheduler_type": (
        "lr_schedule",
        {
            "cosine": {"lr_schedule": "cosine", "lr_min_ratio": 0.0},
            "linear": {"lr_schedule": "linear", "lr_min_ratio": 0.0},
            "constant": {"lr_schedule": "constant", "warmup_steps": 0},
            "constant_with_warmup": {"lr_schedule": "constant"},
        },
    ),
    "save_total_limit": "keep_last",
    "save_strategy": ("save_every", {"steps": {}, "no": {"save_every": 0}}),  # steps: every save_steps
    "eval_strategy": ("eval_every", {"steps": {}}),
    "save_steps": "save_every",
    "eval_steps": "eval_every",
    "lora_target_modules": "lora_target",
    "reward_funcs": "reward",
    "importance_sampling_level": "ratio_level",
    "dataset_name": "data",
    "eval_dataset": "eval_data",
    "gradient_checkpointing": "grad_checkpointing",
    "max_tool_calling_iterations": "max_tool_calls",
    "loss_type": ("loss_agg", {"grpo": "sequence", "bnpo": "token", "dapo": "token", "dr_grpo": "constant"}),
    "scale_rewards": ("scale_adv_by_std", {"group": True, "none": False, True: True, False: False}),
    "mask_truncated_completions": ("overlong", {True: "filter", False: "none"}),
    "bf16": ("dtype", {True: "bf16-mixed", False: "float32"}),
    # vLLM (integrations/vllm.py): TRL's vllm_importance_sampling_* are read together by `correction` below
    "vllm_enable_sleep_mode": ("use_vllm", {False: {}}),  # the value that means nothing to do
    "vllm_tensor_parallel_size": ("use_vllm", {1: {}, "1": {}}),
}
# TRL names whose meaning differs here: what to write instead.
DIFFERENT = {
    "scale_rewards": "TRL's scale_rewards is nanorl's scale_adv_by_std (group/true, none/false); 'batch' (group "
    "mean, batch std) has no exact equivalent: the nearest is --adv-estimator group_batch "
    "(REINFORCE++-baseline: group mean, then whitened over the batch's tokens)",
    "num_train_epochs": "online, a nanorl step is one rollout batch of prompts_per_step prompts: set `steps` (TRL's "
    "num_iterations, passes over each batch, is nanorl's `epochs`)",
    "dataset_text_field": "nanorl's SFT reads a `text` column (or prompt/completion, or messages)",
    "loss_type": "TRL's GRPO loss_type is nanorl's loss_agg (grpo = sequence, dapo/bnpo = token, dr_grpo = constant); "
    "`--algo dapo` also turns on dynamic sampling, overlong shaping and clip-higher",
    "per_device_train_batch_size": "a step is batch_size rows (prompts_per_step x samples_per_prompt completions "
    "online); micro_batch_size is how many go through one forward/backward",
    "gradient_accumulation_steps": "the loss is normalised over the whole step's batch, so micro_batch_size "
    "(sequences per forward/backward) is the only memory knob",
    "generation_batch_size": "a step samples prompts_per_step x samples_per_prompt completions",
    "max_prompt_length": "prompts are never cut; a prompt that does not fit the context is refused before training",
    "use_vllm": "vLLM samples the rollouts of `nanorl train` and `nanorl ppo`, and `nanorl eval`'s (--use_vllm true)",
    "use_peft": "LoRA is on when --lora-r > 0",
    "vllm_importance_sampling_mode": "nanorl's token_mask / sequence_mask also drop ratios below 1 / is_cap (verl's "
    "band), where TRL's (its default: sequence_mask) drop only those above clip_max: give a *_truncate mode, or "
    "nanorl's --is-mode and --is-cap with that in mind (losses.mismatch_weights)",
    "vllm_enable_sleep_mode": "sleep mode (the engine's GPU memory freed during the update) is not in nanorl yet, and "
    "vLLM has none on a CPU; use --vllm_gpu_memory_utilization to share the GPU",
    "vllm_tensor_parallel_size": "a colocated engine is one per process (tensor parallel 1); a server shards the "
    "model over GPUs: nanorl vllm-serve --tensor_parallel_size N",
    "reward_weights": "weights go in the reward spec: --reward 'math=1,answer_tag=0.2'",
    "lr_scheduler_type": "nanorl's schedules are constant, cosine and linear (lr_schedule), with warmup_steps and "
    "lr_min_ratio (where the decay ends; transformers': 0)",
    "warmup_ratio": "set warmup_steps (optimizer steps; transformers' warmup is ceil(warmup_ratio x max_steps))",
    "save_strategy": "checkpoints are written every save_every steps (0 = none), not per epoch or by a metric",
    "eval_strategy": "evaluation runs every eval_every steps (and at the start and the end), not per epoch",
    "steps_per_generation": "a step samples one batch and makes epochs x (batch / minibatch_size) optimizer steps "
    "on it: set minibatch_size (and epochs)",
    "push_to_hub": "nanorl does not upload; the final folder (out_dir/model) is hub-ready: `hf upload NAME "
    "out_dir/model`",
    "run_name": "the run is named by its out_dir (W&B: WANDB_NAME / WANDB_PROJECT)",
    "per_device_eval_batch_size": "evaluation samples every held-out prompt in batches of its own",
    "optim": "the optimizer is AdamW (fused) with adam_beta1, adam_beta2, adam_epsilon and weight_decay",
    "repetition_penalty": "not in nanorl yet: temperature, top_p, top_k and min_p shape the sampling",
    "generation_kwargs": "not in nanorl: the sampling keys are temperature, top_p, top_k and min_p",
    "fp16": "fp16 training is not in nanorl: --dtype bf16-mixed (TRL's bf16) or float32",
    "use_liger_kernel": "not in nanorl: log-probs are computed a chunk of rows at a time already",
    "ds3_gather_for_generation": "DeepSpeed is not used: FSDP (--strategy fsdp) gathers each weight as it is needed",
    "sync_ref_model": "the reference model is the starting model and stays frozen",
    "logging_steps": "every step is logged",
}


CORRECTION = ("correction", "mode", "clip_max", "cap")  # TRL's vllm_importance_sampling_<these>


def correction(values: dict) -> dict:
    """TRL's vllm_importance_sampling_* keys, read together as TRL reads them (correction on unless false; mode
    sequence_mask and clip_max 3 unless given; `cap` is clip_max's older name) -> {is_mode, is_cap}: off, or a
    truncate mode, which mean the same here; a mask mode stops with what to write instead."""
    given = {
        k: values[f"vllm_importance_sampling_{k}"] for k in CORRECTION if f"vllm_importance_sampling_{k}" in values
    }
    on = given.get("correction", True)
    if (on.strip().lower() != "false") if isinstance(on, str) else on:
        mode = str(given.get("mode", "sequence_mask"))
        if not mode.endswith("truncate"):
            key = "vllm_importance_sampling_mode"
            raise ConfigError(f"config key '{key}' (a TRL name, {mode}): {DIFFERENT[key]}")
        return {"is_mode": mode, "is_cap": float(given.get("clip_max", given.get("cap", 3.0)))}
    return {"is_mode": "none"}


def _mapped(cls, trl: str, value) -> dict | None:
    """{nanorl key: value} for a TRL name in `cls`, or None when there is no same-meaning alias."""
    target = SAME.get(trl)
    fields = getattr(cls, "__dataclass_fields__", {})
    if trl == "num_train_epochs" and "data" in fields:  # offline: passes over the rows, as in TRL
        return {"epochs": value}
    if target is None:
        return None
    key, table = (target, None) if isinstance(target, str) else target
    if trl == "loss_type" and "loss" in fields:  # DPO: TRL's loss_type values are nanorl's `loss`
        return {"loss": value}
    if trl == "dataset_name" and "task" in fields and "data" not in fields:  # online: the prompts are the task
        key = "task"
    if trl == "reward_funcs" and isinstance(value, (list, tuple)):  # a list of names -> nanorl's spec
        value = ",".join(map(str, value))
    if key not in fields:
        return None
    if table is None:
        return {key: value}
    lookup = value.strip().lower() if isinstance(value, str) else value
    if isinstance(lookup, str) and lookup in ("true", "false"):
        lookup = lookup == "true"
    if lookup not in table:
        return None
    return table[lookup] if isinstance(table[lookup], dict) else {key: table[lookup]}


def resolve_names(cls, values: dict, prog: str = "nanorl train") -> dict:
    """Keys of a config dict in nanorl's names: TRL aliases are renamed (an explicit nanorl key wins); a TRL name
    that means something else here, or an unknown key, raises ConfigError with what to write instead."""
    fields = set(getattr(cls, "__dataclass_fields__", {}))
    values = {k.replace("-", "_"): v for k, v in values.items()}
    out, renamed = {}, {}
    if "is_mode" in fields and any(f"vllm_importance_sampling_{k}" in values for k in CORRECTION):
        renamed = correction(values)
        values = {k: v for k, v in values.items() if k.removeprefix("vllm_importance_sampling_") not in CORRECTION}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name in fields:
            out[name] = value
            continue
        mapped = _mapped(cls, name, value)
        if mapped is not None:
            renamed.update(mapped)
            if name == "epsilon" and "clip_high" in fields:  # TRL: epsilon_high defaults to epsilon
                renamed.setdefault("clip_high", mapped["clip_low"])
            continue
        if name in DIFFERENT or name in SAME:
            hint = DIFFERENT.get(name, f"no nanorl key of `{prog}` means the same")
            raise ConfigError(f"config key '{name}' (a TRL name): {hint} (see `{prog} --help`)")
        close = difflib.get_close_matches(name, sorted(fields) + sorted(SAME), n=1, cutoff=0.75)  # typos, not kin
        hint = f"; did you mean '{close[0]}'" if close else ""
        if close and isinstance(SAME.get(close[0]), str):
            hint += f" (TRL's name for '{SAME[close[0]]}')"
        hint += "?" if close else ""
        raise ConfigError(f"unknown config key '{name}'{hint} (see `{prog} --help`)")
    if "epsilon_high" in values and "clip_high" in fields:  # the explicit high bound beats epsilon's copy
        renamed.update(_mapped(cls, "epsilon_high", values["epsilon_high"]))
    if renamed and "std_correction" in fields:  # a TRL config: TRL's group std, the sample std (torch.std)
        renamed.setdefault("std_correction", 1)
    implied = {"lr_min_ratio", "warmup_steps", "std_correction"} | (
        {"clip_high"} if "epsilon_high" not in values else set()
    )
    both = sorted(k for k in renamed.keys() & out.keys() if k not in implied)  # implied by a TRL name: nanorl's wins
    if both:  # e.g. --learning_rate and --lr: which one was meant?
        raise ConfigError(f"config key '{both[0]}' is given twice, once by its TRL name: give one of them")
    return {**renamed, **out}

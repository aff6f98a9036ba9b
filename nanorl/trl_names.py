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
    "use_cpu": ("device", {True: "cpu", False: {}}),
}
# TRL names whose value (these) means what nanorl does anyway: accepted, nothing changes. Another value is answered
# from DIFFERENT.
AS_NANORL = {
    "disable_dropout": (True,),  # nanorl runs every model without dropout
    "shuffle_dataset": (True,),  # the prompts' order is a seeded shuffle per pass
    "eval_on_start": (True,),  # the 'before' of before / after
    "logging_first_step": (True, False),  # every step is logged
    "completion_only_loss": (True, None),  # SFT: the loss is on the reply tokens
    "assistant_only_loss": (True,),  # SFT on messages: the assistant turns are trained
    "truncation_mode": ("keep_start",),  # a reply's end is cut to max_length
    "precompute_ref_log_probs": (True, False),  # DPO: the reference's log-probs, once, cached with each row
    "remove_unused_columns": (False,),  # every column reaches the rewards
    "multi_objective_aggregation": ("sum_then_normalize",),  # the weighted parts are summed, then normalised
}
NO_UPLOAD = "nanorl does not upload; the final folder (out_dir/model) is hub-ready: `hf upload NAME out_dir/model`"
NOT_THIS_LOSS = "not in nanorl: the GRPO family's losses are in docs/algorithms.md (--algo, loss_agg, ratio_level)"
NOT_THIS_DPO = "not in nanorl: DPO's loss is sigmoid (DPO), ipo or hinge, with label_smoothing"
NO_PACKING = "no packing: rows are padded to the longest of their micro-batch"
OTHER_ROLLOUTS = "rollouts run on nanorl's sampler, or on a vLLM engine with --use_vllm true"
FIXED_ENTROPY = "entropy_coef is a fixed bonus (no adaptive schedule or target)"
NO_BEST = "the final model is the last step's; every evaluation is in eval.jsonl and the checkpoints in checkpoint*/"
DDP = "under torchrun, --strategy ddp or fsdp; nanorl sets up the process group (distributed.py)"
# TRL names whose meaning differs here: what to write instead.
DIFFERENT = {
    "scale_rewards": "TRL's scale_rewards is nanorl's scale_adv_by_std (group/true, none/false); 'batch' (group "
    "mean, batch std) has no exact equivalent: the nearest is --adv-estimator group_batch "
    "(REINFORCE++-baseline: group mean, then whitened over the batch's tokens)",
    "num_train_epochs": "online, a nanorl step is one rollout batch of prompts_per_step prompts: set `steps` (TRL's "
    "num_iterations, passes over each batch, is nanorl's `epochs`)",
    "dataset_text_field": "nanorl's SFT reads a `text` column (or prompt/completion, or messages)",
    "loss_type": "TRL's GRPO loss_type is nanorl's loss_agg (grpo = sequence, dapo/bnpo = token, dr_grpo = constant); "
    "`--algo dapo` also turns on dynamic sampling, overlong shaping and clip-higher; DPO's is `loss`; SFT's nll is "
    "nanorl's SFT loss (dft is not in nanorl)",
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
    "push_to_hub": NO_UPLOAD,
    "run_name": "the run is named by its out_dir (W&B: WANDB_NAME / WANDB_PROJECT)",
    "per_device_eval_batch_size": "evaluation samples every held-out prompt in batches of its own",
    "optim": "the optimizer is AdamW (fused) with adam_beta1, adam_beta2, adam_epsilon and weight_decay",
    "generation_kwargs": "not in nanorl: the sampling keys are temperature, top_p, top_k, min_p and repetition_penalty",
    "fp16": "fp16 training is not in nanorl: --dtype bf16-mixed (TRL's bf16) or float32",
    "use_liger_kernel": "not in nanorl: log-probs are computed a chunk of rows at a time already",
    "ds3_gather_for_generation": "DeepSpeed is not used: FSDP (--strategy fsdp) gathers each weight as it is needed",
    "sync_ref_model": "the reference model is the starting model and stays frozen",
    "logging_steps": "every step is logged",
    # the rest of TRL 1.16's GRPOConfig, DPOConfig and SFTConfig (tests/test_trl.py lists them) and the
    # TrainingArguments a practitioner sets
    "model_init_kwargs": "the model loads in the precision --dtype names; no other from_pretrained arguments",
    "trust_remote_code": "nanorl loads the architectures transformers ships (no remote code)",
    "router_aux_loss_coef": "mixture-of-experts auxiliary losses are not in nanorl",
    "disable_dropout": "nanorl runs every model without dropout (rollout and update see one function)",
    "cast_lm_head_to_fp32": "not in nanorl: under bf16-mixed the head's matmul runs in bf16 and its log-softmax in "
    "fp32; --dtype float32 for an fp32 head",
    "num_generations_eval": "evaluation is greedy, one completion per held-out prompt; --eval-k K adds pass@K from K "
    "samples, --eval-temperature T samples at T",
    "shuffle_dataset": "the prompts are drawn in a seeded shuffle per pass (seed); there is no unshuffled order",
    "pad_to_multiple_of": "rows are padded to the longest of their micro-batch",
    "cache_implementation": "nanorl's sampler keeps its own KV cache (backends/decode.py), vLLM its paged one",
    "vllm_model_impl": "the engine runs vLLM's own implementation of the model",
    "vllm_structured_outputs_regex": "not in nanorl: a format reward shapes the output",
    "vllm_group_port": "no NCCL group: the weights go to `nanorl vllm-serve` over HTTP (docs/scaling.md)",
    "delta": "two-sided clipping is not in nanorl: clip_ratio_c is dual-clip PPO's bound on negative advantages",
    **dict.fromkeys(("sapo_temperature_neg", "sapo_temperature_pos"), NOT_THIS_LOSS),
    **dict.fromkeys(("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"), NOT_THIS_LOSS),
    "multi_objective_aggregation": "the reward parts are summed with the spec's weights, then normalised per group "
    "(TRL's sum_then_normalize); normalize_then_sum is not in nanorl",
    **dict.fromkeys(("ref_model_mixup_alpha", "ref_model_sync_steps"), "the reference model stays frozen"),
    "top_entropy_quantile": "not in nanorl: every token the model wrote is trained",
    **dict.fromkeys(
        ("use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"),
        FIXED_ENTROPY,
    ),
    "vllm_importance_sampling_clip_min": "nanorl's band is [1 / is_cap, is_cap] (losses.mismatch_weights)",
    "off_policy_mask_threshold": "not in nanorl: --is-mode sequence_mask drops sequences whose sampler / learner "
    "ratio leaves [1 / is_cap, is_cap]",
    "use_bias_correction_kl": "not in nanorl: the KL estimator is kl_estimator k1, k2 or k3 (losses.kl_penalty)",
    "log_multimodal": "nanorl trains text models",
    "num_completions_to_print": "the console prints a line per step; samples.jsonl holds completions (all with "
    "--log_completions true), and `nanorl report` shows them",
    "log_unique_prompts": "samples.jsonl records each completion with its prompt",
    "log_completions_hub_repo": NO_UPLOAD,
    **dict.fromkeys(
        ("use_transformers_continuous_batching", "transformers_continuous_batching_config", "use_transformers_paged"),
        OTHER_ROLLOUTS,
    ),
    "dataset_num_proc": "rows are read by datasets in this process",
    "truncation_mode": "a reply's end is cut to max_length (TRL's keep_start); prompts are never cut",
    **dict.fromkeys(("padding_free", "packing", "packing_strategy", "eval_packing"), NO_PACKING),
    "precompute_ref_batch_size": "the reference's log-probs are computed once, micro_batch_size rows at a time",
    "loss_weights": "one loss (sigmoid, ipo or hinge), not a weighted mixture",
    **dict.fromkeys(
        ("ld_alpha", "f_divergence_type", "f_alpha_divergence_coef", "use_weighting", "discopop_tau"), NOT_THIS_DPO
    ),
    "activation_offloading": "not in nanorl: --grad-checkpointing true saves activation memory",
    "pad_token": "the tokenizer's own pad token is used",
    "chat_template_path": "the model folder's chat template renders the rows: put a template in the folder",
    "dataset_kwargs": "rows are read by datasets as they are (prompt_field and answer_field name the columns)",
    "eos_token": "each reply ends with the tokenizer's EOS",
    "completion_only_loss": "the loss is on the reply tokens only; train on every token with `text` rows",
    "assistant_only_loss": "messages rows train the assistant turns only (TRL's assistant_only_loss true); train on "
    "every token with `text` rows",
    "lr_scheduler_kwargs": "the schedule's knobs are warmup_steps and lr_min_ratio",
    "tf32": "not set by nanorl (a GPU matmul setting; torch's default applies)",
    **dict.fromkeys(("torch_compile", "torch_compile_backend", "torch_compile_mode"), "not in nanorl"),
    "gradient_checkpointing_kwargs": "--grad-checkpointing true, with no options",
    "neftune_noise_alpha": "not in nanorl",
    **dict.fromkeys(("logging_strategy", "logging_first_step"), "every step is logged"),
    "disable_tqdm": "the progress bar shows on a terminal only; the step line is printed either way",
    "project": "trackio's project comes from TRACKIO_PROJECT, W&B's from WANDB_PROJECT",
    "trackio_space_id": "trackio's Space comes from TRACKIO_SPACE_ID",
    "eval_on_start": "nanorl always evaluates at the start (the 'before' of before / after)",
    **dict.fromkeys(("load_best_model_at_end", "metric_for_best_model", "greater_is_better"), NO_BEST),
    "save_only_model": "a checkpoint holds what resuming needs (weights, AdamW, RNGs); out_dir/model the weights",
    "data_seed": "seed also sets the data order",
    **dict.fromkeys(("dataloader_num_workers", "dataloader_pin_memory"), "rows are read in the main process"),
    "remove_unused_columns": "every column of a row reaches the rewards (TRL's GRPO needs false too)",
    **dict.fromkeys(("ddp_backend", "ddp_timeout", "ddp_find_unused_parameters", "local_rank"), DDP),
    **dict.fromkeys(("fsdp", "fsdp_config"), "--strategy fsdp (FSDP2, every weight, gradient and AdamW state sharded)"),
    "deepspeed": "DeepSpeed is not used: --strategy fsdp shards the model (FSDP2)",
    "resume_from_checkpoint": "--resume true continues from out_dir/checkpoint",
    **dict.fromkeys(("hub_model_id", "hub_token", "hub_private_repo", "hub_strategy", "hub_revision"), NO_UPLOAD),
    "label_smoothing_factor": "DPO's label_smoothing is `label_smoothing`; token label smoothing is not in nanorl",
    "full_determinism": "a CPU run is deterministic from its seed already",
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


def _plain(value):
    """A value as YAML or the command line may spell it: 'True' / 'false' -> bool, 'none' -> None, else lowercase."""
    lookup = value.strip().lower() if isinstance(value, str) else value
    return (
        {"true": True, "false": False, "none": None, "null": None}.get(lookup, lookup)
        if isinstance(lookup, str)
        else lookup
    )


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
    if trl == "loss_type" and "data" in fields and _plain(value) == "nll":  # SFT's (and the reward model's) own loss
        return {}
    if trl == "dataset_name" and "task" in fields and "data" not in fields:  # online: the prompts are the task
        key = "task"
    if trl == "reward_funcs" and isinstance(value, (list, tuple)):  # a list of names -> nanorl's spec
        value = ",".join(map(str, value))
    if key not in fields:
        return None
    if table is None:
        return {key: value}
    lookup = _plain(value)
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
        if name in AS_NANORL and _plain(value) in AS_NANORL[name]:
            continue  # this value means what nanorl does anyway
        if name in DIFFERENT or name in SAME or name in AS_NANORL:
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

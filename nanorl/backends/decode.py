"""The sampler's decode step without transformers' modules, for Llama, Qwen2 and Qwen3 models on CPU in fp32.

    step = cpu_decoder(model, packed, cache, mask, group_size, max_new_tokens)   # None: use the model's own forward
    logits = step(tokens, rows, positions, t)                            # (A,) new tokens -> (A, V)

Per new token a decoder layer is four oneDNN matmuls on the weights `fast_cpu` packed for the rollout
(query/key/value and gate/up fused) and three small C++ kernels for the rest (cpu_decode.cpp): RMSNorm,
SiLU(gate) * up, and one that applies rotary embeddings, writes the key and value into the row's
completion cache and attends over the group's prompt (kept once per prompt, never copied per row) and
the row's completion so far. Finished rows simply stop being passed in: no cache is compacted or grown
with torch.cat. At 64 rows of SmolLM2-135M this cut the non-matmul time of a step from ~35 to ~15 ms and
rollouts ran at 1.3-1.4x the tokens/s of the transformers forward (benchmarks/decode.py, notes/LOG.md);
logits agree with the model's own forward to ~1e-5 (tests/test_decode.py).

The kernels are compiled on first use (~10 s, then cached per CPU and torch version under nanorl's cache
folder). Without a compiler, or for other architectures, dtypes or devices, `cpu_decoder` returns None and
the sampler runs the model's forward: the same distribution, somewhat slower.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import platform
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from nanorl.backends.cpu import _dnn as _linear
from nanorl.backends.cpu import _is_gated_silu_mlp

SOURCE = Path(__file__).with_name("cpu_decode.cpp")
LANES = 16  # cpu_decode.cpp reads keys LANES at a time: transposed key caches carry LANES spare columns
ARCHS = ("llama", "qwen2", "qwen3")  # full attention, RMSNorm, rotate-half rotary, SiLU-gated MLP; qwen3: per-head
# RMSNorm of queries and keys before the rotary (q_norm, k_norm)
STATIC_ROPE = ("default", "linear", "llama3")  # cos/sin depend on the position alone


def _cpu_flags() -> str:
    try:
        return next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return platform.processor()


def build_folder() -> Path:
    """Where the kernels are built: nanorl's cache, one folder per source, torch version and CPU."""
    from nanorl.cache import cache_dir

    key = hashlib.sha256(b"|".join(s.encode() for s in (SOURCE.read_text(), torch.__version__, _cpu_flags())))
    return cache_dir() / "kernels" / f"nanorl_cpu_{key.hexdigest()[:16]}"


@functools.cache
def kernels() -> bool:
    """Build (once per machine: -march=native) and load cpu_decode.cpp; False, with a warning, if that fails."""
    build = build_folder()
    try:
        from torch.utils.cpp_extension import load

        build.mkdir(parents=True, exist_ok=True)
        # torch's own lock is a file that stays if its holder is killed mid-build (Ctrl-C in the first seconds of a
        # run), and then every later run waits on it forever. This lock the kernel drops when its holder dies, and
        # whoever holds it may remove a stale torch lock: no other nanorl process is building.
        with open(build / "build.lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            (build / "lock").unlink(missing_ok=True)
            load(
                name=build.name,
                sources=[str(SOURCE)],
                build_directory=str(build),
                is_python_module=False,
                extra_cflags=["-O3", "-march=native", "-fopenmp"],
                extra_ldflags=["-fopenmp"],
            )
        return hasattr(torch.ops.nanorl_cpu, "decode_attention")
    except Exception as e:  # no compiler, no ninja, a read-only cache, ...
        warnings.warn(
            f"nanorl: could not build the CPU decode kernels ({type(e).__name__}: {str(e)[:300]}); "
            "decoding with the model's own forward instead (same results, slower)",
            stacklevel=2,
        )
        return False


def supported(model, packed: dict | None = None) -> bool:
    """A model whose decode step `LlamaDecoder` computes exactly: Llama, Qwen2 or Qwen3 layers, fp32 on CPU; its
    projections plain nn.Linear, or anything `packed` holds (peft's LoRA linears, folded: backends/cpu.py)."""
    cfg, inner = model.config, getattr(model, "model", None)
    linear = lambda m: type(m) is torch.nn.Linear or id(m) in (packed or {})  # noqa: E731
    if getattr(cfg, "model_type", None) not in ARCHS:
        return False
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if (
        model.device.type != "cpu"
        or model.dtype != torch.float32
        or inner is None
        or any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or [])
        or getattr(cfg, "pretraining_tp", 1) != 1
        or getattr(getattr(inner, "rotary_emb", None), "rope_type", None) not in STATIC_ROPE
        or 2 * inner.rotary_emb.inv_freq.numel() != head_dim  # rotary on every dimension
        or type(getattr(inner, "embed_tokens", None)) is not torch.nn.Embedding
    ):
        return False
    rms = lambda m: type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon")  # noqa: E731
    qk_norms = ("q_norm", "k_norm") if cfg.model_type == "qwen3" else ()
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if not (
            attn is not None
            and all(rms(getattr(attn, k, None)) for k in qk_norms)
            and all(linear(getattr(attn, k, None)) for k in ("q_proj", "k_proj", "v_proj", "o_proj"))
            and _is_gated_silu_mlp(getattr(layer, "mlp", None), linear)
            and all(rms(getattr(layer, k, None)) for k in ("input_layernorm", "post_attention_layernorm"))
        ):
            return False
    return True


def cpu_decoder(model, packed: dict, cache, mask: torch.Tensor, group_size: int, max_new_tokens: int):
    """The decode step for rows sampled group_size per prompt from a prefilled transformers cache (P prompts,
    left-padded by `mask` (P, Lp)), or None when `model` or this machine cannot take it (then run the model's forward).
    `packed` maps id(linear) -> (packed weight, bias, first, last output), from `fast_cpu(pack_weights=True)`."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's wrapper: the model inside
    if not packed or not supported(model, packed) or not kernels():
        return None
    need = [
        m
        for layer in model.model.layers
        for m in (
            *(getattr(layer.self_attn, k) for k in ("q_proj", "k_proj", "v_proj", "o_proj")),
            layer.mlp.gate_proj,
            layer.mlp.up_proj,
            layer.mlp.down_proj,
        )
    ]
    if not all(id(m) in packed for m in [*need, model.lm_head]):
        return None
    return LlamaDecoder(model, packed, cache, mask, group_size, max_new_tokens)


def _norm_heads(ops, qkv, qk_norm, heads, kv_heads):
    """Qwen3's RMSNorm over each query and key head (weights of size d) -> qkv with q and k normalised."""
    A, d = qkv.shape[0], qkv.shape[1] // (heads + 2 * kv_heads)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], -1)  # (A, heads d), (A, kv d), (A, kv d)
    (qw, q_eps), (kw, k_eps) = qk_norm
    q = ops.rms_norm(q.reshape(A * heads, d), qw, q_eps).view(A, -1)
    k = ops.rms_norm(k.reshape(A * kv_heads, d), kw, k_eps).view(A, -1)
    return torch.cat([q, k, v], -1)


def _linear_add(x, residual, w, b=None):
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, w, b, "add")  # residual + x @ w.T + b


class LlamaDecoder:
    """One token per row through every layer, on the packed weights and the kernels. Call with the tokens of
    the A rows still sampling (A,), their row numbers in the full batch of P * group_size (A,) (increasing), their
    positions (A,) and t, the completion slot these tokens take (0 for the first sampled token)."""

    def __init__(self, model, packed, cache, mask, group_size, max_new_tokens):
        cfg, inner = model.config, model.model
        attn0 = inner.layers[0].self_attn
        self.group_size, self.heads, self.scale = group_size, cfg.num_attention_heads, attn0.scaling
        norm = lambda m: (m.weight.detach(), m.variance_epsilon)  # noqa: E731
        self.embed = inner.embed_tokens.weight.detach()
        self.final_norm = norm(inner.norm)
        self.head = packed[id(model.lm_head)][:2]
        P, Lp = mask.shape
        self.start = (Lp - mask.sum(-1)).contiguous()  # (P,) first real position of each left-padded prompt
        d, nkv = cache.layers[0].keys.shape[-1], cache.layers[0].keys.shape[1]
        self.kv_heads = nkv
        # cos / sin (T, d) of every position a row can reach; each step picks its rows'
        positions = torch.arange(Lp + max_new_tokens + 1)[None]
        cos, sin = inner.rotary_emb(self.embed[:1], positions)  # (1, T, d) each
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()
        self.layers, layers = [], len(inner.layers)
        # completion caches of every layer in two allocations (60 separate ones left holes in the heap that
        # the update could not reuse: +0.2 GiB peak over 11 steps of benchmarks/speed.py)
        C = max_new_tokens
        ks = cache.layers[0].keys.new_zeros(layers, P * group_size, nkv, d, C + LANES)  # (layers, N, nkv, d, C + LANES)
        vs = cache.layers[0].values.new_zeros(layers, P * group_size, nkv, C, d)  # (layers, N, nkv, C, d)
        for layer, kv, k, v in zip(inner.layers, cache.layers, ks, vs):
            a, m = layer.self_attn, layer.mlp
            qkv, o, gu, down = (packed[id(x)] for x in (a.q_proj, a.o_proj, m.gate_proj, m.down_proj))
            assert qkv[2:] == (0, self.heads * d) and packed[id(a.v_proj)][3] == (self.heads + 2 * nkv) * d
            assert gu[2] == 0 and packed[id(m.up_proj)][3] == 2 * m.gate_proj.out_features  # fused as [gate | up]
            self.layers.append(
                dict(
                    qkv=qkv[:2],
                    o=o[:2],
                    gu=gu[:2],
                    down=down[:2],
                    norm1=norm(layer.input_layernorm),
                    norm2=norm(layer.post_attention_layernorm),
                    qk_norm=(norm(a.q_norm), norm(a.k_norm)) if hasattr(a, "q_norm") else None,  # qwen3
                    prompt_k=F.pad(kv.keys.transpose(-1, -2), (0, LANES)).contiguous(),  # (P, nkv, d, Lp + LANES)
                    prompt_v=kv.values.contiguous(),  # (P, nkv, Lp, d)
                    k=k,
                    v=v,
                )
            )

    def __call__(self, tokens, rows, positions, t):
        ops = torch.ops.nanorl_cpu
        h = F.embedding(tokens, self.embed)  # (A, H)
        cos, sin = self.cos.index_select(0, positions), self.sin.index_select(0, positions)  # (A, d)
        for p in self.layers:
            x = ops.rms_norm(h, *p["norm1"])
            qkv = _linear(x, *p["qkv"])  # (A, (heads + 2 kv heads) d)
            if p["qk_norm"]:
                qkv = _norm_heads(ops, qkv, p["qk_norm"], self.heads, self.kv_heads)
            o = ops.decode_attention(
                qkv,
                cos,
                sin,
                p["prompt_k"],
                p["prompt_v"],
                p["k"],
                p["v"],
                rows,
                self.start,
                self.group_size,
                t,
                self.heads,
                self.scale,
            )  # (A, heads d)
            h = _linear_add(o, h, *p["o"])
            gu = _linear(ops.rms_norm(h, *p["norm2"]), *p["gu"])  # (A, 2 I)
            h = _linear_add(ops.silu_mul(gu), h, *p["down"])
        return _linear(ops.rms_norm(h, *self.final_norm), *self.head)  # (A, V)

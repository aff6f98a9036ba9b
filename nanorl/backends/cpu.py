"""Fast fp32 paths on CPU: oneDNN matmuls, a fused gated MLP, grouped-query attention, weight gradients
added into .grad in place, malloc reuse.

    with fast_cpu(model): ...   # every forward of the loops (through Backend.forward); pack_weights=True in the sampler

The model's own math with other kernels, and less kept for backward (tests/test_models.py checks values
and gradients against the plain modules). On GPU, in bf16, or without oneDNN, a no-op.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import os
import sys
from contextlib import contextmanager

import torch
import torch.nn.functional as F

GQA = "TRANSFORMERS_SDPA_FORCE_GQA"  # read by transformers' SDPA attention at each call (5.x); ignored where unknown


def reuse_freed_memory(device: torch.device) -> None:
    """Keep freed memory for reuse instead of glibc's fresh mapping per allocation above 32 MB (a (V, H)
    gradient, (b, C, V) logits), which pays a page fault per 4 KiB: an embedding backward took 20-300 ms
    that way, 3.5 ms with the heap reused. Training loops, CPU only; reserved until the process exits."""
    if device.type != "cpu" or sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (e.g. musl): nothing to tune
        return
    libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: serve large allocations from the heap
    libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: keep the heap's free top for reuse


def _dnn(x, w, b=None):
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")  # x @ w.T + b


def _wrapped(model) -> bool:
    """Whether something outside the model reads its gradients as autograd accumulates them: DDP's reducer,
    FSDP, peft's adapters. Their hooks sit on the weights' AccumulateGrad nodes, which cannot be listed from
    Python, so the wrapper is recognised instead; `_add_grad` then leaves every gradient to the engine."""
    names = {c.__module__.split(".")[0] + "." + c.__name__ for m in model.modules() for c in type(m).__mro__}
    return bool(
        names & {"torch.DistributedDataParallel", "torch.FSDPModule", "torch.FullyShardedDataParallel"}
        or any(n.startswith("peft.") for n in names)
    )


def _grad_node(w: torch.Tensor, fuse: bool = True):
    """The AccumulateGrad node of a trainable leaf weight, to ask the engine about it later; None (the plain
    path) for anything else, when `fuse` is off, or when hooks wait for the weight's gradient."""
    if not (fuse and w.is_leaf and w.requires_grad and hasattr(torch._C, "_will_engine_execute_node")):
        return None
    if w._backward_hooks or getattr(w, "_post_accumulate_grad_hooks", None):
        return None
    with torch.enable_grad():
        fn = w.view_as(w).grad_fn  # None under torch.inference_mode
    return fn.next_functions[0][0] if fn is not None else None


def _into_grad(node) -> bool:
    """True inside a `.backward()` that will add this leaf's gradient to its .grad; False under
    torch.autograd.grad (gradients are returned, not accumulated) and when building a graph of the backward."""
    if node is None or torch.is_grad_enabled():
        return False
    try:
        return torch._C._will_engine_execute_node(node)
    except RuntimeError:  # raised for a leaf while torch.autograd.grad runs
        return False


def _add_grad(w, node, fresh, add_into):
    """w's gradient: `fresh()` builds it, `add_into(t)` adds it to t in place. When the engine would only add
    it to w.grad, we add it there ourselves and return None (Megatron-LM's gradient-accumulation fusion): no
    temporary of w's size, no extra pass to add it. Each weight gets two a micro-batch (the shared-prompt pass
    and the completion pass); for SmolLM2-135M this took ~0.3 GiB off the update's peak (the tied (V, H)
    head/embedding) and ~8% off its time (notes/LOG.md)."""
    if not _into_grad(node):
        return fresh()
    if w.grad is None:
        w.grad = fresh()
    else:
        add_into(w.grad)
    return None


def _weight_grad(w, node, a, b):
    """The weight gradient a.T @ b of w, (N, M) x (M, K) -> (N, K), added by the matmul itself (`_add_grad`)."""
    return _add_grad(w, node, lambda: a.t() @ b, lambda t: t.addmm_(a.t(), b))


class _DnnLinear(torch.autograd.Function):
    """F.linear with oneDNN doing the forward matmul and the input gradient dx = g W."""

    @staticmethod
    def forward(ctx, x, weight, bias, node):
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.node = bias is not None, node
        return _dnn(x, weight, bias)  # (..., N)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g, x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])  # (M, N), (M, K)
        dx = _dnn(g, weight.t()).view(*grad.shape[:-1], -1) if ctx.needs_input_grad[0] else None  # (..., K)
        dw = _weight_grad(weight, ctx.node, g, x) if ctx.needs_input_grad[1] else None  # (N, K); MKL: oneDNN was slower
        db = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None


class _Embedding(torch.autograd.Function):
    """F.embedding whose backward adds the looked-up rows' gradients into the weight's .grad in place
    (`_add_grad`) instead of building a dense (V, H) gradient first (113 MiB and 35 ms for SmolLM2's
    49k x 576 table, against 1 ms for the rows used). Rows of padding_idx get no gradient, as in F.embedding."""

    @staticmethod
    def forward(ctx, ids, weight, padding_idx, node):
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx, ctx.node = weight, padding_idx, node
        return F.embedding(ids, weight, padding_idx)  # (..., H)

    @staticmethod
    def backward(ctx, grad):
        (ids,), w = ctx.saved_tensors, ctx.weight
        flat, g = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])  # (M,), (M, H)
        if ctx.padding_idx is not None:
            keep = (flat != ctx.padding_idx).nonzero().squeeze(-1)
            flat, g = flat.index_select(0, keep), g.index_select(0, keep)
        add_into = lambda t: t.index_add_(0, flat, g)  # noqa: E731  ordered sums: the same bits every run
        return None, _add_grad(w, ctx.node, lambda: add_into(torch.zeros_like(w)), add_into), None, None


class _GatedMLP(torch.autograd.Function):
    """down(silu(gate) * up) of the gate and up projections (..., I) -> (..., H), SwiGLU (arXiv 2002.05202).
    Autograd alone keeps four (..., I) tensors a layer (gate, silu(gate), up, and down's input); this keeps
    gate and up and recomputes the rest elementwise: 175 MiB less a 16 x 32-token micro-batch of SmolLM2-135M."""

    @staticmethod
    def forward(ctx, gate, up, weight, bias, node):
        ctx.save_for_backward(gate, up, weight)
        ctx.has_bias, ctx.node = bias is not None, node
        return _dnn(F.silu(gate) * up, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        gate, up, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])  # (M, H)
        s = torch.sigmoid(gate)  # (..., I)
        act = gate * s  # silu(gate)
        act_up = (act * up).reshape(-1, up.shape[-1])  # (M, I) down's input
        dw = _weight_grad(weight, ctx.node, g, act_up) if ctx.needs_input_grad[2] else None  # (H, I)
        dh = _dnn(g, weight.t()).view(up.shape)  # (..., I) gradient of down's input
        d_up = dh * act
        d_gate = dh.mul_(up).mul_(s.mul_(1 + gate * (1 - s)))  # silu'(x) = s (1 + x (1 - s))
        return d_gate, d_up, dw, g.sum(0) if ctx.has_bias and ctx.needs_input_grad[3] else None, None


def _is_gated_silu_mlp(m, linear=lambda x: type(x) is torch.nn.Linear) -> bool:
    """A Llama-style MLP (Llama, Mistral, Qwen2/3, SmolLM, ...): down(act(gate(x)) * up(x)), act = SiLU; its
    projections what `linear` accepts (plain nn.Linear by default)."""
    return (
        all(linear(getattr(m, k, None)) for k in ("gate_proj", "up_proj", "down_proj"))
        and type(getattr(m, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation")
        and _gated_forward(type(m))
    )


@functools.lru_cache(maxsize=None)
def _gated_forward(cls) -> bool:
    try:
        return "self.act_fn(self.gate_proj(x)) * self.up_proj(x)" in inspect.getsource(cls.forward)
    except (OSError, TypeError):  # no source to read
        return False


SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # Llama-style names


def _foldable(m) -> bool:
    """A peft LoRA linear whose forward is x @ (W + (alpha / r) B A).T + b: one active adapter, not merged, not
    disabled, no DoRA, no dropout, fp32 on the CPU."""
    if not (type(m).__name__ == "Linear" and type(m).__module__.startswith("peft.tuners.lora")):
        return False
    base, active = getattr(m, "base_layer", None), list(getattr(m, "active_adapters", []))
    return (
        type(base) is torch.nn.Linear
        and not m.merged
        and not m.disable_adapters
        and len(active) == 1
        and base.weight.device.type == "cpu"
        and base.weight.dtype == torch.float32
        and (
            active[0] not in m.lora_A
            or (not m.use_dora.get(active[0]) and type(m.lora_dropout[active[0]]) is torch.nn.Identity)
        )
    )


def _folded(m) -> torch.Tensor:
    """A foldable LoRA linear's weight with its adapter folded in (peft's get_delta_weight: (alpha / r) B A)."""
    adapter = m.active_adapters[0]
    w = m.base_layer.weight.detach()
    return w + m.get_delta_weight(adapter).detach() if adapter in m.lora_A else w  # else: not adapted here


def _weight_and_bias(m) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What a linear to pack computes x @ w.T + b with: its own, or a LoRA linear's folded weight (made now)."""
    return (m.weight.detach(), m.bias) if type(m) is torch.nn.Linear else (_folded(m), m.base_layer.bias)


def _fuse_shared_inputs(model, ours: set, packed: dict) -> None:
    """No-grad only: linears of one module that read the same input (query/key/value, gate/up) packed as one
    weight. The first one called computes every output, the others return their slice when handed the same
    tensor (else they compute it again). Fewer, wider matmuls; each linear done goes into `packed`."""
    for parent in model.modules():
        for names in SHARED_INPUT:
            group = [getattr(parent, k, None) for k in names]
            if not all(id(m) in ours for m in group):
                continue
            ws, bs = zip(*(_weight_and_bias(m) for m in group))
            w = torch.ops.mkldnn._reorder_linear_weight(torch.cat(ws), 64)
            b = (
                torch.cat(
                    [
                        bias.detach() if bias is not None else weight.new_zeros(len(weight))
                        for weight, bias in zip(ws, bs)
                    ]
                )
                if any(bias is not None for bias in bs)
                else None
            )
            last, ends = {}, [0]
            for weight in ws:
                ends.append(ends[-1] + len(weight))

            def forward(x, lo, hi, w=w, b=b, last=last, ends=ends):
                y = last["y"] if last.get("x") is x else _dnn(x, w, b)  # (..., sum of out_features)
                last.update(x=x, y=y) if hi < ends[-1] else last.clear()  # the last slice frees the stash
                return y[..., lo:hi]

            for m, lo, hi in zip(group, ends, ends[1:]):
                m.forward = functools.partial(forward, lo=lo, hi=hi)
                packed[id(m)] = (w, b, lo, hi)


@contextmanager
def fast_cpu(model, pack_weights: bool = False):
    """Inside the block, on CPU in fp32: (1) nn.Linear layers run through oneDNN, about twice the rate of
    MKL's sgemm on these AMD EPYC hosts (benchmarks/speed.py, roofline); with pack_weights (the sampler,
    no gradients) each weight is reordered once into oneDNN's blocked layout (0.1 s for 135M weights,
    15-20% faster decoding), and linears sharing an input are packed as one (`_fuse_shared_inputs`,
    2-8% faster rollouts), so weights must not change inside the block. (2) Otherwise
    SiLU-gated MLPs run as one `_GatedMLP`. (3) Attention with fewer key/value heads than query heads
    runs SDPA's grouped-query kernel instead of copying each key/value head to the query heads it
    serves (`repeat_kv`): autograd kept that copy, 100 MiB a micro-batch here; the kernel is faster.
    (4) In a `loss.backward()`, the linears', gated MLPs' and embeddings' weight gradients are added into
    .grad by the op that computes them (`_add_grad`); torch.autograd.grad still gets them returned, and
    weights with gradient hooks, or a model wrapped by DDP, FSDP or peft, get them the engine's way.
    (5) With pack_weights, peft's LoRA linears are packed too, their adapters folded into the weight once per
    rollout (`_folded`), so they decode like plain linears and backends/decode.py's step takes them.
    Yields {id(linear): (packed weight, bias, first, last output column)} of the packed linears (else {}),
    for backends/decode.py."""
    oneDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    lora = [
        m for m in model.modules() if oneDNN and pack_weights and "forward" not in m.__dict__ and _foldable(m)
    ]  # folded: their own linears (base, A, B) are not run
    inside = {id(x) for m in lora for x in m.modules() if x is not m}
    linears = (
        [
            m
            for m in model.modules()
            if type(m) is torch.nn.Linear
            and m.weight.device.type == "cpu"
            and m.weight.dtype == torch.float32
            and "forward" not in m.__dict__  # not already inside
            and id(m) not in inside
        ]
        if oneDNN
        else []
    )  # not without oneDNN or a torch without these ops
    patched, ours, packed = list(linears), {id(m) for m in linears}, {}
    node = functools.partial(_grad_node, fuse=not _wrapped(model))  # step aside for DDP, FSDP, peft
    if pack_weights:
        patched += lora
        _fuse_shared_inputs(model, ours | {id(m) for m in lora}, packed)
    for m in [*linears, *lora] if pack_weights else linears:
        if id(m) in packed:
            continue
        if pack_weights:
            weight, bias = _weight_and_bias(m)
            w = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
            b = bias.detach() if bias is not None else None
            m.forward = lambda x, w=w, b=b: _dnn(x, w, b)
            packed[id(m)] = (w, b, 0, len(weight))
        else:
            m.forward = lambda x, m=m, node=node(m.weight): _DnnLinear.apply(x, m.weight, m.bias, node)  # noqa: B008
    for m in model.modules() if linears and not pack_weights else []:
        if "forward" not in m.__dict__ and _is_gated_silu_mlp(m) and id(m.down_proj) in ours:
            m.forward = lambda x, m=m, node=node(m.down_proj.weight): _GatedMLP.apply(  # noqa: B008
                m.gate_proj(x), m.up_proj(x), m.down_proj.weight, m.down_proj.bias, node
            )
            patched.append(m)
        elif (
            type(m) is torch.nn.Embedding
            and "forward" not in m.__dict__
            and m.weight.device.type == "cpu"
            and m.weight.dtype == torch.float32
            and m.max_norm is None
            and not m.scale_grad_by_freq
            and not m.sparse
        ):
            m.forward = lambda ids, m=m, node=node(m.weight): _Embedding.apply(  # noqa: B008
                ids, m.weight, m.padding_idx, node
            )
            patched.append(m)
    gqa = os.environ.get(GQA)
    if linears and tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 5):  # SDPA's enable_gqa
        os.environ[GQA] = "1"
    try:
        yield packed
    finally:
        for m in patched:
            m.__dict__.pop("forward", None)
        os.environ.pop(GQA, None) if gqa is None else os.environ.update({GQA: gqa})

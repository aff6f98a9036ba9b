"""The backend switch (backends/__init__.py) and the fused weight-gradient path stepping aside: with gradient
hooks, under DDP and under peft, gradients are computed the engine's way and equal plain autograd's."""

import pytest
import torch

from nanorl.backends import Backend, cpu, select_backend
from nanorl.models import tiny_model_and_tokenizer

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")


def _batches():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, 90, (3, 9), generator=gen) for _ in range(2)]


def _loss(model, ids):
    return model(input_ids=ids).logits.float().square().mean()


def _plain_grads(model, batches):
    for ids in batches:
        _loss(model, ids).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def _fast_grads(model, batches, monkeypatch, wrapper=None):
    """Gradients of the same two micro-batches inside fast_cpu, and whether any weight took the in-place path."""
    in_place = []
    into_grad = cpu._into_grad
    monkeypatch.setattr(cpu, "_into_grad", lambda node: in_place.append(into_grad(node)) or in_place[-1])
    outer = wrapper or model
    with cpu.fast_cpu(outer):
        for ids in batches:
            _loss(outer, ids).backward()
    grads = {n.removeprefix("module."): p.grad.clone() for n, p in outer.named_parameters() if p.grad is not None}
    return grads, any(in_place), len(in_place)


def _assert_same(a, b):
    assert a.keys() == b.keys() and a
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-5, atol=1e-7)


@needs_onednn
def test_backend_torch_and_the_environment_variable_turn_every_speed_up_off(monkeypatch):
    model, _ = tiny_model_and_tokenizer()
    with Backend("auto").forward(model) as packed:  # the oneDNN linears are patched in
        assert "forward" in model.lm_head.__dict__ and packed == {}
    for backend, env in ((Backend("torch"), "auto"), (Backend("auto"), "torch")):
        monkeypatch.setenv("NANORL_BACKEND", env)
        assert not backend.fast and backend.decoder(model, {1: 2}, None, None, 1, 1) is None
        with backend.forward(model, pack_weights=True) as packed:
            assert packed == {} and not any("forward" in m.__dict__ for m in model.modules())
    with pytest.raises(ValueError, match="'backend'"):
        select_backend("fast", "auto", torch.device("cpu"))
    assert select_backend("torch", "bf16-mixed", torch.device("cpu")) == (
        Backend("torch", torch.bfloat16),
        torch.float32,
    )


@needs_onednn
def test_weights_with_gradient_hooks_get_their_gradients_the_engines_way(monkeypatch):
    model, _ = tiny_model_and_tokenizer()
    batches = _batches()
    plain = _plain_grads(model, batches)
    accumulated, head = [], []
    hooked = model.model.layers[0].mlp.down_proj.weight  # the gated MLP's weight
    handles = [
        hooked.register_post_accumulate_grad_hook(lambda p: accumulated.append(p.grad.clone())),
        model.lm_head.weight.register_hook(lambda g: head.append(g.clone())),
    ]  # a tensor hook, tied weight
    grads, _, _ = _fast_grads(model, batches, monkeypatch)
    _assert_same(grads, plain)
    assert len(accumulated) == 2 and len(head) == 2  # each hook ran once per backward, and saw the gradient
    torch.testing.assert_close(accumulated[-1], plain["model.layers.0.mlp.down_proj.weight"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(head[0] + head[1], plain["model.embed_tokens.weight"], rtol=1e-5, atol=1e-7)
    for h in handles:
        h.remove()
    model.zero_grad(set_to_none=True)
    _, fused, _ = _fast_grads(model, batches, monkeypatch)
    assert fused  # without hooks the in-place path is taken again


@needs_onednn
def test_ddp_wrapped_model_gets_the_engines_gradients(monkeypatch):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model, _ = tiny_model_and_tokenizer()
    batches = _batches()
    plain = _plain_grads(model, batches)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(model)
        grads, fused, calls = _fast_grads(model, batches, monkeypatch, wrapper=ddp)
    finally:
        dist.destroy_process_group()
    assert calls and not fused  # every weight took the plain path: DDP's reducer saw each gradient
    _assert_same(grads, plain)


@needs_onednn
def test_peft_model_gets_the_engines_gradients(monkeypatch):
    peft = pytest.importorskip("peft")
    model, _ = tiny_model_and_tokenizer()
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )  # random A and B: every adapter gets a gradient
    model = peft.get_peft_model(model, config)
    batches = _batches()
    plain = _plain_grads(model, batches)
    assert plain and all("lora_" in n for n in plain)  # only adapters train
    grads, fused, _ = _fast_grads(model, batches, monkeypatch)
    assert not fused
    _assert_same(grads, plain)

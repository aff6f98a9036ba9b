"""Gradient checkpointing (config key grad_checkpointing, Backend.recompute): the update's completion pass runs
on top of the prompt's KV cache; with checkpointing each decoder layer runs a second time in the backward, and
the gradient is the one without it."""

import pytest
import torch

from nanorl import GRPOConfig
from nanorl.advantages import group_advantages
from nanorl.backends import Backend
from nanorl.integrations.lora import add_adapters
from nanorl.models import stop_token_ids, tiny_model_and_tokenizer
from nanorl.sampling import SamplingParams, generate
from nanorl.update import policy_backward


def _grads_and_layer_runs(model, tok, roll, adv, backend, micro=4, kl_ref=None):
    runs = []  # runs of a decoder layer's forward, recomputations included (they call forward, not the module)
    cls = type(next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")))
    forward = cls.forward
    cls.forward = lambda self, *a, **k: runs.append(1) or forward(self, *a, **k)
    model.zero_grad(set_to_none=True)
    cfg = GRPOConfig(micro_batch_size=micro, kl_coef=0.1 if kl_ref is not None else 0.0, entropy_coef=0.01)
    policy_backward(
        model,
        roll,
        adv,
        list(range(len(adv))),
        cfg,
        on_policy=True,
        pad_id=tok.pad_token_id,
        device="cpu",
        backend=backend,
        ref=kl_ref,
    )
    cls.forward = forward
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, len(runs)


@pytest.mark.parametrize("lora", [False, True])
def test_the_gradient_with_checkpointing_is_the_gradient_without(lora):
    model, tok = tiny_model_and_tokenizer(seed=1)
    if lora:
        model = add_adapters(model, GRPOConfig(lora_r=4, lora_alpha=8.0))
    prompts = [tok("ab")["input_ids"], tok("a longer one")["input_ids"], tok("c")["input_ids"]]
    roll = generate(
        model, prompts, 4, SamplingParams(max_new_tokens=9), stop_token_ids(model, tok), seed=0, pad_id=tok.pad_token_id
    )
    adv = group_advantages(torch.tensor([float(len(c) % 3) for c in roll.completion_ids]), 4)
    for name in ("auto", "torch"):
        plain, runs = _grads_and_layer_runs(model, tok, roll, adv, Backend(name))
        recomputed, reruns = _grads_and_layer_runs(model, tok, roll, adv, Backend(name, checkpoint=True))
        assert plain and plain.keys() == recomputed.keys()
        for n in plain:
            torch.testing.assert_close(recomputed[n], plain[n], rtol=1e-5, atol=1e-7, msg=n)
        assert runs > 0 and reruns == runs + runs // 2  # the completion passes' layer runs (half) ran again


def test_checkpointing_leaves_no_forward_patched_and_refuses_models_without_layers():
    model, tok = tiny_model_and_tokenizer()
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.enable_grad(), Backend("torch", checkpoint=True).recompute(model, cache):
        assert any("forward" in vars(m) for m in model.modules())
    assert not any("forward" in vars(m) for m in model.modules())
    with (
        pytest.raises(ValueError, match="grad_checkpointing"),
        Backend(checkpoint=True).recompute(torch.nn.Linear(2, 2), cache),
    ):
        pass


@pytest.mark.parametrize("lora", [False, True])
def test_a_reward_model_or_critic_pass_is_checkpointed_with_the_same_gradient(lora):
    """The reward model's and PPO critic's whole-sequence pass (reward_model._hidden, no KV cache): with
    checkpointing every decoder layer runs again in the backward, and the gradient is the one without."""
    from nanorl.reward_model import load_reward_model, rm_scores, token_values

    torch.manual_seed(0)
    model, tok = load_reward_model("tiny", "cpu")
    torch.nn.init.normal_(model.score.weight)  # the fresh head is 0: then no gradient would reach the backbone
    if lora:
        model = add_adapters(model, GRPOConfig(lora_r=4, lora_alpha=8.0), "SEQ_CLS")
    prompts, replies = [tok("ab")["input_ids"], tok("a longer one")["input_ids"]], [[5, 6, 7], [8]]
    cls = type(next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")))
    forward = cls.forward
    for name in ("auto", "torch"):
        grads, runs = [], []
        for checkpoint in (False, True):
            calls = []
            cls.forward = lambda self, *a, **k: calls.append(1) or forward(self, *a, **k)  # noqa: B023
            model.zero_grad(set_to_none=True)
            backend = Backend(name, checkpoint=checkpoint)
            loss = (
                token_values(model, prompts, replies, tok.pad_token_id, "cpu", backend).sum()
                + rm_scores(model, prompts, replies, tok.pad_token_id, "cpu", backend).sum()
            )
            loss.backward()
            cls.forward = forward
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            runs.append(len(calls))
        assert grads[0] and grads[0].keys() == grads[1].keys()
        for n in grads[0]:  # auto: without checkpointing the CPU speed-ups round differently (they step aside for it)
            scale = grads[0][n].abs().max().item()
            torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-6 * scale, msg=n)
        assert runs[0] > 0 and runs[1] == 2 * runs[0]  # every layer run of the two passes ran again

"""Precision: 'auto' picks fp32 on CPU and bf16-mixed (fp32 weights, bf16 matmuls) on GPUs; why pure bf16
weights are not the GPU default; the mixed path on CPU (slow there, but the same code); GPU-only checks
that skip without CUDA."""

import pytest
import torch

from nanorl import Example, GRPOConfig, Task, train
from nanorl.backends import Backend, resolve_precision
from nanorl.data import collate
from nanorl.logprobs import token_logprobs
from nanorl.models import load_model, stop_token_ids
from nanorl.sampling import SamplingParams, generate

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_resolve_precision():
    assert resolve_precision("auto", torch.device("cpu")) == (torch.float32, None)
    assert resolve_precision("bf16-mixed", torch.device("cpu")) == (torch.float32, torch.bfloat16)
    assert resolve_precision("bfloat16", torch.device("cpu")) == (torch.bfloat16, None)
    with pytest.raises(ValueError, match="'dtype'.*'half'"):
        resolve_precision("half", torch.device("cpu"))


def test_pure_bf16_weights_lose_small_adamw_updates_and_fp32_weights_keep_them():
    """The reason 'auto' is bf16-mixed on GPUs: at lr 2e-5 a bf16 weight near 0.05 (spacing 2.4e-4) moves by
    less than half its spacing, so most AdamW updates round away (the number quoted in backends/__init__.py)."""
    unchanged = {}
    for dtype in (torch.bfloat16, torch.float32):
        torch.manual_seed(0)
        w = torch.nn.Parameter((torch.randn(576, 576) * 0.05).to(dtype))
        start = w.detach().clone()
        opt = torch.optim.AdamW([w], lr=2e-5, weight_decay=0.0)
        for _ in range(10):
            w.grad = torch.randn_like(w)
            opt.step()
        unchanged[dtype] = (w.detach() == start).float().mean().item()
    assert unchanged[torch.bfloat16] > 0.8  # 0.88 measured
    assert unchanged[torch.float32] < 1e-4  # 2 of 331,776 entries (their steps cancelled)


def _mixed_rollout(device):
    model, tok = load_model("tiny", device, torch.float32)
    mixed = Backend(autocast=torch.bfloat16)
    prompts = [tok("hi")["input_ids"], tok("a longer prompt")["input_ids"]]
    roll = generate(
        model,
        prompts,
        3,
        SamplingParams(max_new_tokens=6),
        stop_token_ids(model, tok),
        seed=0,
        pad_id=tok.pad_token_id,
        backend=mixed,
    )
    return model, tok, roll, mixed


def _check_mixed(device):
    model, tok, roll, mixed = _mixed_rollout(device)
    seen = []
    model.lm_head.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    batch = collate(roll.prompt_ids, roll.completion_ids, tok.pad_token_id, device)
    logp, _ = token_logprobs(model, batch, backend=mixed)  # (b, C)
    assert seen and set(seen) == {torch.bfloat16}  # the matmuls ran in bf16 ...
    assert all(p.dtype == torch.float32 for p in model.parameters())  # ... on fp32 weights
    assert logp.dtype == torch.float32  # log-softmax in fp32
    # the sampler's recorded log-probs are the learner's, up to bf16 rounding of different batch shapes
    for i, lp in enumerate(roll.logprobs):
        assert torch.allclose(logp[i, : len(lp)].detach().cpu(), lp, atol=0.1)
    (logp * batch.loss_mask).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    # outside the backend's forward the model is the plain fp32 model
    with torch.no_grad():
        assert model(input_ids=batch.completion_ids).logits.dtype == torch.float32
    with torch.no_grad(), mixed.forward(model):
        assert model(input_ids=batch.completion_ids).logits.dtype == torch.bfloat16


def test_bf16_mixed_runs_bf16_matmuls_on_fp32_weights_cpu():
    _check_mixed(torch.device("cpu"))


def _letter_a(prompt, completion, **_):
    return completion.count("a") / max(len(completion), 1)


def _train_two_steps(tmp_path, device: str, dtype: str):
    task = Task("letter-a", train=[Example(f"q{i}") for i in range(8)], eval=[Example("e0")], reward=_letter_a)
    cfg = GRPOConfig(
        model="tiny",
        steps=2,
        prompts_per_step=2,
        samples_per_prompt=4,
        max_new_tokens=6,
        device=device,
        dtype=dtype,
        eval_every=2,
        lr=1e-3,
        out_dir=str(tmp_path / "run"),
    )
    return train(cfg, task)


def test_grpo_runs_in_bf16_mixed_on_cpu(tmp_path):
    result = _train_two_steps(tmp_path, "cpu", "bf16-mixed")
    assert result["steps"] == 2 and "eval/greedy_acc" in result["after"]


@cuda
@pytest.mark.gpu
def test_bf16_mixed_on_gpu():
    _check_mixed(torch.device("cuda"))


@cuda
@pytest.mark.gpu
def test_grpo_on_gpu_defaults_to_bf16_mixed(tmp_path, capsys):
    result = _train_two_steps(tmp_path, "cuda", "auto")
    assert "cuda" in capsys.readouterr().out and result["steps"] == 2
    assert resolve_precision("auto", torch.device("cuda")) == (torch.float32, torch.bfloat16)


def test_cuda_request_without_a_gpu_fails_clearly():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cfg = GRPOConfig(model="tiny", device="cuda")
    task = Task("t", train=[Example("q")], eval=[Example("e")], reward=_letter_a)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        train(cfg, task)

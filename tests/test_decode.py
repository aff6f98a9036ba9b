"""The CPU decode step (nanorl/backends/decode.py, cpu_decode.cpp) against plain PyTorch and the model's own forward."""

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nanorl.backends import Backend, decode
from nanorl.logprobs import cache_kwarg
from nanorl.models import stop_token_ids, tiny_model_and_tokenizer
from nanorl.sampling import ModelStep, SamplingParams, generate, left_pad

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None,
    reason="no C++ compiler: the sampler uses the model's forward",
)


@pytest.fixture(scope="module")
def ops():
    assert decode.kernels(), "a compiler is on PATH, so the kernels must build"
    return torch.ops.nanorl_cpu


def _rotate(x, cos, sin):  # HF's rotate-half rotary
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


def test_silu_mul_and_rms_norm_match_their_formulas(ops):
    g = torch.Generator().manual_seed(0)
    gu = torch.randn(5, 2 * 37, generator=g) * 20  # large |x|: exp's clamping and both tails
    gu[0, 0], gu[0, 1] = -200.0, 200.0
    ref = F.silu(gu[:, :37].double()) * gu[:, 37:].double()
    assert torch.allclose(ops.silu_mul(gu).double(), ref, rtol=1e-6, atol=1e-30)
    x, w = torch.randn(7, 45, generator=g), torch.randn(45, generator=g)  # 45: not a multiple of the vector width
    ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.allclose(ops.rms_norm(x, w, 1e-5), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("d,heads,kv_heads", [(16, 4, 2), (24, 6, 2), (8, 3, 3)])
def test_decode_attention_matches_sdpa_over_prompt_and_completion(ops, d, heads, kv_heads):
    g = torch.Generator().manual_seed(d)
    P, n, Lp, C, t, L = 3, 2, 7, 5, 3, decode.LANES
    N = P * n
    start = torch.tensor([0, 4, 2])  # left padding of each prompt
    kp, vp = torch.randn(P, kv_heads, Lp, d, generator=g), torch.randn(P, kv_heads, Lp, d, generator=g)
    kc, vc = torch.zeros(N, kv_heads, C, d), torch.zeros(N, kv_heads, C, d)
    kc[:, :, :t] = torch.randn(N, kv_heads, t, d, generator=g)
    vc[:, :, :t] = torch.randn(N, kv_heads, t, d, generator=g)
    rows = torch.tensor([0, 2, 3, 5])  # rows 1 and 4 finished
    qkv = torch.randn(len(rows), (heads + 2 * kv_heads) * d, generator=g)
    angle = torch.rand(len(rows), d // 2, generator=g) * 6
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)  # (A, d)
    kct = F.pad(kc.transpose(-1, -2), (0, L)).contiguous()  # the kernel's layouts
    vct = vc.clone()
    out = ops.decode_attention(
        qkv, cos, sin, F.pad(kp.transpose(-1, -2), (0, L)).contiguous(), vp, kct, vct, rows, start, n, t, heads, 0.3
    )
    q, k, v = qkv.view(len(rows), -1, d).split([heads, kv_heads, kv_heads], 1)  # (A, heads, d) ...
    q, k = _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None])
    for i, row in enumerate(rows.tolist()):
        p = row // n
        assert torch.allclose(kct[row, :, :, t], k[i], atol=1e-6) and torch.equal(vct[row, :, t], v[i])
        keys = torch.cat([kp[p, :, start[p] :], kc[row, :, :t], k[i][:, None]], 1)  # (kv_heads, Lk, d)
        values = torch.cat([vp[p, :, start[p] :], vc[row, :, :t], v[i][:, None]], 1)
        ref = F.scaled_dot_product_attention(
            q[i][:, None],
            keys.repeat_interleave(heads // kv_heads, 0),
            values.repeat_interleave(heads // kv_heads, 0),
            scale=0.3,
        )
        assert torch.allclose(out[i].view(heads, d), ref[:, 0], atol=2e-6)
    untouched = [r for r in range(N) if r not in rows.tolist()]
    assert not kct[untouched, :, :, t].any() and not vct[untouched, :, t].any()


def _llama_with_biases():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    cfg = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=256,
        attention_bias=True,
        mlp_bias=True,
    )
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # random biases (they start at zero)
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.1)
    return model


def _qwen2_tiny():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen2Config(
        vocab_size=99,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(cfg).float()  # biases on query, key and value


def _qwen3_tiny():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(2)
    cfg = Qwen3Config(
        vocab_size=99,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    model = Qwen3ForCausalLM(cfg).float()  # head_dim 16: heads * d = 64, not the hidden size 48
    with torch.no_grad():  # the query / key norms' weights start at 1: make them count
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 2.0), layer.self_attn.k_norm.weight.uniform_(0.5, 2.0)
    return model


@pytest.mark.parametrize("arch", ["llama", "llama_biases", "qwen2", "qwen3"])
def test_decoder_logits_match_the_models_own_forward(ops, arch):
    model = {
        "llama": lambda: tiny_model_and_tokenizer()[0],
        "llama_biases": _llama_with_biases,
        "qwen2": _qwen2_tiny,
        "qwen3": _qwen3_tiny,
    }[arch]()
    assert decode.supported(model)
    with torch.no_grad():  # sharper attention than a random init's near-uniform one, so its errors show
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(15), layer.self_attn.k_proj.weight.mul_(15)
            if arch == "qwen3":  # its norms undo the scale of q and k: sharpen through their weights instead
                layer.self_attn.q_norm.weight.mul_(4), layer.self_attn.k_norm.weight.mul_(4)
    g = torch.Generator().manual_seed(0)
    V, n, steps = model.config.vocab_size, 3, 6
    prompts = [torch.randint(3, V, (k,), generator=g).tolist() for k in (5, 9, 2)]  # left padding of 4 and 7
    with torch.no_grad(), Backend().forward(model, pack_weights=True) as packed:
        ids, mask = left_pad(prompts, 0, "cpu")
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        runs = []
        for lean in (True, False):
            from transformers import DynamicCache

            cache = DynamicCache()
            model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,
                **{cache_kwarg(model): cache},
            )
            runs.append(
                decode.cpu_decoder(model, packed, cache, mask, n, steps) if lean else ModelStep(model, cache, mask, n)
            )
        assert isinstance(runs[0], decode.LlamaDecoder)
        rows, positions = torch.arange(len(prompts) * n), pos[:, -1].repeat_interleave(n) + 1
        for t in range(steps):
            if t == 2:  # two rows finish
                keep = torch.tensor([0, 2, 3, 4, 6, 7, 8])
                rows, positions = rows[keep], positions[keep]
            tokens = torch.randint(3, V, (len(rows),), generator=g)
            fast, ref = (step(tokens, rows, positions, t) for step in runs)
            assert torch.allclose(fast, ref, rtol=1e-5, atol=1e-5), (t, (fast - ref).abs().max())
            positions = positions + 1


def test_rollouts_of_both_steps_have_the_models_logprobs(ops, tiny):
    from nanorl.data import collate
    from nanorl.logprobs import token_logprobs

    model, tok = tiny
    prompts = [tok("hi")["input_ids"], tok("a longer prompt")["input_ids"]]
    for lean in (True, False):
        out = generate(
            model,
            prompts,
            4,
            SamplingParams(max_new_tokens=9),
            stop_token_ids(model, tok),
            seed=2,
            pad_id=tok.pad_token_id,
            lean=lean,
        )
        ref, _ = token_logprobs(model, collate(out.prompt_ids, out.completion_ids, tok.pad_token_id, "cpu"))
        for i, lp in enumerate(out.logprobs):
            assert torch.allclose(ref[i, : len(lp)], lp, atol=1e-5)


def test_a_build_lock_left_by_a_killed_process_does_not_hang_the_next_run(ops, tmp_path):
    """torch's build lock is a file: a run killed while it held it (building, or checking the build at start) left
    it behind, and every later run waited on it forever. A finished build beside such a lock still loads."""
    env = {**os.environ, "NANORL_CACHE": str(tmp_path)}
    code = "from nanorl.backends import decode; print(decode.{}())"
    build = Path(
        subprocess.check_output([sys.executable, "-c", code.format("build_folder")], env=env, text=True).strip()
    )
    shutil.copytree(decode.build_folder(), build)  # this process's build (the ops fixture)
    (build / "lock").touch()
    out = subprocess.run(
        [sys.executable, "-c", code.format("kernels")], env=env, capture_output=True, text=True, timeout=180
    )
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_other_models_and_settings_fall_back_to_the_models_forward(tiny):
    model, tok = tiny
    assert decode.supported(model)
    model.config.rope_parameters = {**model.config.rope_parameters, "rope_type": "dynamic", "factor": 2.0}
    dynamic = type(model)(model.config)  # cos/sin would depend on the sequence length
    assert not decode.supported(dynamic)
    assert not decode.supported(tiny_model_and_tokenizer()[0].to(torch.bfloat16))
    with Backend().forward(model) as packed:  # not packed for sampling: nothing to decode with
        assert packed == {} and decode.cpu_decoder(model, packed, None, None, 2, 4) is None
    out = generate(
        dynamic, [tok("hi")["input_ids"]], 2, SamplingParams(max_new_tokens=3), [], seed=0, pad_id=tok.pad_token_id
    )
    assert all(len(c) == 3 for c in out.completion_ids) and math.isfinite(float(out.logprobs[0].sum()))


def test_a_lora_model_decodes_on_folded_weights_with_the_learners_logprobs(ops):
    """peft's LoRA linears, with adapters that change the function: the sampler packs W + (alpha / r) B A once per
    rollout and takes the decode step (it stepped aside for peft before); its log-probs are the learner's, which
    runs the adapters unfolded. Outside the sampler every forward is peft's own again."""
    peft = pytest.importorskip("peft")
    from nanorl.data import collate
    from nanorl.logprobs import token_logprobs

    base, tok = tiny_model_and_tokenizer()
    model = peft.get_peft_model(
        base, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    )  # random A and B
    lora = [
        m for m in model.modules() if type(m).__module__.startswith("peft.tuners.lora") and hasattr(m, "base_layer")
    ]
    prompts = [tok("hi")["input_ids"], tok("a longer prompt")["input_ids"]]
    with torch.no_grad(), Backend().forward(model, pack_weights=True) as packed:
        assert lora and all(id(m) in packed for m in lora)
        ids, mask = left_pad(prompts, tok.pad_token_id, "cpu")
        from transformers import DynamicCache

        cache = DynamicCache()
        model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})
        assert isinstance(decode.cpu_decoder(model, packed, cache, mask, 2, 4), decode.LlamaDecoder)
    assert not any("forward" in vars(m) for m in model.modules())  # peft's forwards again
    out = generate(
        model, prompts, 4, SamplingParams(max_new_tokens=9), stop_token_ids(model, tok), seed=2, pad_id=tok.pad_token_id
    )
    ref, _ = token_logprobs(model, collate(out.prompt_ids, out.completion_ids, tok.pad_token_id, "cpu"))
    for i, lp in enumerate(out.logprobs):
        assert torch.allclose(ref[i, : len(lp)], lp, atol=1e-5)
    with model.disable_adapter(), torch.no_grad():  # the adapters matter: the base model's log-probs differ
        plain, _ = token_logprobs(model, collate(out.prompt_ids, out.completion_ids, tok.pad_token_id, "cpu"))
    assert not torch.allclose(plain, ref, atol=1e-3)

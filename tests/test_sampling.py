import torch

from nanorl.data import collate
from nanorl.logprobs import token_logprobs
from nanorl.models import stop_token_ids
from nanorl.sampling import SamplingParams, generate, inverse_cdf, sample_token
from nanorl.seeds import derive_seed


def _prompts(tok):
    return [tok("hi")["input_ids"], tok("a longer prompt")["input_ids"], tok("x")["input_ids"]]


def test_deterministic_for_a_seed(tiny):
    model, tok = tiny
    p = SamplingParams(max_new_tokens=12)
    a = generate(model, _prompts(tok), 4, p, stop_token_ids(model, tok), seed=3, pad_id=tok.pad_token_id)
    b = generate(model, _prompts(tok), 4, p, stop_token_ids(model, tok), seed=3, pad_id=tok.pad_token_id)
    c = generate(model, _prompts(tok), 4, p, stop_token_ids(model, tok), seed=4, pad_id=tok.pad_token_id)
    assert a.completion_ids == b.completion_ids
    assert a.completion_ids != c.completion_ids
    assert len(a.completion_ids) == 12 and a.prompt_ids[4] == _prompts(tok)[1]


def test_greedy_is_seed_independent(tiny):
    model, tok = tiny
    p = SamplingParams(max_new_tokens=8, temperature=0.0)
    a = generate(model, _prompts(tok), 2, p, [], seed=1, pad_id=tok.pad_token_id)
    b = generate(model, _prompts(tok), 2, p, [], seed=2, pad_id=tok.pad_token_id)
    assert a.completion_ids == b.completion_ids


def test_respects_max_new_tokens_and_stops_at_every_stop_id(tiny):
    model, tok = tiny
    p = SamplingParams(max_new_tokens=7)
    out = generate(model, _prompts(tok), 8, p, [], seed=0, pad_id=tok.pad_token_id)
    assert all(len(c) == 7 for c in out.completion_ids) and all(out.truncated)
    # make two tokens overwhelmingly likely, then declare both stop ids: every row ends after one token
    stops = [tok.convert_tokens_to_ids("a"), tok.eos_token_id]
    with torch.no_grad():
        bias = torch.full((model.config.vocab_size,), -30.0)
        bias[stops] = 30.0
        model.lm_head.bias = torch.nn.Parameter(bias)
    out = generate(model, _prompts(tok), 8, SamplingParams(max_new_tokens=20), stops, seed=0, pad_id=tok.pad_token_id)
    assert all(len(c) == 1 and c[0] in stops for c in out.completion_ids)
    assert not any(out.truncated)
    assert {c[0] for c in out.completion_ids} == set(stops)


def test_sampler_logprobs_equal_model_logprobs(tiny):
    model, tok = tiny
    for temperature in (1.0, 0.7):
        out = generate(
            model,
            _prompts(tok),
            3,
            SamplingParams(max_new_tokens=10, temperature=temperature),
            stop_token_ids(model, tok),
            seed=5,
            pad_id=tok.pad_token_id,
        )
        batch = collate(out.prompt_ids, out.completion_ids, tok.pad_token_id, "cpu")
        ref, _ = token_logprobs(model, batch, temperature)
        for i, lp in enumerate(out.logprobs):
            assert torch.allclose(ref[i, : len(lp)], lp, atol=1e-4)


def test_generation_config_defaults_do_not_change_sampling(tiny):
    model, tok = tiny
    p = SamplingParams(max_new_tokens=10)
    a = generate(model, _prompts(tok), 4, p, [], seed=9, pad_id=tok.pad_token_id)
    model.generation_config.top_k = 2
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.temperature = 0.1
    b = generate(model, _prompts(tok), 4, p, [], seed=9, pad_id=tok.pad_token_id)
    assert a.completion_ids == b.completion_ids


def test_top_k_and_top_p_truncate_sampling_not_logprobs():
    logits = torch.tensor([[3.0, 2.0, 1.0, -5.0]])
    gen = torch.Generator().manual_seed(0)
    u = lambda: torch.rand(1, 1, generator=gen)  # noqa: E731  one uniform per row
    seen = {sample_token(logits, SamplingParams(top_k=2), u())[0].item() for _ in range(200)}
    assert seen == {0, 1}
    probs = torch.softmax(logits, -1)[0]  # 0.665, 0.245, 0.090, 0.0002
    seen = {sample_token(logits, SamplingParams(top_p=0.8), u())[0].item() for _ in range(200)}
    assert seen == {0, 1}  # smallest prefix with mass >= 0.8 is {0, 1}
    token, lp = sample_token(logits, SamplingParams(top_k=1), u())
    assert token.item() == 0 and torch.allclose(lp, probs[0].log().unsqueeze(0))


def test_sampled_frequencies_match_the_policy():
    # 40,000 draws from known logits at temperature 2 (and renormalised after top-k): every frequency
    # within 5 standard errors of its probability, and a zero-probability token never drawn
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -30.0]).repeat(40_000, 1)
    gen = torch.Generator().manual_seed(0)
    for params, probs in (
        (SamplingParams(temperature=2.0), torch.softmax(logits[0] / 2, -1)),
        (SamplingParams(top_k=2), torch.softmax(logits[0, :2], -1)),
    ):
        token, lp = sample_token(logits, params, torch.rand(len(logits), 1, generator=gen))
        freq = torch.bincount(token, minlength=5)[: len(probs)].double() / len(token)
        stderr = (probs * (1 - probs) / len(token)).sqrt()
        assert ((freq - probs).abs() <= 5 * stderr + 1e-12).all(), (freq, probs)
        assert token.max() < len(probs)
        expected = torch.log_softmax(logits[0] / params.temperature, -1)[token]  # the policy's, untruncated
        assert torch.allclose(lp, expected)


def test_inverse_cdf_matches_a_single_running_sum_and_skips_zero_weights():
    # the two-level draw picks what one cumsum over the whole row picks, for a vocabulary that is not a
    # multiple of the block and rows with zeroed (top-k / top-p) entries; u at its largest value never
    # lands on a zero weight or past the vocabulary
    gen = torch.Generator().manual_seed(0)
    w = torch.rand(64, 1000, generator=gen) ** 4
    w[w < 0.3] = 0.0  # ~74% zeros, whole blocks among them in some rows
    w[:4, 700:] = 0.0  # zero tails
    w[4, :] = 0.0
    w[4, 3] = 1.0  # one token
    u = torch.rand(64, 1, generator=gen)
    ref = torch.searchsorted(w.double().cumsum(-1), u.double() * w.double().sum(-1, keepdim=True), right=True)
    for block in (256, 7, 1000, 4096):
        assert torch.equal(inverse_cdf(w, u, block), ref.squeeze(-1))
        top = inverse_cdf(w, torch.full((64, 1), 1 - 2**-24), block)
        assert (top < 1000).all() and (w.gather(-1, top[:, None]) > 0).all()
        assert (top[:4] < 700).all() and top[4] == 3


def test_a_prompts_samples_do_not_depend_on_its_batch(tiny):
    # per-prompt seeds: the last two prompts sampled alone draw what they drew among four (what lets torchrun ranks
    # sample their share of a step's prompts and get the single-process batch); an int seed = derive_seed per prompt
    model, tok = tiny
    prompts, p = _prompts(tok) + [tok("more words")["input_ids"]], SamplingParams(max_new_tokens=8)
    seeds = [11, 12, 13, 14]
    both = generate(model, prompts, 3, p, [], seed=seeds, pad_id=tok.pad_token_id)
    half = generate(model, prompts[2:], 3, p, [], seed=seeds[2:], pad_id=tok.pad_token_id)
    assert half.completion_ids == both.completion_ids[6:]
    assert (
        generate(model, prompts, 3, p, [], seed=5, pad_id=tok.pad_token_id).completion_ids
        == generate(
            model,
            prompts,
            3,
            p,
            [],
            seed=[derive_seed(5, i, "prompt") for i in range(len(prompts))],
            pad_id=tok.pad_token_id,
        ).completion_ids
    )


def test_min_p_then_top_k_then_top_p_of_what_is_left_as_vllm_and_transformers_truncate():
    """min-p keeps the tokens with at least min_p x the top token's probability (arXiv 2407.01082); top-p counts the
    mass of what min-p and top-k left (renormalised), as vLLM's sampler and transformers' warpers do: with top_k 2 and
    top_p 0.5 on probabilities (0.4, 0.3, 0.2, 0.1) only the first token is left (0.4 / 0.7 >= 0.5). The log-prob is the
    untruncated policy's, as for top-k and top-p; vLLM gets the same min_p."""
    from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from nanorl.integrations.vllm import requests_of

    gen = torch.Generator().manual_seed(0)
    u = lambda: torch.rand(1, 1, generator=gen)  # noqa: E731
    logits = torch.tensor([[3.0, 2.0, 1.0, -5.0]])  # probabilities 0.665, 0.245, 0.090, 0.0002
    for min_p, kept in ((0.2, {0, 1}), (0.1, {0, 1, 2}), (0.0, {0, 1, 2, 3})):
        seen = {sample_token(logits, SamplingParams(min_p=min_p), u())[0].item() for _ in range(3000)}
        assert seen == kept, (min_p, seen)
        hf = MinPLogitsWarper(min_p) if min_p else (lambda ids, x: x)
        assert set(torch.isfinite(hf(None, logits.clone())[0]).nonzero().flatten().tolist()) == kept
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    for params in (SamplingParams(top_k=2, top_p=0.5), SamplingParams(top_k=3, top_p=0.7), SamplingParams(top_p=0.7)):
        seen = {sample_token(logits, params, u())[0].item() for _ in range(2000)}
        hf = TopPLogitsWarper(params.top_p)(None, TopKLogitsWarper(params.top_k or 4)(None, logits.clone()))
        assert seen == set(torch.isfinite(hf[0]).nonzero().flatten().tolist()), (params, seen)
    assert {sample_token(logits, SamplingParams(top_k=2, top_p=0.5), u())[0].item() for _ in range(500)} == {0}
    token, lp = sample_token(logits, SamplingParams(min_p=0.9), u())
    assert token.item() == 0 and torch.allclose(lp, torch.log(torch.tensor([0.4])))
    assert requests_of([[1, 2]], 2, SamplingParams(min_p=0.05), 0, [0])[1][1]["min_p"] == 0.05


def test_repetition_penalty_samples_as_transformers_and_vllm_and_logs_the_policy(tiny):
    """CTRL's repetition penalty (TRL's repetition_penalty): the logit of a token already in the row's prompt or
    completion is divided by it when positive, multiplied when negative, before the temperature. Greedy decoding
    with it picks what transformers' generate picks, token for token (both backends); sampled draws follow
    softmax(penalised logits / T); the log-prob is the policy's (unpenalised), as for top-k / top-p."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    from nanorl.backends import select_backend
    from nanorl.integrations.vllm import requests_of

    model, tok = tiny
    logits = torch.tensor([[2.0, 1.0, -1.0, 0.5]]).repeat(40_000, 1)
    seen = torch.tensor([[True, False, True, False]]).repeat(40_000, 1)
    params = SamplingParams(temperature=2.0, repetition_penalty=2.0)
    hf = RepetitionPenaltyLogitsProcessor(2.0)(torch.tensor([[0, 2]]), logits[:1].clone())[0]  # (1.0, 1.0, -2.0, 0.5)
    token, lp = sample_token(
        logits, params, torch.rand(len(logits), 1, generator=torch.Generator().manual_seed(0)), seen
    )
    probs = torch.softmax(hf / 2.0, -1)
    freq = torch.bincount(token, minlength=4).double() / len(token)
    assert ((freq - probs).abs() <= 5 * (probs * (1 - probs) / len(token)).sqrt()).all(), (freq, probs)
    assert torch.allclose(lp, torch.log_softmax(logits[0] / 2.0, -1)[token])  # the policy's log-prob
    greedy = SamplingParams(temperature=0, repetition_penalty=2.0)
    assert sample_token(torch.tensor([[2.0, 1.5, -1.0, 0.5]]), greedy, None, seen[:1])[0] == 1  # 2 / 2 < 1.5

    prompts = _prompts(tok)
    for name in ("auto", "torch"):
        backend = select_backend(name, "float32", torch.device("cpu"))[0]
        p = SamplingParams(max_new_tokens=12, temperature=0.0, repetition_penalty=1.5)
        ours = generate(model, prompts, 1, p, [], seed=0, pad_id=tok.pad_token_id, backend=backend).completion_ids
        for prompt, row in zip(prompts, ours):
            ids = torch.tensor([prompt])
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, repetition_penalty=1.5,
                max_new_tokens=12, min_new_tokens=12, pad_token_id=tok.pad_token_id, eos_token_id=None,
            )  # fmt: skip
            assert row == out[0, len(prompt) :].tolist(), name
    plain = generate(model, prompts, 1, SamplingParams(12, 0.0), [], seed=0, pad_id=tok.pad_token_id)
    assert plain.completion_ids != ours  # the penalty changed what greedy decoding picks
    assert requests_of([[1, 2]], 1, SamplingParams(repetition_penalty=1.3), 0, [0])[0][1]["repetition_penalty"] == 1.3

"""agents/prefixes.py: while episodes run, LocalSampler prefills only the tokens a prompt adds to one it prefilled in
its last call; what it samples, and the log-probs, are those of the full prefill (to float rounding)."""

import pytest
import torch

from nanorl.agents.prefixes import reuse_prefixes
from nanorl.hub import tiny_model_and_tokenizer
from nanorl.sampling import LocalSampler, SamplingParams, prefill_prompts


@pytest.mark.parametrize("backend", ["auto", "torch"])  # backends/decode.py's step reads the cache it builds
def test_a_longer_prompt_reads_only_its_new_tokens_and_samples_as_a_full_prefill(backend, monkeypatch):
    monkeypatch.setenv("NANORL_BACKEND", backend)
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer()
    model.eval()
    read = []  # tokens each prefill reads (decode steps read one a row)

    def count(_module, _args, kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            read.append(kwargs["input_ids"].numel())

    model.register_forward_pre_hook(count, with_kwargs=True)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 60, (n,), generator=g).tolist() for n in (20, 35, 50)]
    fresh = torch.randint(3, 60, (30,), generator=g).tolist()

    def turns(reuse: bool):
        sampler = LocalSampler(model, [tok.eos_token_id], tok.pad_token_id)
        read.clear()
        with reuse_prefixes(sampler) if reuse else torch.no_grad():
            first = sampler.generate(prompts, 2, SamplingParams(12, temperature=0), 5)  # groups share a prompt
            longer = [first.prompt_ids[i] + first.completion_ids[i] + [7, 8, 9][: i % 3 + 1] for i in (0, 1, 3, 5)]
            longer += [fresh, list(prompts[2])]  # nothing kept; all kept (its last token is read again)
            second = sampler.generate(longer, 1, SamplingParams(12), [1, 2, 3, 4, 5, 6])
        assert sampler.prefill is prefill_prompts  # the plain prefill again after the block
        return first, second, list(read)

    full, full2, full_read = turns(False)
    kept, kept2, kept_read = turns(True)
    assert kept.completion_ids == full.completion_ids and kept2.completion_ids == full2.completion_ids
    for a, b in zip(full2.logprobs, kept2.logprobs):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    n = max(len(p) for p in longer_parts(full, fresh, prompts))  # the longest part not kept: the fresh prompt's 30
    assert full_read == [3 * 50, 6 * max(len(p) for p in full2.prompt_ids)]
    assert kept_read == [3 * 50, 6 * n] and kept_read[1] < full_read[1]


def longer_parts(first, fresh, prompts):
    """What each second-turn prompt adds to the prompt it extends."""
    return [first.completion_ids[i] + [7, 8, 9][: i % 3 + 1] for i in (0, 1, 3, 5)] + [fresh, prompts[2][-1:]]


def test_the_same_prompt_for_many_episodes_is_read_once():
    """An environment's episodes each have a prompt, often the same one: each distinct prompt is prefilled once."""
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer()
    model.eval()
    read = []
    model.register_forward_pre_hook(lambda _m, _a, kw: read.append(kw["input_ids"].shape), with_kwargs=True)
    a, b = list(range(5, 25)), list(range(30, 45))
    prompts, seeds = [a, b, a, a, b], [1, 2, 3, 4, 5]
    plain = LocalSampler(model, [tok.eos_token_id], tok.pad_token_id).generate(prompts, 1, SamplingParams(10), seeds)
    read.clear()
    sampler = LocalSampler(model, [tok.eos_token_id], tok.pad_token_id)
    with reuse_prefixes(sampler):
        once = sampler.generate(prompts, 1, SamplingParams(10), seeds)
    assert read[0] == (2, 20) and once.completion_ids == plain.completion_ids
    for x, y in zip(plain.logprobs, once.logprobs):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=0)


def test_another_sampler_is_left_as_it_is():
    class Engine:  # e.g. an inference server: its own caching
        def generate(self, prompts, group_size, params, seed):
            raise AssertionError("not called")

    engine = Engine()
    with reuse_prefixes(engine):
        assert not hasattr(engine, "prefill")

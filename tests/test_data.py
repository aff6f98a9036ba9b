import torch
import torch.nn.functional as F

from nanorl.data import collate, render_prompt
from nanorl.logprobs import token_logprobs


def test_masks_cover_completion_only_and_train_on_eos_equal_to_pad(tiny):
    _, tok = tiny
    eos = tok.eos_token_id
    assert tok.pad_token_id == eos  # the case that breaks pad-id comparisons
    prompts = [[5, 6, 7], [8], [5, 6, 7]]
    comps = [[9, eos], [eos, 10, 11, eos], [12]]  # eos inside and at the end
    old = [torch.tensor([1.0, 2]), torch.tensor([3.0, 4, 5, 6]), torch.tensor([7.0])]
    b = collate(prompts, comps, tok.pad_token_id, "cpu", {"old": old})
    assert b.prompt_ids.tolist() == [[5, 6, 7], [eos, eos, 8]]  # identical prompts stored once
    assert b.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert b.prompt_index.tolist() == [0, 1, 0]
    assert b.completion_ids.tolist() == [[9, eos, eos, eos], [eos, 10, 11, eos], [12, eos, eos, eos]]
    # both eos of row 1 are trained on; the pads (also eos ids) are not; prompts are never in the mask
    assert b.loss_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert b.extra["old"].tolist() == [[1, 2, 0, 0], [3, 4, 5, 6], [7, 0, 0, 0]]


def _plain_logprobs(model, prompt, comp):
    """The straightforward reference: one unpadded forward over prompt + completion."""
    ids = torch.tensor([prompt + comp])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return F.log_softmax(logits.float(), -1).gather(-1, torch.tensor(comp)[:, None]).squeeze(-1)


def test_shared_prompt_logprobs_and_gradients_match_plain_forward(tiny):
    model, tok = tiny
    eos = tok.eos_token_id
    prompts = [tok("hello")["input_ids"], tok("hello")["input_ids"], tok("hi there, friend")["input_ids"]]
    comps = [[10, 11, 12, eos], [13], [14, 15, eos, 16, 17]]
    b = collate(prompts, comps, tok.pad_token_id, "cpu")
    logp, entropy = token_logprobs(model, b, with_entropy=True)
    (logp * b.loss_mask).sum().backward()
    fast = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total = 0
    for i, (p, c) in enumerate(zip(prompts, comps)):
        ref = _plain_logprobs(model, p, c)
        assert torch.allclose(logp[i, : len(c)], ref, atol=1e-5)
        total = total + ref.sum()
    total.backward()
    for g_fast, p in zip(fast, model.parameters()):
        assert torch.allclose(g_fast, p.grad, atol=1e-5, rtol=1e-4)
    assert (entropy[b.loss_mask.bool()] > 0).all()


def test_render_prompt_uses_chat_template(tiny):
    _, tok = tiny
    ids = render_prompt(tok, "What is 1 + 1?", system_prompt="Be brief.")
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")
    assert render_prompt(tok, [{"role": "user", "content": "hey"}]) == render_prompt(tok, "hey")

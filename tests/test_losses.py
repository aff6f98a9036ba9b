import math

import torch

from nanorl.losses import kl_k3, policy_loss, token_sum


def _loss_and_grad(logp_val, old_val, adv, eps=0.2):
    logp = torch.tensor([[logp_val]], requires_grad=True)
    loss, st = policy_loss(logp, torch.tensor([[old_val]]), torch.tensor([[adv]]), eps)
    loss.sum().backward()
    return loss.item(), logp.grad.item(), st


def test_on_policy_ratio_is_exactly_one_and_gradient_is_reinforce():
    logp = torch.tensor([[-1.3, -0.2, -2.5]], requires_grad=True)
    adv = torch.tensor([[0.7]])
    loss, st = policy_loss(logp, logp.detach(), adv, 0.2)
    assert torch.equal(st["ratio"], torch.ones(1, 3))
    assert st["clipped"].sum() == 0
    loss.sum().backward()
    # at ratio 1 the clipped surrogate's gradient is REINFORCE's: d(-A * logp)/dlogp = -A
    assert torch.allclose(logp.grad, torch.full((1, 3), -0.7))


def test_clipping_only_outside_range_and_only_in_advantage_direction():
    eps = 0.2
    old = 0.0
    up, down, inside = math.log(1.5), math.log(0.5), math.log(1.1)
    # A > 0: ratio above 1 + eps is clipped (zero grad); below 1 - eps is not clipped
    loss, grad, st = _loss_and_grad(up, old, 1.0, eps)
    assert grad == 0.0 and st["clipped"].item() == 1.0 and abs(loss - (-1.2)) < 1e-6
    loss, grad, st = _loss_and_grad(down, old, 1.0, eps)
    assert abs(grad - (-0.5)) < 1e-6 and st["clipped"].item() == 0.0 and abs(loss - (-0.5)) < 1e-6
    # A < 0: ratio below 1 - eps is clipped; above 1 + eps is not
    loss, grad, st = _loss_and_grad(down, old, -1.0, eps)
    assert grad == 0.0 and st["clipped"].item() == 1.0 and abs(loss - 0.8) < 1e-6
    loss, grad, st = _loss_and_grad(up, old, -1.0, eps)
    assert abs(grad - 1.5) < 1e-6 and st["clipped"].item() == 0.0 and abs(loss - 1.5) < 1e-6
    # inside the range nothing is clipped for either sign: grad = -A * ratio
    for a in (1.0, -1.0):
        loss, grad, st = _loss_and_grad(inside, old, a, eps)
        assert abs(grad - (-a * 1.1)) < 1e-6 and st["clipped"].item() == 0.0


def test_k3_nonnegative_zero_at_equality_and_matches_definition():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(100, generator=g) * 5
    ref = -torch.rand(100, generator=g) * 5
    k3 = kl_k3(logp, ref)
    assert (k3 >= 0).all()
    assert torch.allclose(k3, torch.exp(ref - logp) - (ref - logp) - 1)
    assert torch.equal(kl_k3(logp, logp), torch.zeros(100))
    # clamped: an extreme log-ratio stays finite
    assert torch.isfinite(kl_k3(torch.tensor([-1000.0]), torch.tensor([0.0]))).all()


def test_token_sum_uses_global_normaliser():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert abs(token_sum(x, mask, 10).item() - (1 + 2 + 4) / 10) < 1e-6

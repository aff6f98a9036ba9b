import math

import pytest
import torch

from nanorl.losses import kl_penalty, loss_weights, policy_loss

ONE = torch.ones(1, 1)


def _loss_and_grad(logp_val, old_val, adv, low=0.2, high=0.2):
    logp = torch.tensor([[logp_val]], requires_grad=True)
    loss, st = policy_loss(logp, torch.tensor([[old_val]]), torch.tensor([[adv]]), ONE, low, high)
    loss.sum().backward()
    return loss.item(), logp.grad.item(), st


def test_on_policy_ratio_is_exactly_one_and_gradient_is_reinforce():
    logp = torch.tensor([[-1.3, -0.2, -2.5]], requires_grad=True)
    adv = torch.tensor([[0.7]])
    loss, st = policy_loss(logp, logp.detach(), adv, torch.ones(1, 3), 0.2, 0.2)
    assert torch.equal(st["ratio"], torch.ones(1, 3))
    assert st["clipped"].sum() == 0
    loss.sum().backward()
    # at ratio 1 the clipped surrogate's gradient is REINFORCE's: d(-A * logp)/dlogp = -A
    assert torch.allclose(logp.grad, torch.full((1, 3), -0.7))


def test_clipping_only_outside_range_and_only_in_advantage_direction():
    old = 0.0
    up, down, inside = math.log(1.5), math.log(0.5), math.log(1.1)
    # A > 0: ratio above 1 + eps is clipped (zero grad); below 1 - eps is not clipped
    loss, grad, st = _loss_and_grad(up, old, 1.0)
    assert grad == 0.0 and st["clipped"].item() == 1.0 and abs(loss - (-1.2)) < 1e-6
    loss, grad, st = _loss_and_grad(down, old, 1.0)
    assert abs(grad - (-0.5)) < 1e-6 and st["clipped"].item() == 0.0 and abs(loss - (-0.5)) < 1e-6
    # A < 0: ratio below 1 - eps is clipped; above 1 + eps is not
    loss, grad, st = _loss_and_grad(down, old, -1.0)
    assert grad == 0.0 and st["clipped"].item() == 1.0 and abs(loss - 0.8) < 1e-6
    loss, grad, st = _loss_and_grad(up, old, -1.0)
    assert abs(grad - 1.5) < 1e-6 and st["clipped"].item() == 0.0 and abs(loss - 1.5) < 1e-6
    # inside the range nothing is clipped for either sign: grad = -A * ratio
    for a in (1.0, -1.0):
        loss, grad, st = _loss_and_grad(inside, old, a)
        assert abs(grad - (-a * 1.1)) < 1e-6 and st["clipped"].item() == 0.0


def test_dapo_asymmetric_clip_higher():
    # DAPO clip_low 0.2, clip_high 0.28: a ratio of 1.25 is still trained for A > 0 (it would be
    # clipped with a symmetric 0.2), while 1.3 is clipped at 1.28.
    loss, grad, st = _loss_and_grad(math.log(1.25), 0.0, 1.0, 0.2, 0.28)
    assert abs(grad - (-1.25)) < 1e-6 and st["clipped"].item() == 0.0
    _, grad_sym, st_sym = _loss_and_grad(math.log(1.25), 0.0, 1.0, 0.2, 0.2)
    assert grad_sym == 0.0 and st_sym["clipped"].item() == 1.0
    loss, grad, st = _loss_and_grad(math.log(1.3), 0.0, 1.0, 0.2, 0.28)
    assert grad == 0.0 and abs(loss - (-1.28)) < 1e-6
    # the low side still clips at 1 - 0.2 for A < 0
    loss, grad, st = _loss_and_grad(math.log(0.75), 0.0, -1.0, 0.2, 0.28)
    assert grad == 0.0 and abs(loss - 0.8) < 1e-6


def test_gspo_ratio_is_length_normalised_sequence_ratio():
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 5, generator=g) * 3).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    _, st = policy_loss(logp, old, torch.ones(3, 1), mask, 0.5, 0.5, ratio_level="sequence")
    for i in range(3):
        n = int(mask[i].sum())
        s = math.exp(sum(logp[i, t].item() - old[i, t].item() for t in range(n)) / n)  # (pi/pi_old)^(1/|y|)
        assert torch.allclose(st["ratio"][i, :n], torch.full((n,), s), atol=1e-6)
    # the gradient of the sequence surrogate, per token, is -A * s / |y| (GSPO eq. 10)
    loss, st = policy_loss(logp, old, torch.ones(3, 1), mask, 10.0, 10.0, ratio_level="sequence")
    (loss * mask).sum().backward()  # each sequence's loss counted once per token, so grad = -s * n / n
    for i in range(3):
        n = int(mask[i].sum())
        assert torch.allclose(logp.grad[i, :n], -st["ratio"][i, :n], atol=1e-5)
        assert torch.equal(logp.grad[i, n:], torch.zeros(5 - n))


def test_kl_estimators_match_definitions():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(100, generator=g) * 5
    ref = -torch.rand(100, generator=g) * 5
    log_r = ref - logp
    k1, k2, k3 = (kl_penalty(logp, ref, k) for k in ("k1", "k2", "k3"))
    assert torch.allclose(k1, -log_r)
    assert torch.allclose(k2, 0.5 * log_r**2)
    assert torch.allclose(k3, torch.exp(log_r) - log_r - 1, atol=1e-6)
    assert (k2 >= 0).all() and (k3 >= 0).all()
    for k in ("k1", "k2", "k3"):
        assert torch.equal(kl_penalty(logp, logp, k), torch.zeros(100))
        # clamped: an extreme log-ratio stays finite
        assert torch.isfinite(kl_penalty(torch.tensor([-1000.0]), torch.tensor([0.0]), k)).all()


def test_kl_estimators_average_to_true_kl_and_their_gradients():
    # Two categorical distributions; sample from pi, average each estimator over many samples.
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.5, 0.3])
    true_kl = (p * (p / q).log()).sum()
    idx = torch.multinomial(p, 400_000, replacement=True, generator=torch.Generator().manual_seed(0))
    logp, logq = p.log()[idx], q.log()[idx]
    assert abs(kl_penalty(logp, logq, "k1").mean() - true_kl) < 5e-3  # unbiased
    assert abs(kl_penalty(logp, logq, "k3").mean() - true_kl) < 5e-3  # unbiased
    # Gradients with respect to logp of a single token, from the definitions (log r = ref - logp):
    # d k1 / d logp = 1;  d k2 / d logp = -(log r);  d k3 / d logp = 1 - r
    lp = torch.tensor([-1.0], requires_grad=True)
    rf = torch.tensor([-1.5])
    for kind, expect in (("k1", 1.0), ("k2", 0.5), ("k3", 1 - math.exp(-0.5))):
        lp.grad = None
        kl_penalty(lp, rf, kind).sum().backward()
        assert abs(lp.grad.item() - expect) < 1e-6, kind


def test_loss_weights_modes():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # lengths 2 and 1
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    # token: global token count of the minibatch (10 here, e.g. other micro-batches hold the rest)
    assert abs((loss_weights(mask, "token", 10, 4, 3) * x).sum().item() - (1 + 2 + 4) / 10) < 1e-6
    # sequence: mean over each sequence's tokens, then over the minibatch's sequences
    assert abs((loss_weights(mask, "sequence", 10, 4, 3) * x).sum().item() - ((1 + 2) / 2 + 4) / 4) < 1e-6
    # constant (Dr. GRPO): every sequence divided by the same max length
    assert abs((loss_weights(mask, "constant", 10, 4, 3) * x).sum().item() - (1 + 2 + 4) / (3 * 4)) < 1e-6
    # never any weight on padding
    for mode in ("token", "sequence", "constant"):
        assert (loss_weights(mask, mode, 10, 4, 3)[mask == 0] == 0).all()
    # with equal lengths all three agree (up to max_len = length)
    full = torch.ones(2, 3)
    w = [loss_weights(full, m, 6, 2, 3) for m in ("token", "sequence", "constant")]
    assert torch.allclose(w[0], w[1]) and torch.allclose(w[0], w[2])


def test_kl_placement_gradients_exact_expectation():
    """Exact expectations over a 5-way categorical policy: k2 as a loss and k1 in the reward give the
    gradient of the reverse KL(pi || ref); k3 as a loss gives the gradient of the forward KL(ref || pi)."""
    theta = torch.tensor([0.3, -1.0, 0.5, 2.0, -0.2], requires_grad=True)
    ref = torch.log_softmax(torch.tensor([1.0, 0.0, -0.5, 0.5, 0.2]), -1)
    w = torch.softmax(theta, -1).detach()  # sampling weights: samples carry no gradient

    def grad(f):
        theta.grad = None
        f().backward()
        return theta.grad.clone()

    def logp():
        return torch.log_softmax(theta, -1)

    reverse = grad(lambda: (logp().exp() * (logp() - ref)).sum())
    forward = grad(lambda: (ref.exp() * (ref - logp())).sum())
    k2_loss = grad(lambda: (w * kl_penalty(logp(), ref, "k2")).sum())
    k1_reward = grad(lambda: (w * kl_penalty(logp(), ref, "k1").detach() * logp()).sum())  # REINFORCE, reward -k1
    k3_loss = grad(lambda: (w * kl_penalty(logp(), ref, "k3")).sum())
    assert torch.allclose(k2_loss, reverse, atol=1e-6) and torch.allclose(k1_reward, reverse, atol=1e-6)
    assert torch.allclose(k3_loss, forward, atol=1e-6) and not torch.allclose(k3_loss, reverse, atol=1e-3)


def test_policy_ratio_is_clamped_at_extreme_log_ratios_and_unchanged_inside():
    for adv in (1.0, -1.0):
        for gap in (100.0, -100.0):
            logp = torch.tensor([[gap]], requires_grad=True)
            loss, st = policy_loss(logp, torch.zeros(1, 1), torch.tensor([[adv]]), ONE, 0.2, 0.2)
            loss.sum().backward()
            assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all(), (adv, gap)
            assert st["ratio"].item() == pytest.approx(math.exp(20 if gap > 0 else -20), rel=1e-5)
    # inside the bound the value and gradient are those of exp(logp - old)
    loss, grad, _ = _loss_and_grad(math.log(1.1), 0.0, -0.5)
    assert abs(loss - 0.55) < 1e-6 and abs(grad - 0.55) < 1e-6


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    """Dual-clip PPO (arXiv 1912.09729, eq. 5), c = 3: for A < 0 the loss is min(max(-A r, -A clip(r)), -A c)."""

    def run(ratio, adv, c=3.0):
        logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
        loss, st = policy_loss(logp, torch.zeros(1, 1), torch.tensor([[adv]]), ONE, 0.2, 0.2, clip_ratio_c=c)
        loss.sum().backward()
        return loss.item(), logp.grad.item(), st["dual_clipped"].item()

    loss, grad, dual = run(5.0, -1.0)  # -A r = 5 > -A c = 3: bounded, no gradient
    assert abs(loss - 3.0) < 1e-6 and grad == 0.0 and dual == 1.0
    loss, grad, dual = run(2.0, -1.0)  # 2 < 3: the ordinary surrogate, gradient -A r = 2
    assert abs(loss - 2.0) < 1e-6 and abs(grad - 2.0) < 1e-5 and dual == 0.0
    loss, grad, dual = run(5.0, 1.0)  # A > 0: untouched (clipped at 1.2 as usual)
    assert abs(loss - (-1.2)) < 1e-6 and grad == 0.0 and dual == 0.0
    assert run(5.0, -1.0, c=0.0)[0] == pytest.approx(5.0)  # off


def test_mismatch_weights_truncate_or_mask_tokens_and_sequences():
    from nanorl.losses import mismatch_weights

    learner, sampler, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]]), torch.ones(1, 2)
    rho = torch.tensor([[math.exp(0.5), math.exp(-1.0)]])  # 1.649, 0.368
    w, st = mismatch_weights(learner, sampler, mask, "token_truncate", 1.5)
    assert torch.allclose(w, torch.tensor([[1.5, math.exp(-1.0)]])) and torch.equal(
        st["is_cut"], torch.tensor([[1.0, 0]])
    )
    assert torch.allclose(st["is_ratio"], rho)
    w, st = mismatch_weights(learner, sampler, mask, "token_mask", 2.0)  # band [0.5, 2]
    assert torch.allclose(w, torch.tensor([[math.exp(0.5), 0.0]])) and torch.equal(
        st["is_cut"], torch.tensor([[0.0, 1]])
    )
    seq = math.exp(-0.5)  # the product of the token ratios: 0.607
    w, _ = mismatch_weights(learner, sampler, mask, "sequence_truncate", 2.0)
    assert torch.allclose(w, torch.full((1, 2), seq))
    w, st = mismatch_weights(learner, sampler, mask, "sequence_mask", 1.5)  # band [0.667, 1.5]
    assert torch.equal(w, torch.zeros(1, 2)) and st["is_cut"].sum() == 2
    # padding (mask 0) counts as ratio 1 in a sequence's product
    w, _ = mismatch_weights(learner, sampler, torch.tensor([[1.0, 0.0]]), "sequence_truncate", 2.0)
    assert torch.allclose(w, torch.full((1, 2), math.exp(0.5)))

"""The optimiser machinery: schedule values, and state allocated up front changing nothing."""

import math

import torch

from nanorl.config import GRPOConfig
from nanorl.learner import lr_factor, make_optimizer, optimizer_step


def test_lr_factor_warmup_then_schedules():
    assert [lr_factor(s, 3, 13, "constant", 0.1) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(3, 3, 13, "cosine", 0.1) == 1.0
    assert math.isclose(lr_factor(8, 3, 13, "cosine", 0.1), 0.1 + 0.9 * 0.5)  # halfway: cos(pi / 2) = 0
    assert math.isclose(lr_factor(13, 3, 13, "cosine", 0.1), 0.1)
    assert math.isclose(lr_factor(8, 3, 13, "linear", 0.1), 1 - 0.9 * 0.5)


def test_state_allocated_up_front_gives_the_same_steps_as_a_fresh_adamw():
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    b = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    b.load_state_dict(a.state_dict())
    cfg = GRPOConfig(lr=1e-2, weight_decay=0.1, warmup_steps=2, lr_schedule="cosine")
    opt_a, sched_a = make_optimizer(a, cfg, 10)
    assert all(p.grad is None and len(opt_a.state[p]) > 0 for p in a.parameters())  # moments allocated already
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))  # and no weight moved
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8)
    sched_b = torch.optim.lr_scheduler.LambdaLR(opt_b, lambda s: lr_factor(s, 2, 10, "cosine", 0.1))
    for step in range(4):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step))
        a(x).square().mean().backward()
        b(x).square().mean().backward()
        optimizer_step(a, opt_a, sched_a, grad_clip=1.0)
        torch.nn.utils.clip_grad_norm_(b.parameters(), 1.0)
        opt_b.step(), sched_b.step(), opt_b.zero_grad()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert all(float(opt_a.state[p]["step"]) == 4 and p.grad is None for p in a.parameters())  # freed after a step

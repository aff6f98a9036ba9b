import torch

from nanorl.advantages import group_advantages


def test_group_advantages_hand_computed():
    # group 1: rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5 -> +1, -1, -1, +1
    # group 2: rewards 1, 0, 0, 0 -> mean 0.25, std sqrt(0.1875) = 0.4330
    r = torch.tensor([1.0, 0, 0, 1, 1, 0, 0, 0])
    adv, stats = group_advantages(r, 4, scale_by_std=True, eps=0.0)
    expected = torch.tensor([1.0, -1, -1, 1, 0.75 / 0.1875**0.5, -0.25 / 0.1875**0.5, -0.25 / 0.1875**0.5,
                             -0.25 / 0.1875**0.5])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert stats["frac_groups_with_variance"] == 1.0


def test_dr_grpo_no_std_scaling():
    r = torch.tensor([1.0, 0, 0, 0])
    adv, _ = group_advantages(r, 4, scale_by_std=False)
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_equal_rewards_give_zero_and_no_nan():
    r = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0, 0.5, 0.5, 0.5, 0.5])
    for scale in (True, False):
        adv, stats = group_advantages(r, 4, scale_by_std=scale)
        assert torch.equal(adv, torch.zeros(12))
        assert not torch.isnan(adv).any()
        assert stats["frac_groups_with_variance"] == 0.0


def test_matches_per_group_loop():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(6 * 5, generator=g)
    adv, _ = group_advantages(r, 5, eps=1e-6)
    for k in range(6):
        grp = r[k * 5:(k + 1) * 5].tolist()
        mean = sum(grp) / 5
        std = (sum((x - mean) ** 2 for x in grp) / 5) ** 0.5
        for j, x in enumerate(grp):
            assert abs(adv[k * 5 + j].item() - (x - mean) / (std + 1e-6)) < 1e-5

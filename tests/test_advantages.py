import torch

from nanorl.advantages import group_advantages


def test_group_advantages_hand_computed():
    # group 1: rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5 -> +1, -1, -1, +1
    # group 2: rewards 1, 0, 0, 0 -> mean 0.25, std sqrt(0.1875) = 0.4330
    r = torch.tensor([1.0, 0, 0, 1, 1, 0, 0, 0])
    adv = group_advantages(r, 4, scale_by_std=True, eps=0.0)
    expected = torch.tensor(
        [1.0, -1, -1, 1, 0.75 / 0.1875**0.5, -0.25 / 0.1875**0.5, -0.25 / 0.1875**0.5, -0.25 / 0.1875**0.5]
    )
    assert torch.allclose(adv, expected, atol=1e-6)


def test_dr_grpo_no_std_scaling():
    r = torch.tensor([1.0, 0, 0, 0])
    adv = group_advantages(r, 4, scale_by_std=False)
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_equal_rewards_give_zero_and_no_nan():
    r = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0, 0.5, 0.5, 0.5, 0.5])
    for scale in (True, False):
        adv = group_advantages(r, 4, scale_by_std=scale)
        assert torch.equal(adv, torch.zeros(12))
        assert not torch.isnan(adv).any()


def test_matches_per_group_loop():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(6 * 5, generator=g)
    adv = group_advantages(r, 5, eps=1e-6)
    for k in range(6):
        grp = r[k * 5 : (k + 1) * 5].tolist()
        mean = sum(grp) / 5
        std = (sum((x - mean) ** 2 for x in grp) / 5) ** 0.5
        for j, x in enumerate(grp):
            assert abs(adv[k * 5 + j].item() - (x - mean) / (std + 1e-6)) < 1e-5


def test_rloo_baseline_excludes_the_sample_itself():
    from nanorl.advantages import rloo_advantages

    r = torch.tensor([1.0, 0, 0, 1, 3, 3, 3, 3])
    adv = rloo_advantages(r, 4)
    # sample 0: baseline mean(0, 0, 1) = 1/3 -> 2/3; sample 1: baseline mean(1, 0, 1) = 2/3 -> -2/3
    assert torch.allclose(adv[:4], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    assert torch.equal(adv[4:], torch.zeros(4))  # no variance, no signal, no NaN
    g = torch.Generator().manual_seed(1)
    r = torch.rand(12, generator=g)
    adv = rloo_advantages(r, 6)
    for i in range(12):
        grp = r[(i // 6) * 6 : (i // 6 + 1) * 6].tolist()
        others = grp[: i % 6] + grp[i % 6 + 1 :]
        assert abs(adv[i].item() - (r[i].item() - sum(others) / 5)) < 1e-6
    # RLOO's advantage is the group-centred one scaled by G / (G - 1)
    centred = group_advantages(r, 6, scale_by_std=False)
    assert torch.allclose(adv, centred * 6 / 5, atol=1e-6)


def test_reinforce_pp_normalises_over_the_whole_batch():
    from nanorl.advantages import batch_advantages

    r = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0])  # no group has variance, the batch does
    adv = batch_advantages(r, 4, eps=0.0)
    assert torch.allclose(adv, torch.tensor([1.0, 1, 1, 1, -1, -1, -1, -1]))
    adv = batch_advantages(torch.full((8,), 0.3), 4)
    assert torch.equal(adv, torch.zeros(8))


def test_equal_non_dyadic_rewards_are_exactly_zero_for_every_estimator():
    from nanorl.advantages import ESTIMATORS

    r = torch.full((12,), 0.3)  # the float mean of 0.3s is not exactly 0.3
    for name, fn in ESTIMATORS.items():
        for scale in (True, False):
            adv = fn(r, 4, scale)
            assert torch.equal(adv, torch.zeros(12)), (name, scale)


def test_reinforce_pp_whitens_over_the_batchs_tokens_as_the_paper_does():
    """REINFORCE++ (arXiv 2501.03262): every token carries its sequence's reward, whitened over all tokens.
    Lengths [10, 1, 1, 1], rewards [1, 0, 0, 0]: token mean 10/13, token std sqrt(30)/13, so the long
    sequence gets (3/13) / (sqrt(30)/13) = 3/sqrt(30) = 0.548 and the short ones -10/sqrt(30) = -1.826
    (a per-sequence normalisation gave the long one 1.73)."""
    from nanorl.advantages import batch_advantages

    adv = batch_advantages(torch.tensor([1.0, 0, 0, 0]), 4, eps=0.0, lengths=torch.tensor([10, 1, 1, 1]))
    assert torch.allclose(adv, torch.tensor([3 / 30**0.5, -10 / 30**0.5, -10 / 30**0.5, -10 / 30**0.5]))
    adv = batch_advantages(torch.tensor([1.0, 0, 0, 0]), 4, eps=0.0)  # no lengths: one token each
    assert torch.allclose(adv, torch.tensor([3.0, -1, -1, -1]) / 3**0.5)


def test_reinforce_pp_baseline_subtracts_the_group_mean_then_whitens_over_tokens():
    from nanorl.advantages import group_batch_advantages

    # groups of 2: (1, 0) -> centred (0.5, -0.5); (1, 1) -> (0, 0); lengths 3, 1, 2, 2
    r, lengths = torch.tensor([1.0, 0, 1, 1]), torch.tensor([3, 1, 2, 2])
    adv = group_batch_advantages(r, 2, eps=0.0, lengths=lengths)
    c = torch.tensor([0.5, -0.5, 0.0, 0.0])
    mean = (c * lengths).sum() / 8  # 1/8
    std = ((lengths * (c - mean) ** 2).sum() / 8).sqrt()
    assert torch.allclose(adv, (c - mean) / std)
    assert adv[2] != 0  # a group without variance is shifted by the whitening, as in verl and OpenRLHF


def test_std_correction_picks_the_population_or_the_sample_std():
    r = torch.tensor([1.0, 0, 0, 0])  # mean 0.25; population std sqrt(3/16), sample std sqrt(1/4) = 0.5
    pop = group_advantages(r, 4, eps=0.0)
    sample = group_advantages(r, 4, eps=0.0, std_correction=1)
    assert torch.allclose(pop[0], torch.tensor(0.75 / (3 / 16) ** 0.5))
    assert torch.allclose(sample[0], torch.tensor(1.5))

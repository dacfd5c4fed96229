import pytest

from convtune.fft import cost
from convtune.fft.sizes import axis_candidates, is_smooth, min_length, next_pow2, next_smooth, size_candidates
from cases import problem


@pytest.mark.parametrize("n, smooth7, smooth23, pow2", [(1, 1, 1, 1), (11, 12, 12, 16), (97, 98, 108, 128),
                                                       (121, 125, 128, 128), (4095, 4096, 4096, 4096)])
def test_smooth_and_power_sizes(n, smooth7, smooth23, pow2):
    assert next_smooth(n) == smooth7
    assert next_smooth(n, (2, 3)) == smooth23
    assert next_pow2(n) == pow2
    assert is_smooth(smooth7) and not is_smooth(11)


def test_axis_candidates_include_exact_and_power_of_two():
    assert axis_candidates(97) == (97, 98, 108, 128)
    assert axis_candidates(64) == (64,)


def test_min_length_covers_every_case():
    assert min_length(64, 0, 9) == 64            # valid correlation: no padding needed
    assert min_length(4096, 4095, 4096) == 8191  # full linear convolution
    assert min_length(3, 1, 5) == 5              # kernel longer than input + pad
    assert min_length(4, 3, 2) == 9              # padding larger than the kernel


def test_size_candidates_are_rectangular_products():
    p = problem("2d-odd")
    cands = size_candidates(p)
    assert len(cands) == len(set(cands))
    assert all(len(s) == 2 for s in cands)
    assert (7, 9) in cands and (8, 16) in cands


def test_cost_count_is_pure_and_ranks_power_of_two_first_for_equal_work():
    p = problem("2d-large-kernel")
    c = cost.count(p, (16, 16))
    assert c["transform"] > 0 and c["product"] > 0
    assert cost.estimate(p, (16, 16)) < cost.estimate(p, (17, 17))

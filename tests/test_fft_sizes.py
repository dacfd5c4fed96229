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


def test_fit_takes_median_cost_per_flop_relative_to_powers_of_two():
    samples = [("pow2", 1e9, 1e-3), ("pow2", 2e9, 2e-3), ("pow2", 1e9, 9e-3),
               ("smooth", 1e9, 1.5e-3), ("other", 1e9, 6e-3), ("other", 1e9, 4e-3)]
    c = cost.fit(samples, "test")
    assert c["pow2"] == 1.0 and c["smooth"] == pytest.approx(1.5) and c["other"] == pytest.approx(5.0)
    assert c["samples"] == {"pow2": 3, "smooth": 1, "other": 2} and c["source"] == "test"


def test_fit_keeps_default_factors_for_unmeasured_kinds_and_says_so():
    c = cost.fit([("pow2", 1e9, 1e-3)], "test")
    assert c["smooth"] == cost.CALIBRATION["smooth"] and "default factors for smooth, other" in c["source"]
    with pytest.raises(ValueError, match="power-of-2"):
        cost.fit([("smooth", 1e9, 1e-3)], "test")


def test_candidates_rank_sizes_with_the_devices_calibration(backend, calibrations):
    from convtune.problem import ConvProblem
    from convtune.strategies import get_strategy
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(61,), kernel_size=3)
    fft = get_strategy("fft")
    assert fft.candidates(p, backend)[0].sizes != (61,)  # a prime length: last by the default factors
    with pytest.raises(ValueError, match="positive factors for other"):
        cost.register_calibration(backend.device_info().key(), {"pow2": 1.0, "smooth": 1.0})
    cost.register_calibration(backend.device_info().key(), {"pow2": 1.0, "smooth": 9.0, "other": 1.0})
    assert fft.candidates(p, backend)[0].sizes == (61,)  # fewest flops once primes cost no more


def test_calibration_is_stored_in_the_plan_cache_and_used_once_loaded(tmp_path, calibrations):
    from convtune.cache import PlanCache
    db = str(tmp_path / "plans.db")
    cost.store_calibration(PlanCache(db), "gpu:test-device", {"source": "t", "pow2": 1.0, "smooth": 2.0, "other": 3.0})
    cost.store_calibration(PlanCache(db), "gpu:test-device", {"source": "t2", "pow2": 1.0, "smooth": 1.5, "other": 3.0})
    calibrations.clear()
    cache = PlanCache(db)
    assert cost.calibration_for("gpu:test-device") is cost.CALIBRATION  # opening a cache loads nothing
    cost.load_calibrations(cache)
    stored = cost.stored_calibrations(cache)
    assert list(stored) == ["gpu:test-device"] and stored["gpu:test-device"]["smooth"] == 1.5
    assert cost.calibration_for("gpu:test-device")["source"] == "t2"
    assert cost.calibration_for("gpu:other") is cost.CALIBRATION

"""The oracle itself is checked against plain loops and against the adjoint identities."""

import itertools

import numpy as np
import pytest

from convtune.direct.reference import reference
from cases import CASES, problem


def naive_forward(p, x, w):
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(q, q) for q in p.padding])
    y = np.zeros(p.y_shape)
    cig, cog = p.in_per_group, p.out_per_group
    for n, o in itertools.product(range(p.batch), range(p.out_channels)):
        g = o // cog
        for q in itertools.product(*(range(s) for s in p.output_size)):
            total = 0.0
            for c in range(cig):
                for k in itertools.product(*(range(s) for s in p.kernel_size)):
                    idx = tuple(qi * si + ki * di for qi, si, ki, di in zip(q, p.stride, k, p.dilation))
                    total += xp[(n, g * cig + c) + idx] * w[(o, c) + k]
            y[(n, o) + q] = total
    return y


@pytest.mark.parametrize("name", ["1d-stride-pad", "1d-dilation", "2d-stride-pad-dil", "2d-depthwise-mult",
                                  "2d-big-pad", "2d-groups"])
def test_reference_forward_matches_plain_loops(name):
    p = problem(name)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(p.x_shape)
    w = rng.standard_normal(p.w_shape)
    np.testing.assert_allclose(reference(np, p, x, w), naive_forward(p, x, w), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_backward_passes_are_adjoints_of_forward(name):
    # <conv(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(x, dy)>
    p = problem(name)
    rng = np.random.default_rng(2)
    x, w, dy = (rng.standard_normal(s) for s in (p.x_shape, p.w_shape, p.y_shape))
    y = reference(np, p, x, w)
    dx = reference(np, p.for_pass("dgrad"), dy, w)
    dw = reference(np, p.for_pass("wgrad"), x, dy)
    lhs = float((y * dy).sum())
    assert float((x * dx).sum()) == pytest.approx(lhs, rel=1e-10)
    assert float((w * dw).sum()) == pytest.approx(lhs, rel=1e-10)


@pytest.mark.parametrize("shape", [
    dict(batch=2, in_channels=3, out_channels=4, input_size=(17,), kernel_size=5, padding=2),
    dict(batch=2, in_channels=4, out_channels=4, input_size=(16,), kernel_size=16, padding=15, groups=4),
    dict(batch=2, in_channels=6, out_channels=4, input_size=(9, 11), kernel_size=(5, 4), padding=(2, 3), groups=2),
    dict(batch=1, in_channels=3, out_channels=6, input_size=(12, 10), kernel_size=(11, 11), padding=5, groups=3),
    dict(batch=2, in_channels=2, out_channels=3, input_size=(5, 4), kernel_size=(7, 6), padding=1),
    dict(batch=2, in_channels=2, out_channels=2, input_size=(6, 5, 7), kernel_size=3, padding=(1, 0, 2))])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_the_spectral_reference_is_the_direct_sums(shape, pass_):
    """The FFT form that large kernels use agrees with the per-tap sums to float64's rounding, whatever the
    problem's size (it is called here below its threshold too)."""
    from convtune import ConvProblem
    from convtune.direct.reference import spectral_reference
    p = ConvProblem.make(**shape).for_pass(pass_)
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s) for s in p.operand_shapes)
    want = reference(np, p, a, b)
    got = spectral_reference(np, p, a, b)
    assert got.shape == want.shape == tuple(p.result_shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-11 * np.abs(want).max())


def test_large_kernels_at_stride_one_take_the_spectral_form(monkeypatch):
    from convtune import ConvProblem
    from convtune.direct import reference as module
    used = []
    monkeypatch.setattr(module, "spectral_reference", lambda *args: used.append(args[1]) or "spectral")
    big = ConvProblem.make(batch=1, in_channels=2, out_channels=2, input_size=(20, 20), kernel_size=11, padding=5,
                           groups=2)
    assert module.spectral_applies(big) and module.reference(np, big, None, None) == "spectral"
    for other in (big.replace(kernel_size=(9, 9), padding=(4, 4)), big.replace(stride=(2, 2)),
                  big.replace(dilation=(2, 1))):
        assert not module.spectral_applies(other)
    monkeypatch.setattr(module, "SPECTRAL_BYTES", 1000)  # a filter spectrum too large: the direct sums
    assert not module.spectral_applies(big)


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_the_spectral_reference_reads_channels_last_operands(pass_):
    """Operands as the planner hands them over for a channels_last problem (logical NCHW, NHWC strides) and in
    half precision's stand-in float32: the same result as from packed copies."""
    from convtune import ConvProblem
    from convtune.direct.reference import REFERENCE, spectral_reference
    p = ConvProblem.make(batch=2, in_channels=4, out_channels=4, input_size=(14, 13), kernel_size=11, padding=5,
                         groups=4).for_pass(pass_)
    rng = np.random.default_rng(5)
    packed = [rng.standard_normal(s).astype(np.float32) for s in p.operand_shapes]
    strided = [np.ascontiguousarray(v.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if v.shape[0] == p.batch else v
               for v in packed]
    assert any(not v.flags.c_contiguous for v in strided)
    np.testing.assert_allclose(spectral_reference(np, p, *strided), spectral_reference(np, p, *packed),
                               rtol=0, atol=1e-12)
    direct = REFERENCE[pass_](np, p, *packed)  # (the per-tap sums: ``reference`` takes this problem spectrally)
    np.testing.assert_allclose(spectral_reference(np, p, *strided), direct, rtol=0, atol=1e-9)


def test_the_planner_verifies_a_long_kernel_against_the_spectral_reference(monkeypatch):
    """A 1-D depthwise kernel of 129 taps (the long convolutions' kind): the float64 oracle the planner verifies
    against is the FFT form, and the candidates pass it with float32's error, not float64's."""
    from conftest import FakeTimer
    from convtune import ConvProblem, Planner
    from convtune.direct import reference as module
    used = []
    spectral = module.spectral_reference
    monkeypatch.setattr(module, "spectral_reference", lambda *args: used.append(args[1].pass_) or spectral(*args))
    p = ConvProblem.make(batch=2, in_channels=4, out_channels=4, input_size=(300,), kernel_size=129, padding=64,
                         groups=4)
    for pass_ in ("fwd", "dgrad", "wgrad"):
        d = Planner("numpy", FakeTimer(), strategies=["im2col", "fft"]).tune(p.for_pass(pass_))
        assert d.winner.status == "winner" and 1e-9 < d.winner.error <= p.tolerance, (pass_, d.winner.error)
    assert set(used) == {"fwd", "dgrad", "wgrad"}

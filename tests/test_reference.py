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

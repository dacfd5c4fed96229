import pytest

from convtune import ConvProblem
from convtune.problem import KEY_VERSION


def make(**kw):
    base = dict(batch=2, in_channels=4, out_channels=8, input_size=(10, 12), kernel_size=3)
    return ConvProblem.make(**{**base, **kw})


def test_output_size_matches_the_formula():
    p = make(stride=(2, 3), padding=(1, 2), dilation=(2, 1))
    # (10 + 2 - 2*2 - 1)//2 + 1 = 4 ; (12 + 4 - 2 - 1)//3 + 1 = 5
    assert p.output_size == (4, 5)
    assert p.y_shape == (2, 8, 4, 5)
    assert p.w_shape == (8, 4, 3, 3)


@pytest.mark.parametrize("kw, message", [
    (dict(kernel_size=13), "dilated kernel spans 13"),
    (dict(in_channels=6, groups=4), "divisible by groups"),
    (dict(batch=0), "batch must be a positive integer"),
    (dict(out_channels=-3), "out_channels must be a positive integer"),
    (dict(input_size=(0, 5)), "input_size must be positive"),
    (dict(stride=0), "stride must be positive"),
    (dict(padding=-1), "padding must be non-negative"),
    (dict(math="fp16"), "acceptable modes: fp32, tf32"),
    (dict(pass_="bwd"), "acceptable passes: fwd, dgrad, wgrad"),
    (dict(dtype="float64"), "acceptable dtypes: float32"),
    (dict(input_size=(4, 4, 4, 4), kernel_size=1), "1 to 3 spatial dimensions"),
    (dict(kernel_size=(3, 3, 3)), "kernel_size has 3 entries"),
    (dict(input_size=10), "input_size must be a sequence"),
])
def test_invalid_problems_raise_clear_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        make(**kw)


def test_key_is_canonical_readable_and_round_trips():
    p = make(stride=2, padding=(1, 0), groups=2, math="tf32", pass_="wgrad")
    key = p.key()
    assert key == f"ck{KEY_VERSION}:conv2d:wgrad:float32:tf32:n2:c4:k8:in10x12:ker3x3:s2x2:p1x0:d1x1:g2"
    assert ConvProblem.from_key(key) == p
    assert make().key() != make(math="tf32").key() != make(pass_="dgrad").key()


def test_from_key_rejects_foreign_keys():
    with pytest.raises(ValueError, match="format version"):
        ConvProblem.from_key("ck0:conv2d:fwd")


def test_problem_is_frozen_and_hashable():
    p = make()
    with pytest.raises(Exception):
        p.batch = 3
    assert {p: 1}[make()] == 1


def test_flops_and_min_bytes():
    p = ConvProblem.make(batch=1, in_channels=2, out_channels=3, input_size=(4,), kernel_size=2)
    # out length 3: 1*3*3 outputs x 2 inputs x 2 taps = 36 MACs
    assert p.flops() == 72
    assert p.min_bytes() == 4 * (1 * 2 * 4 + 3 * 2 * 2 + 1 * 3 * 3)
    assert p.for_pass("wgrad").min_bytes() == 4 * (8 + 9 + 12)


def test_depthwise_flag():
    assert make(in_channels=8, out_channels=8, groups=8).depthwise
    assert not make().depthwise

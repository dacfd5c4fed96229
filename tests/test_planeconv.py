"""The one-block image FFT (convtune.fft.planeconv): its CUDA source run on the CPU (tests/cuda_cpu.py) against the
convolution's definition in float64, and its kernels on the GPU against float64."""

import numpy
import pytest

from convtune.fft import blockkept, planeconv, rowconv, rowsource
from convtune.problem import ConvProblem
from convtune.strategies import get_strategy


def _problem(size, k, pad, pass_="fwd", batch=2, channels=3, **extra):
    return ConvProblem.make(batch=batch, in_channels=channels, out_channels=channels, input_size=size, kernel_size=k,
                            padding=pad, groups=channels, pass_=pass_, **extra)


def _direct(p, a, b):
    """The pass by its definition, float64, channels-first: y[t0, t1] = sum_s x[t0 + s0 - p0, t1 + s1 - p1] w[s0, s1]."""
    (n0, n1), (k0, k1), (p0, p1), (o0, o1) = p.input_size, p.kernel_size, p.padding, p.output_size
    shape = (p.batch, p.in_channels, n0 + 2 * p0 + k0, n1 + 2 * p1 + k1)
    if p.pass_ == "fwd":
        xp = numpy.zeros(shape)
        xp[:, :, p0:p0 + n0, p1:p1 + n1] = a
        w = b[:, 0]
        out = numpy.zeros((p.batch, p.in_channels, o0, o1))
        for s0 in range(k0):
            for s1 in range(k1):
                out += xp[:, :, s0:s0 + o0, s1:s1 + o1] * w[None, :, s0, s1, None, None]
        return out
    if p.pass_ == "dgrad":
        dx = numpy.zeros(shape)
        w = b[:, 0]
        for s0 in range(k0):
            for s1 in range(k1):
                dx[:, :, s0:s0 + o0, s1:s1 + o1] += a * w[None, :, s0, s1, None, None]
        return dx[:, :, p0:p0 + n0, p1:p1 + n1]
    xp = numpy.zeros(shape)
    xp[:, :, p0:p0 + n0, p1:p1 + n1] = a
    dw = numpy.empty((p.in_channels, 1, k0, k1))
    for s0 in range(k0):
        for s1 in range(k1):
            dw[:, 0, s0, s1] = (xp[:, :, s0:s0 + o0, s1:s1 + o1] * b).sum(axis=(0, 2, 3))
    return dw


def test_sizes_and_reasons():
    replknet = _problem((56, 56), 31, 15, batch=16, channels=128)
    slak = _problem((56, 56), 51, 25, batch=16, channels=96)
    assert planeconv.transform_sizes(replknet) == (128, 128) and planeconv.reason(replknet) is None
    assert planeconv.transform_sizes(slak) == (128, 128) and planeconv.reason(slak) is None
    assert planeconv.transform_sizes(_problem((5, 6), 3, 1)) == (8, 8)
    assert planeconv.size_options(replknet) == [(128, 128), (72, 72)]
    assert planeconv.size_options(slak) == [(128, 128), (81, 96), (96, 96)]  # (the rows' length even: 96, not 81)
    # 81-point columns take four radix-3 passes (324 point-passes), 96-point ones three (288); 72 = 8 * 9 keeps
    assert planeconv.fewer_pass_sizes(slak) == (96, 96) and planeconv.fewer_pass_sizes(replknet) == (72, 72)
    assert planeconv.size_options(_problem((56, 56), 7, 3)) == [(64, 64)]
    assert "2^a 3^b" in planeconv.reason(replknet, (80, 80))
    assert "the second even" in planeconv.reason(replknet, (81, 81))
    assert "shared memory" in planeconv.reason(_problem((200, 200), 31, 15))
    assert "stride and dilation" in planeconv.reason(_problem((20, 20), 3, 1, stride=2))
    assert "not a depthwise" in planeconv.reason(_problem((20, 20), 3, 1).replace(groups=1, out_channels=4))
    assert "is 2-D" in planeconv.reason(ConvProblem.make(batch=1, in_channels=2, out_channels=2, input_size=(9,),
                                                         kernel_size=3, groups=2))
    assert "below the" in planeconv.reason(replknet, (64, 128))
    assert planeconv.row_stride(128) % 2 == 1 and planeconv.smem_bytes((128, 128)) == 8 * 128 * 73


def test_batch_slices_fill_the_device_and_never_run_empty():
    for batch, channels in [(16, 128), (16, 96), (1, 4), (7, 3), (64, 768), (5, 100)]:
        p = _problem((20, 20), 3, 1, "wgrad", batch=batch, channels=channels)
        for blocks in planeconv.WGRAD_BLOCKS:
            s = planeconv.batch_slices(p, blocks)
            chunk = -(-batch // s)
            assert 1 <= s <= batch and (s - 1) * chunk < batch  # every slice holds a sample
            assert channels * s >= min(blocks, channels * batch) // 2


def test_candidates_sizes_and_slices():
    from convtune.strategies.fftplane import PlaneFftConfig
    strategy = get_strategy("fft-plane")
    p = _problem((56, 56), 31, 15, "wgrad", batch=16, channels=128)
    configs = strategy.candidates(p, None)
    # 128 x 128 also with radix-16 passes (its columns: 16 x 8, two passes, not 8 x 8 x 2); 72 x 72 with radix 9
    # (8 x 9, not 8 x 3 x 3)
    big = [((128, 128), s, t, r) for s in (3, 8) for t in (0, 256) for r in ("8", "16")]
    assert [(c.sizes, c.slices, c.threads, c.radices) for c in configs] == big + [
        ((72, 72), s, t, r) for s in (3, 8) for t in (0, 512) for r in ("8", "16x9")]
    assert strategy.workspace_bytes(p, configs[4]) == 128 * 8 * 2 * 8 * 128 * 65  # X's spectra and the sums
    assert planeconv.wgrad_buffers((128, 128)) == 1 and planeconv.wgrad_buffers((72, 72)) == 3
    assert strategy.workspace_bytes(p, configs[12]) == 128 * 8 * 1 * 8 * 72 * 37  # the sums alone
    assert [c.slices for c in strategy.candidates(p.for_pass("fwd"), None)] == [1] * 8
    last = configs[-1]
    assert PlaneFftConfig.from_label(last.label()) == last and last.label().endswith("threads=512,radices=16x9")
    assert last.shape() == (512, 1) and configs[12].shape() is None
    assert configs[1].label() == "sizes=128x128,slices=3,threads=0,radices=16"
    with pytest.raises(ValueError, match="0 slices of a batch"):
        planeconv.PlaneFftConv(None, p, kernels=(None,) * 5, slices=0)
    # a configuration's slices on a smaller batch (the planner verifies on two samples): one a sample at most, none
    # empty, and the workspace the strategy reports is the executor's
    for batch, slices, runs in ((2, 8, 2), (10, 8, 5), (16, 17, 16), (16, 3, 3)):
        q = p.replace(batch=batch)
        conv = planeconv.PlaneFftConv(None, q, (72, 72), kernels=(None,) * 5, slices=slices)
        assert conv.steps[0][1] == (128 * runs,)
        assert conv.workspace == strategy.workspace_bytes(q, PlaneFftConfig(sizes=(72, 72), slices=slices))


def test_other_ranks_get_a_reason_not_an_exception():
    """(supports() raised on every 1-D problem through size_options: found by the first ``convtune bench`` of
    hyena-long-dw on the GPU.)"""
    from types import SimpleNamespace
    strategy = get_strategy("fft-plane")
    for p in (ConvProblem.make(batch=2, in_channels=8, out_channels=8, groups=8, input_size=(64,), kernel_size=9,
                               padding=4),
              ConvProblem.make(batch=2, in_channels=8, out_channels=8, groups=8, input_size=(6, 8, 8), kernel_size=3,
                               padding=1)):
        assert planeconv.size_options(p) == []
        assert "2-D, not rank" in strategy.supports(p, SimpleNamespace(name="cupy"))


def test_strategy_is_gpu_only_and_serves_2d_depthwise_shapes():
    from convtune.backend import get_backend
    strategy = get_strategy("fft-plane")
    p = _problem((56, 56), 31, 15)
    assert "GPU" in strategy.supports(p, get_backend("numpy"))
    assert strategy.serves_shape(p) and not strategy.serves_shape(p.replace(groups=1, out_channels=4))


# -- the CUDA source on the CPU ---------------------------------------------------------------------------------------
def _cpu_kernels(dtype, sizes, shape=None, radix="8"):
    import cuda_cpu
    return cuda_cpu.launchables(planeconv.source(dtype, sizes, shape, radix), planeconv.NAMES)


CPU_CASES = [((9, 11), (3, 5), (1, 2), 2, 3), ((16, 16), 7, 3, 3, 2), ((20, 13), (13, 4), (6, 0), 1, 2),
             ((5, 6), 5, 4, 2, 2), ((30, 40), (9, 1), (8, 0), 1, 2), ((3, 70), (3, 31), (1, 15), 1, 1),
             ((6, 5), 3, (4, 3), 2, 2)]  # (padding past the kernel's reach: outputs of zeros at the edges)


def _run_on_cpu(dtype, layout, pass_, case, seed=0, smooth=False, shape=None, radix="8"):
    size, k, pad, batch, channels = case
    p = _problem(size, k, pad, pass_, batch=batch, channels=channels, dtype=dtype, layout=layout)
    sizes = planeconv.transform_sizes(p, smooth)
    conv = planeconv.PlaneFftConv(None, p, sizes, kernels=_cpu_kernels(dtype, sizes, shape, radix), shape=shape,
                                  radix=radix)
    assert conv.steps[-1][2] == ((shape or planeconv.launch_shape(sizes))[0],)
    import cuda_cpu
    rng = numpy.random.default_rng(seed)
    got, a64, b64 = cuda_cpu.run_launch(conv, p, *(rng.standard_normal(s) for s in p.operand_shapes))
    ref = _direct(p, a64, b64)
    return numpy.linalg.norm(got - ref) / numpy.linalg.norm(ref)


@pytest.mark.parametrize("dtype, layout", [("float32", "channels_first"), ("float32", "channels_last"),
                                           ("bfloat16", "channels_first")])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", CPU_CASES)
def test_kernel_source_on_the_cpu(dtype, layout, pass_, case):
    """The CUDA source itself, a block's threads emulated: every pass, odd sizes, padding under, at and over the
    kernel's reach, both layouts, bfloat16's loads and stores, against the definition in float64."""
    err = _run_on_cpu(dtype, layout, pass_, case)
    assert err <= (1e-6 if dtype == "float32" else 8e-3), err


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case, sizes", [(((9, 11), (3, 5), (1, 2), 2, 3), (12, 16)),
                                         (((20, 13), (13, 4), (6, 0), 1, 2), (27, 16)),
                                         (((5, 45), 5, (2, 5), 2, 2), (8, 54))])
def test_kernel_source_on_the_cpu_at_smooth_sizes(pass_, case, sizes):
    """2^a 3^b transforms: radix-3 passes, rows of an odd number of points (54 samples: 27), both layouts."""
    for layout in ("channels_first", "channels_last"):
        size, k, pad, batch, channels = case
        p = _problem(size, k, pad, pass_, batch=batch, channels=channels, layout=layout)
        assert planeconv.transform_sizes(p, smooth=True) == sizes
        assert _run_on_cpu("float32", layout, pass_, case, smooth=True) <= 1e-6


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("smooth", [False, True])
def test_kernel_source_on_the_cpu_at_stage1_sizes(pass_, smooth):
    """A RepLKNet-style layer (31x31 kernel, same padding) on the 128 x 128 or 72 x 72 transforms its stage-1 layers
    take, with the filter gradient's batch cut into slices (8 samples, 2 channels: 8 slices)."""
    err = _run_on_cpu("float32", "channels_first", pass_, ((56, 56), 31, 15, 8 if pass_ == "wgrad" else 1, 2),
                      smooth=smooth)
    assert err <= 1e-6, err


@pytest.mark.parametrize("batch, slices", [(2, 8), (5, 3), (7, 4)])
def test_wgrad_with_more_slices_than_the_batch_fills(batch, slices):
    """A configuration's slices on a batch they do not divide, or on fewer samples than slices (each slice keeps a
    sample: an empty one would leave its sums unwritten)."""
    import cuda_cpu
    p = _problem((20, 13), (13, 4), (6, 0), "wgrad", batch=batch, channels=2)
    sizes = planeconv.transform_sizes(p)
    conv = planeconv.PlaneFftConv(None, p, sizes, kernels=_cpu_kernels("float32", sizes), slices=slices)
    rng = numpy.random.default_rng(batch)
    got, a64, b64 = cuda_cpu.run_launch(conv, p, *(rng.standard_normal(s) for s in p.operand_shapes))
    ref = _direct(p, a64, b64)
    assert numpy.linalg.norm(got - ref) / numpy.linalg.norm(ref) <= 1e-6


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("threads", [256, 512])
def test_kernel_source_on_the_cpu_at_other_block_sizes(pass_, threads):
    """The candidates' other launch shapes (:func:`planeconv.shape_options`): the grouped passes' and the loops'
    strides follow the block size."""
    case = ((20, 13), (13, 4), (6, 0), 3, 2)
    assert _run_on_cpu("float32", "channels_first", pass_, case, shape=(threads, 1)) <= 1e-6


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case, smooth, radix", [(((20, 13), (13, 4), (6, 0), 2, 2), False, "16"),  # 32 x 16: 16 x 2
                                                 (((9, 30), 3, 1, 2, 3), False, "16"),  # 16 x 32: one pass per axis
                                                 (((40, 50), (5, 9), (2, 4), 1, 2), True, "16"),  # 48 x 64: 16 x 3
                                                 (((56, 56), 31, 15, 3, 1), False, "16"),  # 128 x 128: 16 x 8
                                                 (((56, 56), 31, 15, 3, 1), True, "16x9"),  # 72 x 72: 8 x 9, 4 x 9
                                                 (((20, 13), (13, 4), (6, 0), 2, 2), True, "16x9")])  # 27 x 16: 9 x 3
def test_kernel_source_on_the_cpu_large_radices(pass_, case, smooth, radix):
    """Radix-16 passes first, and radix 9, along both axes, against float64."""
    size, k, pad, batch, channels = case
    p = _problem(size, k, pad, pass_, batch=batch, channels=channels)
    l0, l1 = planeconv.transform_sizes(p, smooth)
    large = rowconv.RADICES[radix]
    assert set(rowsource.radices(l0, large) + rowsource.radices(l1 // 2, large)) & {9, 16}
    assert _run_on_cpu("float32", "channels_first", pass_, case, smooth=smooth, radix=radix) <= 1e-6


def test_launch_without_workspace_is_refused():
    p = _problem((20, 20), 5, 2)
    conv = planeconv.PlaneFftConv(None, p, kernels=(None,) * 5)
    with pytest.raises(ValueError, match=f"workspace of {conv.workspace} bytes"):
        conv.launch(0, 0, 0, None)


# -- the kernels, on the GPU ------------------------------------------------------------------------------------------
GPU_CASES = CPU_CASES + [((56, 56), 31, 15, 4, 8), ((56, 56), 51, 25, 3, 5), ((56, 56), 7, 3, 4, 6),
                         ((112, 112), 7, 3, 2, 3), ((28, 28), (29, 29), 14, 2, 4), ((100, 30), (41, 3), (20, 1), 2, 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", GPU_CASES)
def test_kernels_match_float64(dtype, layout, pass_, case):
    import cuda_cpu
    size, k, pad, batch, channels = case
    p = _problem(size, k, pad, pass_, batch=batch, channels=channels, dtype=dtype, layout=layout)
    errors = cuda_cpu.gpu_errors("fft-plane", p, seed=sum(size))
    bound = 1e-5 if dtype == "float32" else p.tolerance
    assert all(err <= bound for err in errors.values()), f"{errors} on {p.describe()}"


@pytest.mark.skipif(not __import__("os").environ.get("CONVTUNE_ASAN"), reason="CONVTUNE_ASAN=1 runs it (slow)")
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", [((9, 11), (3, 5), (1, 2), 2, 3), ((56, 60), 31, 15, 8, 2), ((3, 70), (3, 31), (1, 15), 1, 1),
                                  ((5, 45), 5, (2, 5), 2, 2)])
@pytest.mark.parametrize("smooth", [False, True])
def test_kernel_source_under_address_sanitizer(layout, pass_, case, smooth):
    import cuda_cpu
    size, k, pad, batch, channels = case
    p = _problem(size, k, pad, pass_, batch=batch, channels=channels, layout=layout)
    sizes = planeconv.transform_sizes(p, smooth)
    kernels, calls = cuda_cpu.recorders(planeconv.NAMES)
    conv = planeconv.PlaneFftConv(None, p, sizes, kernels=kernels)
    run = cuda_cpu.sanitized(planeconv.source("float32", sizes), conv, p, calls)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("case, smooth", [(((9, 11), (3, 5), (1, 2), 2, 3), False),
                                          (((6, 5), 3, (4, 3), 2, 2), False),
                                          (((20, 13), (13, 4), (6, 0), 3, 2), True)])
def test_kept_round_trip_on_the_cpu(layout, case, smooth):
    """The kept-spectra kernels (x's, w's and dy's spectra made once each; the passes from them), every pass against
    its definition in float64, both layouts, padding past the kernel's reach, 2^a 3^b sizes."""
    import cuda_cpu
    from test_rowconv import _relative, kept_round_trip
    size, k, pad, batch, channels = case
    p = _problem(size, k, pad, "fwd", batch=batch, channels=channels, layout=layout)
    sizes = planeconv.transform_sizes(p, smooth)
    kept = blockkept.PlaneKept(numpy, p, sizes, kernels=cuda_cpu.launchables(planeconv.source("float32", sizes),
                                                                             planeconv.KEPT_NAMES),
                               stream=cuda_cpu.Stream())
    x, w, dy, (y, dx, dw) = kept_round_trip(kept, p, seed=batch)
    assert _relative(y, _direct(p, x, w)) <= 1e-6
    assert _relative(dx, _direct(p.for_pass("dgrad"), dy, w)) <= 1e-6
    assert _relative(dw, _direct(p.for_pass("wgrad"), x, dy)) <= 1e-6


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("case, smooth", [(((9, 11), (3, 5), (1, 2), 5, 3), False), (((16, 16), 7, 3, 3, 2), True),
                                          (((20, 13), (13, 4), (6, 0), 1, 2), False)])
def test_fused_backward_passes_on_the_cpu(layout, case, smooth):
    """Both backward passes from one transform of each dy image (slices of two samples, an odd batch's last slice of
    one; the sums added by the filter gradient's sum kernel) from the forward pass's kept spectra, against their
    definitions in float64, both layouts, 2^a 3^b sizes."""
    import cuda_cpu
    from test_rowconv import fused_backward_matches
    size, k, pad, batch, channels = case
    p = _problem(size, k, pad, "fwd", batch=batch, channels=channels, layout=layout)
    sizes = planeconv.transform_sizes(p, smooth)
    names = planeconv.KEPT_NAMES + planeconv.FUSED_NAMES
    kept = blockkept.PlaneKept(numpy, p, sizes, stream=cuda_cpu.Stream(), fused=True,
                               kernels=cuda_cpu.launchables(planeconv.source("float32", sizes), names))
    assert planeconv.fused_slices(p) == (batch + 1) // 2
    fused_backward_matches(kept, p, _direct, seed=batch)


@pytest.mark.skipif(not __import__("os").environ.get("CONVTUNE_ASAN"), reason="CONVTUNE_ASAN=1 runs it (slow)")
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("case, smooth", [(((9, 11), (3, 5), (1, 2), 2, 3), False),
                                          (((20, 13), (13, 4), (6, 0), 3, 2), True)])
def test_kept_kernels_under_address_sanitizer(layout, case, smooth):
    from test_rowconv import kept_under_sanitizer
    size, k, pad, batch, channels = case
    p = _problem(size, k, pad, "fwd", batch=batch, channels=channels, layout=layout)
    sizes = planeconv.transform_sizes(p, smooth)
    run = kept_under_sanitizer(blockkept.PlaneKept, planeconv.source("float32", sizes), planeconv.KEPT_NAMES, p, sizes,
                               layout)
    assert run.returncode == 0, run.stderr[-3000:]
    run = kept_under_sanitizer(blockkept.PlaneKept, planeconv.source("float32", sizes),
                               planeconv.KEPT_NAMES + planeconv.FUSED_NAMES, p, sizes, layout, fused=True)
    assert run.returncode == 0, run.stderr[-3000:]

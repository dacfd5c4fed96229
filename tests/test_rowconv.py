"""The one-block row FFT (convtune.fft.rowconv): its algorithm in NumPy against float64 FFTs and direct convolution
on the CPU (Stockham passes, the real-row packing, the shifts), and its CUDA kernels against float64 on the GPU."""

import numpy
import pytest

from convtune.fft import blockkept, rowconv, rowmodel, rowsource
from convtune.problem import ConvProblem
from convtune.strategies import get_strategy


def _problem(n, k, pad, pass_="fwd", batch=2, channels=3, **extra):
    return ConvProblem.make(batch=batch, in_channels=channels, out_channels=channels, input_size=(n,), kernel_size=k,
                            padding=pad, groups=channels, pass_=pass_, **extra)


def _direct(p, a, b):
    """The pass by its definition, float64, channels-first (y[t] = sum_s x[t + s - pad] w[s])."""
    n, k, pad = p.input_size[0], p.kernel_size[0], p.padding[0]
    out_len = p.output_size[0]
    if p.pass_ == "fwd":
        x, w = a, b[:, 0]
        xp = numpy.zeros((p.batch, p.in_channels, n + 2 * pad + k))
        xp[:, :, pad:pad + n] = x
        return numpy.stack([(xp[:, :, t:t + k] * w).sum(-1) for t in range(out_len)], axis=-1)
    if p.pass_ == "dgrad":
        dy, w = a, b[:, 0]
        dx = numpy.zeros((p.batch, p.in_channels, n + 2 * pad + k))
        for t in range(out_len):
            dx[:, :, t:t + k] += dy[:, :, t:t + 1] * w
        return dx[:, :, pad:pad + n]
    x, dy = a, b
    xp = numpy.zeros((p.batch, p.in_channels, n + 2 * pad + k))
    xp[:, :, pad:pad + n] = x
    dw = numpy.stack([(xp[:, :, s:s + out_len] * dy).sum(axis=(0, 2)) for s in range(k)], axis=-1)
    return dw[:, None, :]


def _operands(p, seed=0):
    rng = numpy.random.default_rng(seed)
    a_shape, b_shape = p.operand_shapes
    return rng.standard_normal(a_shape), rng.standard_normal(b_shape)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 6, 8, 9, 12, 16, 32, 36, 64, 72, 81, 96, 128, 512, 1024])
@pytest.mark.parametrize("inverse", [False, True])
def test_stockham_passes_are_the_dft(m, inverse):
    rng = numpy.random.default_rng(m)
    z = rng.standard_normal((3, m)) + 1j * rng.standard_normal((3, m))
    ref = numpy.fft.ifft(z, axis=1) * m if inverse else numpy.fft.fft(z, axis=1)
    assert numpy.abs(rowmodel._stockham(z, inverse) - ref).max() <= 1e-11 * max(1.0, numpy.abs(ref).max())


@pytest.mark.parametrize("m, large", [(16, (16,)), (32, (16,)), (48, (16,)), (256, (16,)), (4096, (16,)),
                                      (9, (16, 9)), (27, (16, 9)), (72, (16, 9)), (81, (16, 9)), (144, (16, 9))])
@pytest.mark.parametrize("inverse", [False, True])
def test_large_radix_passes_are_the_dft(m, large, inverse):
    rng = numpy.random.default_rng(m)
    z = rng.standard_normal((2, m)) + 1j * rng.standard_normal((2, m))
    ref = numpy.fft.ifft(z, axis=1) * m if inverse else numpy.fft.fft(z, axis=1)
    assert set(rowsource.radices(m, large)) & {9, 16}
    assert numpy.abs(rowmodel._stockham(z, inverse, large) - ref).max() <= 1e-11 * numpy.abs(ref).max()


def test_larger_blocks_are_candidates_for_rows_a_block_runs_alone():
    assert rowconv.thread_options(4096) == [0] and rowconv.thread_options(8192) == [0]
    assert rowconv.thread_options(16384) == [0, 1024] and rowconv.thread_options(20736) == [0, 1024]
    source = rowconv.source("float32", 16384, "16", 1024)
    assert "#define T 1024\n" in source and "__launch_bounds__(T, 1)" in source  # (the filter gradient's: one block)
    assert "#define T 512\n" in rowconv.source("float32", 16384, "16")


def test_large_radices_are_candidates_where_they_save_passes():
    assert rowconv.radix_options(4096) == ["8", "16"] and rowconv.radix_options(64) == ["8"]
    assert rowconv.radix_options(81) == ["8", "16x9"] and rowconv.radix_options(20736) == ["8", "16", "16x9"]
    assert rowconv.radix_options(16384) == ["8", "16", "32"] and rowconv.radix_options(512) == ["8", "32"]
    assert rowconv.radix_options(16384, names=("16", "16x9")) == ["8", "16"]
    strategy = get_strategy("fft-row")
    from types import SimpleNamespace
    p = _problem(4096, 4096, 4095, "fwd", batch=4, channels=8)
    assert [c.label() for c in strategy.candidates(p, SimpleNamespace(name="cupy"))] == ["size=8192,radices=8",
                                                                                         "size=8192,radices=16"]


@pytest.mark.parametrize("m, expected", [(8, (8,)), (16, (8, 2)), (32, (8, 4)), (4096, (8, 8, 8, 8)),
                                         (16384, (8, 8, 8, 8, 4)), (2, (2,)), (72, (8, 3, 3)), (6, (2, 3))])
def test_radices(m, expected):
    assert rowsource.radices(m) == expected


def test_radices_refuse_other_primes():
    with pytest.raises(ValueError, match="2\\^a 3\\^b"):
        rowsource.radices(40)


@pytest.mark.parametrize("L", [16, 32, 64, 256])
def test_real_spectrum_and_inverse_match_numpy(L):
    rng = numpy.random.default_rng(L)
    rows = rng.standard_normal((4, L - 3))
    spec = rowmodel.model_spectrum(rows, L)
    padded = numpy.zeros((4, L))
    padded[:, :L - 3] = rows
    assert numpy.abs(spec - numpy.fft.rfft(padded, axis=1)).max() <= 1e-11 * L
    assert numpy.abs(rowmodel.model_inverse(spec, L) - padded).max() <= 1e-12 * L


CASES = [(16, 16, 15), (20, 7, 3), (33, 5, 0), (9, 9, 4), (40, 17, 16), (12, 3, 5), (7, 12, 3), (100, 31, 15),
         (64, 64, 63), (5, 1, 0), (300, 129, 64)]


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("n, k, pad", CASES)
def test_model_is_the_convolution(pass_, n, k, pad):
    """Every pass by the kernels' algorithm, at the smallest transform length and at twice it, against the
    definition: padding under, at and over the kernel's reach, kernels longer than the input."""
    p = _problem(n, k, pad, pass_)
    a, b = _operands(p, seed=n + k + pad)
    ref = _direct(p, a, b)
    L = rowconv.transform_size(p)
    for size in (L, 2 * L, rowconv.transform_size(p, smooth=True)):
        got = rowmodel.model(p, a, b, size)
        assert got.shape == p.result_shape
        assert numpy.abs(got - ref).max() <= 1e-10 * max(1.0, numpy.abs(ref).max()), (size, pass_)


def test_transform_below_the_minimum_is_refused():
    p = _problem(20, 7, 3)  # needs 23
    assert rowconv.transform_size(p) == 32
    assert "below the 23" in rowconv.reason(p, 16)
    assert "an even 2^a 3^b" in rowconv.reason(p, 40) and "an even 2^a 3^b" in rowconv.reason(p, 27)
    assert rowconv.size_options(p) == [32, 24]
    same = _problem(4096, 31, 15)
    assert rowconv.size_options(same) == [8192, 4374]  # (the 2^a 3^b length: about half the points)
    assert rowconv.size_options(_problem(40000, 3, 1)) == [41472]  # (65536 would not fit a block)
    with pytest.raises(ValueError, match="below the 23"):
        rowmodel.model(p, *_operands(p), L=16)


@pytest.mark.parametrize("changes, words", [
    (dict(input_size=(9, 9), kernel_size=3), "is 1-D"),
    (dict(groups=1), "not a depthwise"),
    (dict(stride=2), "stride 2"),
    (dict(dilation=2), "dilation 2"),
    (dict(input_size=(60000,), kernel_size=3), "KiB of shared memory"),
])
def test_reasons(changes, words):
    base = dict(batch=1, in_channels=4, out_channels=4, input_size=(30,), kernel_size=5, padding=2, groups=4)
    p = ConvProblem.make(**{**base, **changes})
    assert words in rowconv.reason(p)


def test_hyena_and_16k_rows_fit_one_block():
    hyena = _problem(4096, 4096, 4095, batch=4, channels=768)
    long16k = _problem(16384, 16384, 16383, batch=2, channels=256)
    assert rowconv.transform_size(hyena) == 8192 and rowconv.reason(hyena) is None
    assert rowconv.transform_size(long16k) == 32768 and rowconv.reason(long16k) is None
    assert rowconv.smem_bytes(16384) <= 227 * 1024  # the H100's most per block
    assert rowconv.threads(16384) == 512 and rowconv.threads(4096) == 512 and rowconv.threads(64) == 8
    # the filter gradient keeps its frequency pairs in registers up to 16384-sample rows, in the workspace beyond
    assert rowconv.workspace_bytes(hyena.for_pass("wgrad"), 8192) == 0
    assert rowconv.workspace_bytes(long16k.for_pass("wgrad"), 32768) == 2 * 256 * 8 * 16385
    assert rowconv.workspace_bytes(hyena, 8192) == 768 * 8 * 4097


def test_strategy_is_gpu_only_and_serves_1d_depthwise_shapes():
    from convtune.backend import get_backend
    numpy_backend = get_backend("numpy")
    strategy = get_strategy("fft-row")
    p = _problem(100, 31, 15)
    assert "GPU" in strategy.supports(p, numpy_backend)
    assert strategy.serves_shape(p)
    assert not strategy.serves_shape(ConvProblem.make(batch=1, in_channels=4, out_channels=4, input_size=(9, 9),
                                                      kernel_size=3, groups=4))
    assert not strategy.serves_shape(_problem(100, 31, 15).replace(groups=1, out_channels=3))


def test_candidates_compile_together_before_they_are_verified(monkeypatch):
    """prepare hands every candidate's executor (its kernels compiled on construction) to build_concurrently, on the
    GPU only."""
    from types import SimpleNamespace
    from convtune import compiling
    built, handed = [], []
    monkeypatch.setattr(rowconv, "RowFftConv", lambda xp, p, L, radix: built.append((L, radix)))
    monkeypatch.setattr(compiling, "build_concurrently", lambda builds, backend: handed.append(list(builds)))
    strategy, p = get_strategy("fft-row"), _problem(3000, 1001, 500)
    configs = strategy.candidates(p, SimpleNamespace(name="cupy"))
    assert len(configs) > 1
    strategy.prepare(p, configs, SimpleNamespace(name="cupy", xp=None))
    assert len(handed) == 1 and len(handed[0]) == len(configs)
    for build in handed[0]:
        build()
    assert built == [(c.size, c.radices) for c in configs]
    strategy.prepare(p, configs, SimpleNamespace(name="numpy", xp=None))
    assert len(handed) == 1


def test_source_names_every_pass():
    src = rowconv.source("bfloat16", 16384)
    # radices 8, 8, 8, 8, 4: the forward's first pass reads the row, the inverse's last writes the result
    assert "first_pass_from_row<8, 4>(buf, row, s, n);" in src
    assert "stockham_pass<16384, 8, false, 512, 4>(buf, 1, 512, row_slot, root);" in src
    assert "stockham_pass<16384, 4, false, 512, 8>(buf, 1, 4096, row_slot, root);" in src
    assert "stockham_pass<16384, 8, true, 512, 4>(buf, 1, 1, row_slot, root);" in src
    assert "last_pass_to_row<4, 8>(buf, row, s, n, shift, scale, root);" in src
    assert "stockham_pass<16384, 4, true" not in src and "stockham_pass<16384, 8, false, 512, 4>(buf, 1, 1," not in src
    assert "#define T 512" in src and "#define PADI(i) ((i) + ((i) >> 3))" in src
    assert "rowfft_wgrad(const b16* x" in src
    # past MAX_TABLE the twiddles are computed; up to it they are a table of the transform's roots
    assert "const ChainRoots root;" in src and "ROOTS" not in src
    src = rowconv.source("float32", 4096)
    assert "const RootTable4096 root;" in src and "__device__ const float2 ROOTS4096[4096] = {{1.0e+00f,0.0e+00f}," in src


def test_root_tables_hold_the_roots():
    src = rowsource.roots_source(24)
    body = src[src.index("= {{") + 4:src.index("}};")]
    values = numpy.array([complex(*(float(x.rstrip("f")) for x in pair.split(","))) for pair in body.split("},{")])
    assert values.shape == (24,)
    assert numpy.abs(values - numpy.exp(-2j * numpy.pi * numpy.arange(24) / 24)).max() < 1e-7
    assert rowsource.roots_source(rowsource.MAX_TABLE * 2) == "" and rowsource.root_type(rowsource.MAX_TABLE * 2) == "ChainRoots"


# -- the kernels, on the GPU ------------------------------------------------------------------------------------------
GPU_CASES = [
    # (n, k, pad, batch, channels): odd lengths; padding under, at and over the kernel's reach; the smallest rows;
    # hyena-long-dw's and long-16k-dw's transform lengths (8192, 32768) on few channels
    (16, 16, 15, 2, 4), (37, 11, 5, 3, 5), (100, 31, 15, 2, 3), (129, 200, 150, 2, 2), (1000, 257, 0, 1, 3),
    (4096, 4096, 4095, 2, 3), (3001, 1500, 700, 2, 2), (16384, 16384, 16383, 2, 2), (5, 1, 0, 2, 3),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", GPU_CASES)
def test_kernels_match_float64(dtype, layout, pass_, case):
    import cuda_cpu
    n, k, pad, batch, channels = case
    if dtype != "float32" and n > 4096:
        pytest.skip("half precision on the long rows: covered by the shorter ones")
    p = _problem(n, k, pad, pass_, batch=batch, channels=channels, dtype=dtype, layout=layout)
    errors = cuda_cpu.gpu_errors("fft-row", p, seed=n + k)
    bound = 1e-5 if dtype == "float32" else p.tolerance
    assert all(err <= bound for err in errors.values()), f"{errors} on {p.describe()}"


# -- the kernels' own source, run on the CPU (tests/cuda_cpu.py) ----------------------------------------------------
class _FakeCupy:
    """:class:`rowconv.RowFftConv` asks nothing of CuPy but its kernels, which the CPU tests pass."""


def _cpu_kernels(dtype, m, radix="8"):
    import cuda_cpu
    return cuda_cpu.launchables(rowconv.source(dtype, m, radix), rowconv.NAMES)


CPU_KERNEL_CASES = [(16, 16, 15, 2, 3), (37, 11, 5, 3, 2), (100, 31, 15, 2, 3), (129, 200, 150, 1, 2), (5, 1, 0, 2, 2),
                    (20, 7, 30, 1, 2)]


@pytest.mark.parametrize("dtype, layout", [("float32", "channels_first"), ("float32", "channels_last"),
                                           ("bfloat16", "channels_first")])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", CPU_KERNEL_CASES)
def test_kernel_source_on_the_cpu(dtype, layout, pass_, case):
    """The CUDA source itself, threads emulated: every pass, strides of both layouts, bfloat16's loads and stores,
    against the definition in float64 (float16's conversions are inline PTX: GPU only)."""
    import cuda_cpu
    n, k, pad, batch, channels = case
    p = _problem(n, k, pad, pass_, batch=batch, channels=channels, dtype=dtype, layout=layout)
    L = rowconv.transform_size(p)
    conv = rowconv.RowFftConv(_FakeCupy, p, L, kernels=_cpu_kernels(dtype, L // 2))
    got, a64, b64 = cuda_cpu.run_launch(conv, p, *_operands(p, seed=n * k))
    ref = _direct(p, a64, b64)
    err = numpy.linalg.norm(got - ref) / numpy.linalg.norm(ref)
    assert err <= (1e-6 if dtype == "float32" else 8e-3), err


def test_launch_without_workspace_is_refused():
    p = _problem(40, 7, 3)
    conv = rowconv.RowFftConv(_FakeCupy, p, kernels=(None,) * 4)
    with pytest.raises(ValueError, match=f"workspace of {conv.workspace} bytes"):
        conv.launch(0, 0, 0, None)


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case, length", [((50, 5, 2, 2, 3), 54), ((150, 9, 4, 2, 2), 162), ((37, 11, 5, 3, 2), 48),
                                          ((1400, 31, 15, 1, 1), 1458), ((20, 7, 30, 1, 2), 96)])
def test_kernel_source_on_the_cpu_at_smooth_lengths(pass_, case, length):
    """Even 2^a 3^b transform lengths (radix-3 passes, rows of an odd number of points: 54 samples are 27 points),
    both layouts."""
    import cuda_cpu
    n, k, pad, batch, channels = case
    for layout in ("channels_first", "channels_last"):
        p = _problem(n, k, pad, pass_, batch=batch, channels=channels, layout=layout)
        L = rowconv.transform_size(p, smooth=True)
        assert L == length
        conv = rowconv.RowFftConv(_FakeCupy, p, L, kernels=_cpu_kernels("float32", L // 2))
        got, a64, b64 = cuda_cpu.run_launch(conv, p, *_operands(p, seed=n))
        ref = _direct(p, a64, b64)
        assert numpy.linalg.norm(got - ref) / numpy.linalg.norm(ref) <= 1e-6, (L, layout)


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", [(1000, 37, 18, 1, 2), (8000, 300, 150, 1, 1), (16384, 16384, 16383, 1, 1)])
def test_kernel_source_on_the_cpu_long_rows(pass_, case):
    """Rows of 2048, 16384 and 32768 samples: 128 and 512 threads, several butterflies per thread (the long-16k
    layer's transform length)."""
    test_kernel_source_on_the_cpu("float32", "channels_first", pass_, case)


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case, smooth, radix", [((16, 16, 15, 2, 3), False, "16"), ((37, 11, 5, 3, 2), False, "16"),
                                                 ((1000, 37, 18, 1, 2), False, "16"), ((4096, 4096, 4095, 1, 1), False, "16"),
                                                 ((50, 5, 2, 2, 3), True, "16x9"), ((150, 9, 4, 2, 2), True, "16x9"),
                                                 ((1000, 37, 18, 1, 2), False, "32"), ((700, 31, 15, 1, 2), True, "32"),
                                                 ((300, 200, 199, 2, 1), False, "32")])
def test_kernel_source_on_the_cpu_large_radices(pass_, case, smooth, radix):
    """Radix-16 passes first (rows of 16, 32, 1024 and 4096 points; on the longest, half the block's threads wait
    out the 16-point passes), radix 9 (rows of 27 and 81 points) and radix 32 (rows of 256 (32 x 8), 384 (32 x 4 x 3)
    and 512 (32 x 16) points), both layouts, against float64."""
    import cuda_cpu
    n, k, pad, batch, channels = case
    for layout in ("channels_first", "channels_last"):
        p = _problem(n, k, pad, pass_, batch=batch, channels=channels, layout=layout)
        L = rowconv.transform_size(p, smooth=smooth)
        assert set(rowsource.radices(L // 2, rowconv.RADICES[radix])) & {9, 16, 32}
        conv = rowconv.RowFftConv(_FakeCupy, p, L, kernels=_cpu_kernels("float32", L // 2, radix))
        got, a64, b64 = cuda_cpu.run_launch(conv, p, *_operands(p, seed=n))
        ref = _direct(p, a64, b64)
        assert numpy.linalg.norm(got - ref) / numpy.linalg.norm(ref) <= 1e-6, (L, layout)


@pytest.mark.skipif(not __import__("os").environ.get("CONVTUNE_ASAN"), reason="CONVTUNE_ASAN=1 runs it (slow)")
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("n, smooth, radix", [(4096, False, "16"), (150, True, "16x9")])
def test_large_radix_kernel_source_under_address_sanitizer(pass_, n, smooth, radix):
    import cuda_cpu
    p = _problem(n, n if n == 4096 else 9, n - 1 if n == 4096 else 4, pass_, batch=1, channels=2)
    L = rowconv.transform_size(p, smooth=smooth)
    kernels, calls = cuda_cpu.recorders(rowconv.NAMES)
    conv = rowconv.RowFftConv(_FakeCupy, p, L, kernels=kernels, radix=radix)
    run = cuda_cpu.sanitized(rowconv.source("float32", L // 2, radix), conv, p, calls)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.skipif(not __import__("os").environ.get("CONVTUNE_ASAN"), reason="CONVTUNE_ASAN=1 runs it (slow)")
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", [(37, 11, 5, 3, 2), (20, 7, 30, 1, 2), (8000, 300, 150, 1, 1),
                                  (16384, 16384, 16383, 1, 1), (50, 5, 2, 2, 3), (1400, 31, 15, 1, 1)])
def test_kernel_source_under_address_sanitizer(layout, pass_, case):
    import cuda_cpu
    n, k, pad, batch, channels = case
    p = _problem(n, k, pad, pass_, batch=batch, channels=channels, layout=layout)
    L = rowconv.transform_size(p, smooth=n in (50, 1400))  # (two cases at 2^a 3^b lengths: 54 and 1458)
    kernels, calls = cuda_cpu.recorders(rowconv.NAMES)
    conv = rowconv.RowFftConv(_FakeCupy, p, L, kernels=kernels)
    run = cuda_cpu.sanitized(rowconv.source("float32", L // 2), conv, p, calls)
    assert run.returncode == 0, run.stderr[-3000:]


# -- kept spectra: a round trip's executor (convtune.roundtrip's block product) ----------------------------------------
def kept_round_trip(kept, p, seed):
    """``(errors fwd/dgrad/wgrad)`` of one round trip through ``kept`` (a :class:`blockkept.KeptBlockFft`) against the
    passes' definitions in float64 (``_direct`` of the module that calls it)."""
    rng = numpy.random.default_rng(seed)
    x, w, dy = (rng.standard_normal(s).astype(numpy.float32) for s in (p.x_shape, p.w_shape, p.y_shape))
    xs, ws = kept.x_spectrum(x), kept.w_spectrum(w)
    y = kept.forward_from(xs, ws, numpy.empty(p.y_shape, numpy.float32))
    dys = kept.dy_spectrum(dy)
    dx = kept.backward_data_from(dys, ws, numpy.empty(p.x_shape, numpy.float32))
    dw = kept.backward_filter_from([(dys, xs)], numpy.empty(p.w_shape, numpy.float32))
    return x.astype(numpy.float64), w.astype(numpy.float64), dy.astype(numpy.float64), (y, dx, dw)


def _relative(got, ref):
    return numpy.linalg.norm(got - ref) / numpy.linalg.norm(ref)


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("case, smooth, block", [((16, 16, 15, 2, 3), False, 0), ((37, 11, 5, 3, 2), False, 0),
                                                 ((20, 7, 30, 2, 2), False, 0), ((50, 5, 2, 2, 3), True, 0),
                                                 ((37, 11, 5, 3, 2), False, 24)])
def test_kept_round_trip_on_the_cpu(layout, case, smooth, block):
    """The kept-spectra kernels (x's, w's and dy's spectra made once each; the passes from them), every pass against
    its definition in float64, both layouts, padding past the kernel's reach, a 2^a 3^b length, a block of more
    threads than the passes' butterflies (as 1024-thread blocks of 16384-point rows' radix-16 passes are not)."""
    import cuda_cpu
    n, k, pad, batch, channels = case
    p = _problem(n, k, pad, "fwd", batch=batch, channels=channels, layout=layout)
    L = rowconv.transform_size(p, smooth=smooth)
    assert block == 0 or block > rowconv.threads(L // 2)
    kept = blockkept.RowKept(numpy, p, L, threads=block, stream=cuda_cpu.Stream(), kernels=cuda_cpu.launchables(
        rowconv.source("float32", L // 2, block=block), rowconv.KEPT_NAMES))
    x, w, dy, (y, dx, dw) = kept_round_trip(kept, p, seed=n)
    assert _relative(y, _direct(p, x, w)) <= 1e-6
    assert _relative(dx, _direct(p.for_pass("dgrad"), dy, w)) <= 1e-6
    assert _relative(dw, _direct(p.for_pass("wgrad"), x, dy)) <= 1e-6


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("case, smooth, block", [((16, 16, 15, 2, 3), False, 0), ((37, 11, 5, 3, 2), False, 0),
                                                 ((20, 7, 30, 2, 2), False, 0), ((50, 5, 2, 2, 3), True, 0),
                                                 ((37, 11, 5, 3, 2), False, 24)])
def test_fused_backward_passes_on_the_cpu(layout, case, smooth, block):
    """Both backward passes in one kernel (dy's rows transformed once, dw's sums in registers) from the forward
    pass's kept spectra, against their definitions in float64: both layouts, padding past the kernel's reach, a 2^a 3^b
    length, more threads than butterflies."""
    import cuda_cpu
    n, k, pad, batch, channels = case
    p = _problem(n, k, pad, "fwd", batch=batch, channels=channels, layout=layout)
    L = rowconv.transform_size(p, smooth=smooth)
    names = rowconv.KEPT_NAMES + (rowconv.BOTH_NAME,)
    kept = blockkept.RowKept(numpy, p, L, threads=block, stream=cuda_cpu.Stream(), fused=True,
                             kernels=cuda_cpu.launchables(rowconv.source("float32", L // 2, block=block), names))
    fused_backward_matches(kept, p, _direct, seed=n)


def fused_backward_matches(kept, p, direct, seed):
    """Both gradients from ``kept.backward_both`` (after the forward pass kept x's spectra) against ``direct``, the
    passes' definitions in float64 (of the module that calls it)."""
    rng = numpy.random.default_rng(seed)
    x, w, dy = (rng.standard_normal(s).astype(numpy.float32) for s in (p.x_shape, p.w_shape, p.y_shape))
    ws = kept.w_spectrum(w)
    xs = kept.forward_keeping(x, ws, numpy.empty(p.y_shape, numpy.float32))
    dx, dw = kept.backward_both(dy, ws, xs, numpy.full(p.x_shape, numpy.nan, numpy.float32),
                                numpy.full(p.w_shape, numpy.nan, numpy.float32))
    x, w, dy = (a.astype(numpy.float64) for a in (x, w, dy))
    assert _relative(dx, direct(p.for_pass("dgrad"), dy, w)) <= 1e-6
    assert _relative(dw, direct(p.for_pass("wgrad"), x, dy)) <= 1e-6


def test_fused_backward_passes_need_room_for_the_sums():
    assert rowconv.fused_backward_fits(4096) and rowconv.fused_backward_fits(8192)
    assert not rowconv.fused_backward_fits(16384) and rowconv.both_smem_bytes(4096) == 36864 + 8 * 4097
    with pytest.raises(ValueError, match="too many"):
        blockkept.RowKept(numpy, _problem(16384, 16384, 16383), 32768, fused=True, kernels=(None,) * 7)


def test_kept_round_trip_refuses_what_it_cannot_run():
    p = _problem(40, 7, 3)
    with pytest.raises(ValueError, match="float32 layers only"):
        blockkept.RowKept(numpy, p.replace(dtype="bfloat16"), 64, kernels=(None,) * 4)
    with pytest.raises(ValueError, match="below"):
        blockkept.RowKept(numpy, p, 16, kernels=(None,) * 4)


def kept_under_sanitizer(kept_type, source, names, p, transform, layout, **extra):
    """The kept-spectra kernels' launches of one round trip (every method of ``kept_type``) as a standalone program
    under AddressSanitizer, each buffer of exactly its size (operands and results in ``layout``'s memory, so the
    launches read them in place)."""
    import cuda_cpu
    from convtune import precision
    kernels, calls = cuda_cpu.recorders(names)
    kept = kept_type(numpy, p, transform, kernels=kernels, stream=cuda_cpu.Stream(), **extra)
    made = []  # (what the executor allocates itself: spectra, the fused passes' sums)

    class Recording:
        def __getattr__(self, name):
            return getattr(numpy, name)

        def empty(self, *args, **kwargs):
            made.append(numpy.empty(*args, **kwargs))
            return made[-1]
    kept.xp = Recording()
    arrays = {name: precision.empty_in(numpy, shape, "float32", layout)
              for name, shape in (("x", p.x_shape), ("w", p.w_shape), ("dy", p.y_shape), ("y", p.y_shape),
                                  ("dx", p.x_shape), ("dw", p.w_shape))}
    for a in arrays.values():
        a[...] = 1.0
    x, w, dy, y, dx, dw = arrays.values()
    spectra = {"ws": kept.w_spectrum(w), "xs": kept.x_spectrum(x), "dys": kept.dy_spectrum(dy)}
    kept.forward_from(spectra["xs"], spectra["ws"], y)
    kept.backward_data_from(spectra["dys"], spectra["ws"], dx)
    kept.backward_filter_from([(spectra["dys"], spectra["xs"])], dw)
    spectra["xs2"] = kept.forward_keeping(x, spectra["ws"], y)
    spectra["dys2"] = kept.backward_data_keeping(dy, spectra["ws"], dx)
    if getattr(kept, "fused", False):
        kept.backward_both(dy, spectra["ws"], spectra["xs"], dx, dw)
    every = {**{f"made{i}": a for i, a in enumerate(made)}, **arrays, **spectra}
    buffers = {kept._ptr(a): (name, a.nbytes // 4) for name, a in every.items()}
    return cuda_cpu.sanitized_calls(source, buffers, calls)


@pytest.mark.skipif(not __import__("os").environ.get("CONVTUNE_ASAN"), reason="CONVTUNE_ASAN=1 runs it (slow)")
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("case, smooth", [((37, 11, 5, 3, 2), False), ((20, 7, 30, 1, 2), False),
                                          ((50, 5, 2, 2, 3), True)])
def test_kept_kernels_under_address_sanitizer(layout, case, smooth):
    n, k, pad, batch, channels = case
    p = _problem(n, k, pad, "fwd", batch=batch, channels=channels, layout=layout)
    L = rowconv.transform_size(p, smooth=smooth)
    run = kept_under_sanitizer(blockkept.RowKept, rowconv.source("float32", L // 2), rowconv.KEPT_NAMES, p, L, layout)
    assert run.returncode == 0, run.stderr[-3000:]
    run = kept_under_sanitizer(blockkept.RowKept, rowconv.source("float32", L // 2),
                               rowconv.KEPT_NAMES + (rowconv.BOTH_NAME,), p, L, layout, fused=True)
    assert run.returncode == 0, run.stderr[-3000:]


def test_shared_memory_pad_follows_the_first_radix():
    """A pad after as many points as the first pass's radix (its butterflies write their points that far apart),
    never more pads than smem_bytes counts (one after every 8 points)."""
    assert rowsource.pad_shift(16384, rowconv.RADICES["32"]) == 5
    assert rowsource.pad_shift(4096, rowconv.RADICES["16"]) == 4
    assert rowsource.pad_shift(4096) == rowsource.pad_shift(8) == rowsource.pad_shift(12) == 3
    assert "#define PADI(i) ((i) + ((i) >> 5))" in rowconv.source("float32", 16384, "32")
    assert "#define PADI(i) ((i) + ((i) >> 4))" in rowconv.source("float32", 4096, "16")
    assert rowconv.smem_bytes(16384) == 8 * (16384 + 16384 // 8)

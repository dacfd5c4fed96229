"""Round trips with kept spectra of dense 2-D layers on the one-block image transforms (:mod:`convtune.fft.planeconv`):
the executor of :class:`convtune.roundtrip.RoundTrip`'s ``block`` product for float32 channels-first layers of one
group, stride and dilation 1.

The depthwise kernels of :class:`convtune.fft.blockkept.PlaneKept` transform every image of an operand once and write
its spectrum (``L0 x (L1 / 2 + 1)`` complex64 in the kernels' own frequency order, rows of them one after another:
the packed layout, frequencies contiguous); a dense layer's operands are such stacks of images (x: ``n x C``, dy:
``n x K``, w: ``K x C`` images of the kernel's size). The channels are mixed per frequency by a batched complex
product on that layout (:func:`convtune.fft.narrow.product` where a side has at most 16 rows or columns, else
:func:`convtune.fft.packedgemm.product`; their launches made once per executor):

* forward: ``Y[n, k] = sum_c X[n, c] conj(W[k, c])``;
* backward-data: ``DX[n, c] = sum_k DY[n, k] W[k, c]``;
* filter gradient: ``DW[k, c] = sum_n conj(DY[n, k]) X[n, c]``;

and each result's inverse is the depthwise kernels' forward or backward-data pass over a stack of one-channel images
against one filter spectrum of ones (one kernel: the inverse, the crop and the scale, the result written in place).
The filter gradient's crop (the kernel's extent, at the forward pass's shift) is the forward pass of a stand-in image
problem whose output has the kernel's size (:func:`crop_problem`).
"""

from __future__ import annotations

from ..problem import ConvProblem
from . import narrow, packedgemm, planeconv
from .blockkept import PlaneKept


def image_problem(p: ConvProblem, batch: int, channels: int = 1, input_size=None, kernel_size=None) -> ConvProblem:
    """The depthwise problem of ``batch x channels`` images of dense ``p``'s geometry (float32, channels-first; or of
    ``input_size`` and ``kernel_size`` at ``p``'s padding): what :class:`PlaneKept` transforms or inverts for ``p``."""
    return ConvProblem.make(batch=batch, in_channels=channels, out_channels=channels, groups=channels,
                            input_size=input_size or p.input_size, kernel_size=kernel_size or p.kernel_size,
                            padding=p.padding)


def crop_problem(p: ConvProblem) -> ConvProblem:
    """The image problem whose forward pass inverts a filter gradient's ``K x C`` spectra into ``p``'s kernel: an
    output of the kernel's size at ``p``'s padding (the filter gradient's crop starts where the forward pass's does,
    ``-padding`` cyclically), from a kernel of the fewest taps that leaves an input of at least one sample."""
    taps = tuple(max(1, 2 * pad - k + 2) for pad, k in zip(p.padding, p.kernel_size))
    size = tuple(k - 2 * pad + t - 1 for k, pad, t in zip(p.kernel_size, p.padding, taps))
    return image_problem(p, p.out_channels * p.in_channels, 1, size, taps)


def _stacks(p: ConvProblem) -> tuple[ConvProblem, ...]:
    """The image problems of x (and dx), dy (and y), w (its transform) and dw (its inverse)."""
    return (image_problem(p, p.batch * p.in_channels), image_problem(p, p.batch * p.out_channels),
            image_problem(p, 1, p.out_channels * p.in_channels), crop_problem(p))


def unsupported_reason(problem: ConvProblem, sizes=None) -> str | None:
    """Why :class:`DenseBlockKept` cannot run ``problem`` (its forward problem) at transform ``sizes`` (default
    :func:`convtune.fft.planeconv.transform_sizes` of its images), or ``None``."""
    p = problem.for_pass("fwd")
    if p.rank != 2:
        return f"the dense image FFT round trip is 2-D, not rank {p.rank}"
    if p.groups != 1:
        return f"{p.groups} groups: the dense image FFT round trip takes one"
    if any(v != 1 for v in p.stride + p.dilation):
        return "stride and dilation must be 1"
    if p.dtype != "float32" or p.layout != "channels_first":
        return f"{p.dtype} {p.layout}: the dense image FFT round trip reads float32 channels-first layers"
    for q in _stacks(p):
        for pass_ in ("fwd", "dgrad", "wgrad"):
            why = planeconv.reason(q.for_pass(pass_), sizes)
            if why:
                return why
    return None


def size_options(problem: ConvProblem) -> list[tuple[int, int]]:
    """The transform sizes of ``problem``'s images (:func:`convtune.fft.planeconv.size_options`) it runs at."""
    p = problem.for_pass("fwd")
    if p.rank != 2 or p.groups != 1:
        return []
    return [s for s in planeconv.size_options(_stacks(p)[0]) if unsupported_reason(p, s) is None]


class DenseBlockKept:
    """The kept-spectra executor of a dense 2-D layer on the one-block image transforms (see the module docstring):
    ``x_spectrum``, ``w_spectrum``, ``dy_spectrum``, then ``forward_from``, ``backward_data_from`` and
    ``backward_filter_from``, as :class:`convtune.fft.blockkept.KeptBlockFft`'s. ``kernels``: the image transforms'
    launchables (default: compiled for the current device; the CPU tests pass stand-ins)."""

    what = "the dense image FFT round trip"
    fused = False  # (both backward passes from one transform of dy: the depthwise trips' only)

    def __init__(self, xp, problem: ConvProblem, sizes, radix: str = "8", shape=None, kernels=None, stream=None):
        self.xp, self.p = xp, problem.for_pass("fwd")
        self.sizes = sizes = tuple(sizes)
        why = unsupported_reason(self.p, sizes)
        if why:
            raise ValueError(f"{self.what}: {why}")
        # (the stacks share one compiled module: the same sizes, radices and launch shape)
        self._x, self._y, self._w, self._dw = (PlaneKept(xp, q, sizes, radix, shape, kernels=kernels, stream=stream)
                                               for q in _stacks(self.p))
        self.F = self._x.spectrum_elems
        self._ones = xp.ones(self.F, dtype=xp.complex64)  # (the filter spectrum every inverse is taken against)
        p = self.p
        thin = narrow.unsupported_reason(p.in_channels, p.out_channels, p.batch) is None
        self.product = narrow.product if thin else packedgemm.product
        self._mixes = self.mixes(self.product)

    def mixes(self, product) -> dict:
        """Per pass, ``(rows, cols, run)``: its channel mixing's launch by ``product`` (:func:`convtune.fft.narrow.
        product` or :func:`convtune.fft.packedgemm.product`), made once (operands as the pass hands them, in rows of
        F frequencies: x's n x C, dy's n x K, w's K x C)."""
        n, C, K, F = self.p.batch, self.p.in_channels, self.p.out_channels, self.F
        return {"fwd": (n, K, product(n, K, C, F, (C, 1, 1, C, K, 1), False, True, 1.0, False)),  # X conj(W)^T
                "dgrad": (n, C, product(n, C, K, F, (K, 1, C, 1, C, 1), False, False, 1.0, False)),  # DY W
                "wgrad": (K, C, product(K, C, n, F, (1, K, C, 1, C, 1), True, False, 1.0, False))}  # conj(DY)^T X

    def _mix(self, pass_: str, a, b):
        """The pass's mixed spectra (``rows x cols`` of them) of the spectra ``a`` and ``b``."""
        rows, cols, run = self._mixes[pass_]
        out = self.xp.empty(rows * cols * self.F, dtype=self.xp.complex64)
        run(a, b, out)
        return out

    def _into(self, out, shape, run):
        """``run(view)`` writes a result of ``shape`` (its images' stack) into ``out`` (through a copy where ``out``
        is not contiguous, so no view of it has that shape)."""
        if out.flags.c_contiguous:
            run(out.reshape(shape))
        else:
            out[...] = run(self.xp.empty(shape, dtype=out.dtype)).reshape(out.shape)
        return out

    def x_spectrum(self, x):
        return self._x.x_spectrum(x.reshape(self._x.p.x_shape))

    def w_spectrum(self, w):
        return self._w.w_spectrum(w.reshape(self._w.p.w_shape))

    def dy_spectrum(self, dy):
        return self._y.dy_spectrum(dy.reshape(self._y.p.y_shape))

    def forward_from(self, xs, ws, out):
        ys = self._mix("fwd", xs, ws)
        return self._into(out, self._y.p.y_shape, lambda view: self._y.forward_from(ys, self._ones, view))

    def backward_data_from(self, dys, ws, out):
        dxs = self._mix("dgrad", dys, ws)
        return self._into(out, self._x.p.x_shape, lambda view: self._x.backward_data_from(dxs, self._ones, view))

    def backward_filter_from(self, pairs, out):
        """``out`` = the filter gradient from ``[(dy spectra, x spectra)]`` (one pair: the whole batch)."""
        (dys, xs), = pairs
        dws = self._mix("wgrad", dys, xs)
        return self._into(out, self._dw.p.y_shape, lambda view: self._dw.forward_from(dws, self._ones, view))

"""Round trips with kept spectra on the one-block transforms (:mod:`convtune.fft.rowconv`,
:mod:`convtune.fft.planeconv`): the executors of :class:`convtune.roundtrip.RoundTrip`'s ``block`` product, for
float32 depthwise 1-D and 2-D layers.

Each operand's rows or images are transformed once (the forward pass writes x's spectra as it runs, backward-data
dy's), and the filter gradient sums the kept spectra per channel with one inverse each: four transforms a sample
where three per-pass plans make six. The kernels are the strategies' (the ``KEPT_NAMES`` of their sources).
"""

from __future__ import annotations

import math

import numpy

from ..compiling import compiled_once, launchables
from ..precision import from_launch, launch_memory, launch_strides
from ..problem import ConvProblem
from . import planeconv, rowconv


@compiled_once
def row_kernels(dtype: str, m: int, radix: str, block: int, fused: bool, device_id: int):
    """:data:`convtune.fft.rowconv.KEPT_NAMES` (and with ``fused`` :data:`~convtune.fft.rowconv.BOTH_NAME`) for
    ``dtype`` and ``m``-point rows (``block`` threads a block, 0: :func:`convtune.fft.rowconv.threads`), compiled once
    per device."""
    names = rowconv.KEPT_NAMES + ((rowconv.BOTH_NAME,) if fused else ())
    smem = rowconv.both_smem_bytes(m) if fused else rowconv.smem_bytes(m)
    return launchables(rowconv.source(dtype, m, radix, block), names, smem, device_id)


class KeptBlockFft:
    """What :class:`RowKept` and :class:`PlaneKept` share: the executor of a round trip with
    kept spectra (:class:`convtune.roundtrip.RoundTrip`'s ``block`` product) on the one-block transforms. The forward
    problem ``p``'s three passes: ``x_spectrum``, ``w_spectrum``, ``dy_spectrum`` (one kernel each: every row or image
    transformed once, its spectrum written), then ``forward_from``, ``backward_data_from`` (a kernel each: the product,
    the inverse, the result in the layer's layout) and ``backward_filter_from`` (a kernel: the batch's products
    summed per channel, one inverse each). ``forward_keeping`` and ``backward_data_keeping`` run a pass from its
    operand in one kernel that also writes the operand's spectra (what :class:`~convtune.roundtrip.RoundTrip` runs
    where it can). Float32 in either layout. Subclasses set ``what``, ``spectrum_elems`` (per row or image),
    ``block``, ``smem`` and the ``kernels`` (as the ``KEPT_NAMES`` of :mod:`~convtune.fft.rowconv` and
    :mod:`~convtune.fft.planeconv`: spectrum, fwd_from, dgrad_from, wgrad_from,
    fwd_keep, dgrad_keep), and give :meth:`_sizes_args`, the transform's per-pass arguments."""

    what = "the block FFT round trip"
    spectrum_elems = 0

    def __init__(self, xp, problem: ConvProblem, stream=None):
        self.xp, self.p = xp, problem.for_pass("fwd")
        if self.p.dtype != "float32":
            raise ValueError(f"{self.what}: float32 layers only (the problem is {self.p.dtype})")
        self.stream = stream  # None: CuPy's current stream at each launch (the CPU tests pass a stand-in)
        self._made_args: dict = {}  # what _pass_args and _strides make once per executor (the shapes are fixed)

    @staticmethod
    def _ptr(a) -> int:
        return a.data.ptr if hasattr(a.data, "ptr") else a.ctypes.data

    @staticmethod
    def _device(xp) -> int:
        """The current device's id (``-1`` off the GPU: the CPU tests' NumPy arrays)."""
        return xp.cuda.Device().id if hasattr(xp, "cuda") else -1

    def _launch(self, kernel, grid, args, smem: int | None = None) -> None:
        stream = self.stream
        if stream is None and hasattr(self.xp, "cuda"):
            stream = self.xp.cuda.get_current_stream()
        kernel(grid, self.block, args, self.smem if smem is None else smem, stream)

    def _spectra(self, shape):
        """Room for the spectra of every row or image of an operand of logical ``shape``."""
        return self.xp.empty(shape[0] * shape[1] * self.spectrum_elems, dtype=self.xp.complex64)

    def _spectrum(self, a, shape, extent) -> object:
        """Every row or image of ``a`` (logical ``shape``, the layer's layout; ``extent``: its samples per axis)
        transformed: ``shape[0] * shape[1]`` spectra."""
        mem = launch_memory(self.xp, a, "float32", self.p.layout)
        out = self._spectra(shape)
        self._launch(self.kernels[0], (shape[0] * shape[1],),
                     (self._ptr(mem), self._ptr(out), numpy.int32(shape[1]), *self._strides(shape),
                      *map(numpy.int32, extent)))
        return out

    def _strides(self, shape) -> tuple:
        """The element strides of an operand of logical ``shape`` in the layer's layout, as launch arguments (made
        once)."""
        key = ("strides", tuple(shape))
        got = self._made_args.get(key)
        if got is None:
            got = self._made_args[key] = tuple(map(numpy.int64, launch_strides(shape, self.p.layout)))
        return got

    def x_spectrum(self, x):
        return self._spectrum(x, self.p.x_shape, self.p.input_size)

    def w_spectrum(self, w):
        return self._spectrum(w, self.p.w_shape, self.p.kernel_size)

    def dy_spectrum(self, dy):
        return self._spectrum(dy, self.p.y_shape, self.p.output_size)

    def _into(self, out, shape, launch) -> object:
        """``launch(address)`` writes a result of logical ``shape`` in the layer's layout; into ``out`` itself where
        ``out`` is that memory, else through a copy."""
        mem = launch_memory(self.xp, out, "float32", self.p.layout)
        launch(self._ptr(mem))
        if self._ptr(mem) != self._ptr(out):
            out[...] = from_launch(self.xp, mem, "float32", self.p.layout)
        return out

    def _pass_args(self, pass_: str, shape, extent, skip_axis: int | None = None):
        """The result's element strides (but axis ``skip_axis``), its extent, the pass's shifts and scale (made once
        per pass: a cached call's host time is all launches)."""
        key = (pass_, tuple(shape), tuple(extent), skip_axis)
        got = self._made_args.get(key)
        if got is None:
            q = self.p.for_pass(pass_)
            strides = [s for axis, s in enumerate(self._strides(shape)) if axis != skip_axis]
            got = self._made_args[key] = (*strides, *map(numpy.int32, extent), *self._sizes_args(q))
        return got

    def _both_args(self) -> tuple:
        """The fused backward passes' shifts: ``(dgrad's, wgrad's, scale)``, the shifts as tuples (made once)."""
        key = ("both",)
        got = self._made_args.get(key)
        if got is None:
            *sh_d, scale = self._sizes_args(self.p.for_pass("dgrad"))
            *sh_w, _ = self._sizes_args(self.p.for_pass("wgrad"))
            got = self._made_args[key] = (tuple(sh_d), tuple(sh_w), scale)
        return got

    def forward_from(self, xs, ws, out):
        p = self.p
        return self._into(out, p.y_shape, lambda res: self._launch(
            self.kernels[1], (p.batch * p.in_channels,),
            (self._ptr(xs), self._ptr(ws), res, numpy.int32(p.in_channels),
             *self._pass_args("fwd", p.y_shape, p.output_size))))

    def backward_data_from(self, dys, ws, out):
        p = self.p
        return self._into(out, p.x_shape, lambda res: self._launch(
            self.kernels[2], (p.batch * p.in_channels,),
            (self._ptr(dys), self._ptr(ws), res, numpy.int32(p.in_channels),
             *self._pass_args("dgrad", p.x_shape, p.input_size))))

    def _keeping(self, kernel, pass_: str, a, a_shape, a_extent, ws, out, out_shape, out_extent):
        """The pass from operand ``a`` and the filter's spectra ``ws`` into ``out`` in one kernel that also writes
        ``a``'s spectra, returned (:meth:`forward_keeping`, :meth:`backward_data_keeping`)."""
        p = self.p
        mem = launch_memory(self.xp, a, "float32", p.layout)
        kept = self._spectra(a_shape)
        a_strides = self._strides(a_shape)
        args, k = self._pass_args(pass_, out_shape, out_extent), len(out_shape)  # (the result's k strides first)
        self._into(out, out_shape, lambda res: self._launch(
            kernel, (p.batch * p.in_channels,),
            (self._ptr(mem), self._ptr(ws), res, self._ptr(kept), numpy.int32(p.in_channels), *a_strides,
             *args[:k], *map(numpy.int32, a_extent), *args[k:])))
        return kept

    def forward_keeping(self, x, ws, out):
        """``out`` = the forward pass from ``x`` and the filter's spectra, in one kernel; returns ``x``'s spectra."""
        p = self.p
        return self._keeping(self.kernels[4], "fwd", x, p.x_shape, p.input_size, ws, out, p.y_shape, p.output_size)

    def backward_data_keeping(self, dy, ws, out):
        """``out`` = the backward-data pass from ``dy`` and the filter's spectra, in one kernel; returns ``dy``'s
        spectra."""
        p = self.p
        return self._keeping(self.kernels[5], "dgrad", dy, p.y_shape, p.output_size, ws, out, p.x_shape,
                             p.input_size)

    def backward_filter_from(self, pairs, out):
        """``out`` = the filter gradient from ``[(dy spectra, x spectra)]`` (one pair: the whole batch)."""
        (dys, xs), = pairs
        p = self.p
        return self._into(out, p.w_shape, lambda res: self._launch(
            self.kernels[3], (p.in_channels,),
            (self._ptr(xs), self._ptr(dys), res, numpy.int32(p.batch), numpy.int32(p.in_channels),
             *self._pass_args("wgrad", p.w_shape, p.kernel_size, skip_axis=1))))  # (a filter's axis 1: one channel)


class RowKept(KeptBlockFft):
    """:class:`KeptBlockFft` for 1-D depthwise layers at transform length ``L`` (radices ``radix``; ``threads`` a
    block, 0: :func:`convtune.fft.rowconv.threads`). With ``fused``, :meth:`backward_both` runs both backward passes
    in one kernel (``kernels`` then has a seventh, :data:`convtune.fft.rowconv.BOTH_NAME`)."""

    what = "the row FFT round trip"

    def __init__(self, xp, problem: ConvProblem, L: int, radix: str = "8", threads: int = 0, kernels=None,
                 stream=None, fused: bool = False):
        super().__init__(xp, problem, stream)
        for pass_ in ("fwd", "dgrad", "wgrad"):
            why = rowconv.reason(self.p.for_pass(pass_), L)
            if why:
                raise ValueError(f"{self.what}: {why}")
        self.L, m = L, L // 2
        if fused and not rowconv.fused_backward_fits(m):
            raise ValueError(f"{self.what}: the fused backward passes keep the batch's sums beside the row in shared "
                             f"memory, {rowconv.both_smem_bytes(m) // 1024} KiB for {m}-point rows: too many")
        self.fused, self.both_smem = fused, rowconv.both_smem_bytes(m)
        self.spectrum_elems, self.block, self.smem = m + 1, (threads or rowconv.threads(m),), rowconv.smem_bytes(m)
        self.kernels = kernels or row_kernels(self.p.dtype, m, radix, threads, fused, self._device(xp))

    def backward_both(self, dy, ws, xs, dx, dw):
        """``dx`` and ``dw`` from ``dy``, the filter's spectra ``ws`` and the input's kept spectra ``xs`` in one kernel
        (block c: channel c's rows of every sample in turn); returns ``(dx, dw)``."""
        p = self.p
        mem = launch_memory(self.xp, dy, "float32", p.layout)
        y_strides, x_strides = self._strides(p.y_shape), self._strides(p.x_shape)
        wC, _, wK = self._strides(p.w_shape)
        sh_d, sh_w, scale = self._both_args()

        def launch(dx_ptr, dw_ptr):
            self._launch(self.kernels[6], (p.in_channels,),
                         (self._ptr(mem), self._ptr(ws), self._ptr(xs), dx_ptr, dw_ptr, numpy.int32(p.batch),
                          numpy.int32(p.in_channels), *y_strides, *x_strides, wC, wK, numpy.int32(p.output_size[0]),
                          numpy.int32(p.input_size[0]), numpy.int32(p.kernel_size[0]), *sh_d, *sh_w, scale),
                         self.both_smem)
        self._into(dx, p.x_shape, lambda dx_ptr: self._into(dw, p.w_shape, lambda dw_ptr: launch(dx_ptr, dw_ptr)))
        return dx, dw

    def _sizes_args(self, q: ConvProblem):
        return numpy.int32(rowconv.shifts(q, self.L)), numpy.float32(1.0 / self.L)


@compiled_once
def plane_kernels(dtype: str, sizes, shape, radix: str, fused: bool, device_id: int):
    """:data:`convtune.fft.planeconv.KEPT_NAMES` (and with ``fused`` :data:`~convtune.fft.planeconv.FUSED_NAMES`) for
    ``dtype``, ``sizes``, launch ``shape`` and radices ``radix``, compiled once per device."""
    names = planeconv.KEPT_NAMES + (planeconv.FUSED_NAMES if fused else ())
    return launchables(planeconv.source(dtype, sizes, shape, radix), names, planeconv.smem_bytes(sizes),
                               device_id)


class PlaneKept(KeptBlockFft):
    """:class:`KeptBlockFft` for 2-D depthwise layers at transform ``sizes`` (launch ``shape``, default
    :func:`convtune.fft.planeconv.launch_shape`; radices ``radix``)."""

    what = "the image FFT round trip"

    def __init__(self, xp, problem: ConvProblem, sizes, radix: str = "8", shape=None, kernels=None, stream=None,
                 fused: bool = False):
        super().__init__(xp, problem, stream)
        self.sizes = sizes = tuple(sizes)
        for pass_ in ("fwd", "dgrad", "wgrad"):
            why = planeconv.reason(self.p.for_pass(pass_), sizes)
            if why:
                raise ValueError(f"{self.what}: {why}")
        shape = planeconv.launch_shape(sizes) if shape is None else tuple(shape)
        self.spectrum_elems = sizes[0] * (sizes[1] // 2 + 1)
        self.block, self.smem = (shape[0],), planeconv.smem_bytes(sizes)
        self.fused = fused
        self.kernels = kernels or plane_kernels(self.p.dtype, sizes, shape, radix, fused, self._device(xp))

    def backward_both(self, dy, ws, xs, dx, dw):
        """``dx`` and ``dw`` from ``dy``, the filter's spectra ``ws`` and the input's kept spectra ``xs``: one kernel
        over (channel, slice) blocks makes dx and each slice's sums, the filter gradient's sum kernel adds them and
        inverts once per channel; returns ``(dx, dw)``."""
        p = self.p
        sh_d, sh_w, scale = self._both_args()
        if ("slices",) not in self._made_args:  # (the slices, a slice's samples, the sums' complex64: made once)
            S = planeconv.fused_slices(p)
            self._made_args[("slices",)] = (S, math.ceil(p.batch / S),
                                            planeconv.fused_workspace_bytes(p, self.sizes) // 8)
        S, chunk, sums = self._made_args[("slices",)]
        mem = launch_memory(self.xp, dy, "float32", p.layout)
        y_strides, x_strides = self._strides(p.y_shape), self._strides(p.x_shape)
        wC, _, w0, w1 = self._strides(p.w_shape)
        part = self.xp.empty(sums, dtype=self.xp.complex64)
        i32 = numpy.int32
        self._into(dx, p.x_shape, lambda res: self._launch(
            self.kernels[6], (p.in_channels * S,),
            (self._ptr(mem), self._ptr(ws), self._ptr(xs), res, self._ptr(part), i32(p.batch), i32(p.in_channels),
             i32(S), i32(chunk), *y_strides, *x_strides, *map(i32, p.output_size), *map(i32, p.input_size), *sh_d,
             scale)))
        self._into(dw, p.w_shape, lambda res: self._launch(
            self.kernels[7], (p.in_channels,),
            (self._ptr(part), res, i32(S), wC, w0, w1, *map(i32, p.kernel_size), *sh_w, scale)))
        return dx, dw

    def _sizes_args(self, q: ConvProblem):
        return (*(numpy.int32(s) for s in planeconv.shifts(q, self.sizes)),
                numpy.float32(1.0 / (self.sizes[0] * self.sizes[1])))

"""The round-trip executor: a layer's three passes sharing their FFTs (see :mod:`convtune.roundtrip`)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from .. import precision
from ..backend import Backend, gemm_precision, get_backend
from ..fft import blockkept, freqmajor, planeconv, rowconv, spectral
from ..fft import sizes as fft_sizes
from ..fft.cost import spectrum_elems
from ..fft.spectral import pointwise_applies
from ..problem import ConvProblem
from ..versioning import changed_since

log = logging.getLogger("convtune")

#: Version of the round-trip executor; part of every stored trip decision (6: depthwise round trips; 7: the
#: GPU's fused and packed trips for 3-D problems too; 8: half-precision and channels_last layers, between
#: conversions; 9: convtune's own transforms read and write those layers themselves; 10: in tf32 mode, the packed
#: product's TF32 tensor-core form; 11: the one-block transforms' kept spectra for float32 depthwise 1-D and 2-D
#: layers; 12: 1024-thread blocks for rows of over 8192 points as candidates too; 13: rows' fused backward passes;
#: 14: images' too; 15: rows' radix-32 passes; 16: rows' first and last passes reading and writing memory; 17:
#: bfloat16 trips that read its 16 bits timed on 16-bit memory, as the per-pass plans are, not on float32 storage;
#: 18: the packed trips with the narrow product at a batch of 16 or less too, many channels on both sides, and the
#: narrow product's new blocks, narrow.block; 19: block trips of dense float32 2-D layers too, on the one-block image
#: transforms; 20: those trips no longer offered: on an H200 they lost to the cuFFT trips by 1.27x to 1.38x on every
#: dense layer measured, their transforms slower than cuFFT's at the same size).
VERSION = 20


def _dense_plane(p: ConvProblem) -> bool:
    """Is ``p`` a float32 channels-first dense 2-D layer of one group, stride and dilation 1: one that versions 19 and
    20 changed (block round trips offered, then withdrawn)?"""
    return (p.rank == 2 and p.groups == 1 and not p.in_channels == p.out_channels == 1 and p.dtype == "float32"
            and p.layout == "channels_first" and all(v == 1 for v in p.stride + p.dilation))


#: version -> the shapes that version changed (a predicate of the forward problem), as a strategy's
#: ``changes``: a stored decision of an older version stands for a shape that no later version changed; a
#: version not listed here changed every shape.
CHANGES = {7: lambda p: p.rank == 3, 8: lambda p: p.dtype != "float32" or p.layout != "channels_first",
           9: lambda p: p.dtype != "float32" or p.layout != "channels_first", 10: lambda p: p.math == "tf32",
           11: lambda p: p.dtype == "float32" and p.rank in (1, 2) and p.groups == p.in_channels == p.out_channels,
           12: lambda p: p.dtype == "float32" and p.rank == 1 and p.groups == p.in_channels == p.out_channels
           and fft_sizes.min_length(p.input_size[0], p.padding[0], p.dilated_kernel[0]) > 16384,
           13: lambda p: p.dtype == "float32" and p.rank == 1 and p.groups == p.in_channels == p.out_channels,
           14: lambda p: p.dtype == "float32" and p.rank == 2 and p.groups == p.in_channels == p.out_channels,
           15: lambda p: p.dtype == "float32" and p.rank == 1 and p.groups == p.in_channels == p.out_channels
           and rowconv.offers(p, "32"),
           16: lambda p: p.dtype == "float32" and p.rank == 1 and p.groups == p.in_channels == p.out_channels,
           17: lambda p: p.dtype == "bfloat16",
           18: freqmajor.narrow_changed, 19: _dense_plane, 20: _dense_plane}


def stale(decision_version: int, problem: ConvProblem) -> bool:
    """Must a stored round-trip decision of ``decision_version`` be measured again for ``problem`` (its
    forward problem)? Yes where any version since changed that shape, or the decision is of a newer one."""
    return changed_since(CHANGES, decision_version, VERSION, problem)
#: Default cap on the bytes a layer's kept spectra may hold between its passes.
DEFAULT_KEEP_LIMIT = 2 << 30
#: The cost model keeps this many transform sizes for the round trip's benchmark.
KEEP_SIZES = 2
#: A round trip must beat the per-pass plans by this factor to be used (timing noise is a few %).
PAYS_FACTOR = 0.97


@dataclass(frozen=True)
class TripConfig:
    sizes: tuple[int, ...]
    fused: bool = False  # fgemm: fused callbacks; block: both backward passes from one transform of dy
    tf32: bool = False
    packed: bool = False  # spectra in cuFFT's layout, convtune's GEMM kernel (see convtune.fft.freqmajor)
    own: bool = False  # convtune's own one-pass transforms instead of cuFFT's (convtune.fft.fft64)
    narrow: bool = False  # packed, few channels: the register-blocked product (convtune.fft.narrow)
    # fgemm: the frequency-major executor; pointwise: SpectralKept (depthwise, few channels); block: the one-block
    # transforms' kept-spectra kernels (depthwise 1-D and 2-D, float32: convtune.fft.blockkept)
    product: str = "fgemm"
    radices: str = "8"  # block: the passes' radices (convtune.fft.rowconv.RADICES)
    threads: int = 0  # block: threads per block (0: rowconv.threads; 2-D: registers uncapped, 0: launch_shape's)

    def label(self) -> str:
        parts = ["sizes=" + "x".join(map(str, self.sizes))] + [n for n in ("fused", "packed", "narrow", "own", "tf32")
                                                                if getattr(self, n)]
        if self.product != "fgemm":
            parts.append(self.product)
        if self.radices != "8":
            parts.append(f"radices={self.radices}")
        if self.threads:
            parts.append(f"threads={self.threads}")
        return "fft-trip[" + ",".join(parts) + "]"

    def as_dict(self) -> dict:
        return {"sizes": list(self.sizes), "fused": self.fused, "tf32": self.tf32, "packed": self.packed,
                "own": self.own, "narrow": self.narrow, "product": self.product, "radices": self.radices,
                "threads": self.threads}

    @classmethod
    def from_dict(cls, data: dict) -> "TripConfig":
        return cls(sizes=tuple(int(v) for v in data["sizes"]), fused=bool(data.get("fused", False)),
                   tf32=bool(data.get("tf32", False)), packed=bool(data.get("packed", False)),
                   own=bool(data.get("own", False)), narrow=bool(data.get("narrow", False)),
                   product=str(data.get("product", "fgemm")), radices=str(data.get("radices", "8")),
                   threads=int(data.get("threads", 0)))


def _block_kept(xp, problem: ConvProblem, config: TripConfig):
    """The kept-spectra executor of the one-block transforms for ``config`` (``block`` product)."""
    if problem.rank == 1:
        return blockkept.RowKept(xp, problem, config.sizes[0], config.radices, config.threads, fused=config.fused)
    if problem.rank == 2:
        return blockkept.PlaneKept(xp, problem, config.sizes, config.radices,
                                   shape=(config.threads, 1) if config.threads else None, fused=config.fused)
    raise ValueError(f"{config.label()}: the block round trip is 1-D or 2-D, not rank {problem.rank}")


def block_trip_configs(problem: ConvProblem, backend: Backend) -> list[TripConfig]:
    """The ``block`` round trips of the forward ``problem``: on the GPU, for float32 depthwise 1-D and 2-D layers,
    each transform size of the ``fft-row`` or ``fft-plane`` strategy that serves all three passes, with each of its
    radix sets and block sizes, as the strategies' candidates (:func:`convtune.fft.planeconv.shape_options`: the
    policy's register cap spills, ``benchmarks/kernel_registers.py``; :func:`convtune.fft.rowconv.launch_options`);
    each also ``fused``, both backward passes from one transform of dy (no spectra of dy written or read back), for
    images always and for rows where the batch's sums fit beside the row."""
    p = problem.for_pass("fwd")
    if backend.name != "cupy" or p.dtype != "float32" or p.rank not in (1, 2):
        return []
    mod = rowconv if p.rank == 1 else planeconv
    out = []
    for size in mod.size_options(p):
        sizes = (size,) if p.rank == 1 else tuple(size)
        if any(mod.reason(p.for_pass(q), size) for q in ("dgrad", "wgrad")):
            continue
        pairs = (rowconv.launch_options(size // 2) if p.rank == 1 else
                 [(t, r) for t in planeconv.shape_options(size) for r in planeconv.radix_options(size)])
        out += [TripConfig(sizes=sizes, product="block", radices=r, threads=t) for t, r in pairs]
        # (both backward passes from one transform of dy: rows where the sums fit beside the row; images in slices)
        out += [TripConfig(sizes=sizes, product="block", radices=r, threads=t, fused=True) for t, r in pairs
                if p.rank == 2 or rowconv.fused_backward_fits(size // 2)]
    return out


def held_bytes(problem: ConvProblem, sizes) -> int:
    """Bytes the kept spectra of x, w and dy hold between the passes."""
    p = problem
    return 8 * spectrum_elems(tuple(sizes)) * (p.batch * p.in_channels + p.out_channels * p.in_per_group +
                                               p.batch * p.out_channels)


def unsupported_reason(problem: ConvProblem) -> str | None:
    """Why the round trip (the frequency-major executor's) cannot run ``problem``, or ``None``. A half-precision
    or channels_last layer runs the float32 channels-first round trip between conversions (:class:`RoundTrip`)."""
    problem = problem.in_float32()
    if freqmajor.unsupported_reason(problem) is None or pointwise_applies(problem):
        return None
    return (f"{problem.groups} groups of {problem.in_per_group}->{problem.out_per_group} channels: too many groups "
            f"for the frequency-major GEMMs (at most {freqmajor.MAX_GROUPS}) and too many channel pairs for the "
            f"pointwise product (at most {spectral.POINTWISE_MAX_PAIRS})")


class RoundTrip:
    """One layer's three passes through one frequency-major executor, keeping spectra between them.

    ``forward(x, w)`` keeps the spectra of ``x`` and ``w``; ``backward_data(dy)`` and
    ``backward_filter(dy)`` run in either order, the first transforms ``dy`` and keeps its
    spectrum for the second (the same ``dy`` object); after both, all kept spectra are released.

    Examples
    --------
    >>> import numpy as np
    >>> from convtune import ConvProblem
    >>> from convtune.roundtrip import RoundTrip, TripConfig
    >>> p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(8, 8), kernel_size=3)
    >>> trip = RoundTrip(p, TripConfig(sizes=(8, 8)), "numpy")
    >>> rng = np.random.default_rng(0)
    >>> x, w = rng.random(p.x_shape, dtype=np.float32), rng.random(p.w_shape, dtype=np.float32)
    >>> y = trip.forward(x, w)
    >>> dy = np.ones_like(y)
    >>> trip.backward_filter(dy).shape, trip.backward_data(dy).shape, trip.holding
    ((4, 3, 3, 3), (2, 3, 8, 8), False)
    """

    @property
    def recordable(self) -> bool:
        """Can a CUDA graph record its GPU work? With the pointwise product (cuFFT plans and convtune's
        kernels) and the block one (kernels only); the frequency-major executor's products call cuBLAS, which CuPy
        refuses while capturing."""
        return self.config.product in ("pointwise", "block")

    def __init__(self, problem: ConvProblem, config: TripConfig, backend: Backend | str):
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.problem, self.config = problem.for_pass("fwd"), config
        # a half-precision or channels_last layer: the float32 channels-first trip, its operands widened and its
        # results narrowed (convtune.precision; the PyTorch layer converts with PyTorch around float32, which it
        # builds for the float32 problem itself)
        self.float32 = self.problem.in_float32()
        # convtune's own transforms read and write the layer's dtype and layout themselves: no conversions (the
        # block product's kernels read float32 layers in either layout)
        self.converted = self.float32 != self.problem and not config.own and config.product != "block"
        reason = unsupported_reason(self.problem)
        if reason is not None:
            raise ValueError(f"{config.label()}: {reason}")
        if config.tf32 and self.problem.math != "tf32":
            raise ValueError(f"{config.label()}: TF32 products need math='tf32', the problem is {self.problem.math}")
        fft_sizes.check_sizes(self.problem, config.sizes)
        self.xp = xp = self.backend.xp
        # made once, not on every call (a trip's host time before its first kernel shows wherever the GPU waits: a
        # block trip timed on an idle GPU after the torch-fft peer took 0.407 against 0.364 ms, benchmarks/paired_gap.py)
        storage = precision.STORAGE[self.problem.dtype]
        self._storage = xp.dtype(storage)
        self._bits = (() if self.converted or self.problem.dtype != "bfloat16"
                      else (xp.dtype("uint16"), xp.dtype("int16")))
        # the matrix products' TF32 setting (the block product has none: its kernels are convtune's own)
        self._products = (contextlib.nullcontext if config.product == "block" else
                          (lambda: gemm_precision(xp, config.tf32)))
        if config.product in ("pointwise", "block") and (config.packed or config.own or config.narrow or config.tf32
                                                         or (config.fused and config.product == "pointwise")):
            raise ValueError(f"{config.label()}: the {config.product} round trip has no "
                             f"{'' if config.product == 'block' else 'fused, '}packed, own, narrow or TF32 variants")
        if config.product == "block":
            self._ex = _block_kept(xp, self.problem, config)
        elif config.product == "pointwise":
            if not pointwise_applies(self.problem):
                raise ValueError(f"{config.label()}: the pointwise product takes at most "
                                 f"{spectral.POINTWISE_MAX_PAIRS} channel pairs per group")
            self._ex = spectral.SpectralKept(xp, self.float32, config.sizes, "pointwise")
        elif config.product != "fgemm":
            raise ValueError(f"{config.label()}: unknown round-trip product {config.product!r} (fgemm, pointwise, "
                             "block)")
        else:
            reason = freqmajor.unsupported_reason(self.float32)
            if reason is not None:
                raise ValueError(f"{config.label()}: {reason}; the pointwise round trip takes it")
            self._ex = freqmajor.FreqMajorConv(xp, self.float32 if self.converted else self.problem, config.sizes,
                                               self.problem.batch,
                                               fused=config.fused and self.backend.name == "cupy",
                                               packed=config.packed, own=config.own, narrow=config.narrow,
                                               tf32=config.tf32)
        self.release()

    @property
    def reads_bits(self) -> bool:
        """Whether this trip reads and writes a bfloat16 layer's 16 bits itself (``uint16`` or ``int16`` arrays: the
        PyTorch layer's tensors), as well as the float32 storage of bfloat16 values that arrays use."""
        return bool(self._bits)

    @property
    def holding(self) -> bool:
        """Whether spectra are kept (between a forward pass and the end of its backward passes)."""
        return self._xs is not None or self._dys is not None

    def release(self):
        """Drop what is kept (a layer whose weight is frozen never runs its backward-filter pass)."""
        self._xs = self._ws = self._dys = self._dy = None
        self._pending = set()
        self._made = {}  # pass -> (dy, result): the other backward pass's result, made by one fused kernel

    def _fuses(self, dy, other: str) -> bool:
        """Whether this backward pass runs both in one kernel (the block trip's fused form, the ``other`` pass still to
        come, ``dy``'s spectra not already made)."""
        return getattr(self._ex, "fused", False) and other in self._pending and not self._holds_dy(dy)

    def _both(self, dy, dx, dw):
        """``dx`` and ``dw`` from one transform of dy (``backward_both`` of :class:`convtune.fft.blockkept.RowKept`:
        one kernel; of :class:`~convtune.fft.blockkept.PlaneKept`: the slices' kernel and the sums')."""
        checked = self._check("dy", dy, self.problem.y_shape)
        return self._ex.backward_both(checked, self._ws, self._xs, dx, dw)

    def _made_by_fused(self, pass_: str, dy, out):
        """This pass's result if the other backward pass made it (for the same ``dy``), into ``out`` if given."""
        made = self._made.pop(pass_, None)
        if made is None or made[0] is not dy:
            return None
        if out is not None:
            out[...] = made[1]
            return out
        return made[1]

    def _check(self, name, a, shape):
        """``a`` checked, as the float32 channels-first executor reads it (converted where the layer is not)."""
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(a.shape)}; this round trip is for "
                             f"{self.problem.describe()} ({name} {tuple(shape)})")
        # (convtune's own transforms also read bfloat16 as its 16 bits: the PyTorch layer's tensors)
        if a.dtype != self._storage and a.dtype not in self._bits:
            raise ValueError(f"this round trip runs {self._storage} arrays; {name} is {a.dtype}")
        return precision.widened(self.xp, a) if self.converted else a

    def _out(self, out, shape):
        if out is not None and tuple(out.shape) != tuple(shape):
            raise ValueError(f"out has shape {tuple(out.shape)}; this pass writes {tuple(shape)}")
        if self.converted:  # (a converted trip narrows its float32 result into ``out``)
            return self.xp.empty(shape, dtype=self.xp.float32)
        if out is None:  # (the layer's storage and layout: float32 channels-first, or what own transforms write)
            p = self.problem
            return precision.empty_in(self.xp, shape, precision.STORAGE[p.dtype], p.layout)
        return out

    def _result(self, result, out, pass_: str):
        """A pass's float32 result as the layer stores it (itself for a float32 channels-first layer)."""
        if not self.converted:
            return result
        return precision.narrowed(self.xp, result, self.problem.for_pass(pass_), out)

    def forward(self, x, w, out=None):
        """``y``; keeps the spectra of ``x`` and ``w`` (a new forward pass drops what was kept)."""
        p = self.problem
        x, w = self._check("x", x, p.x_shape), self._check("w", w, p.w_shape)
        self.release()
        y = self._out(out, p.y_shape)
        self._xs, self._ws = self._forward_keeping(x, w, y)
        self._pending = {"dgrad", "wgrad"}
        return self._result(y, out, "fwd")

    def _forward_keeping(self, x, w, out):
        """``out`` = the forward pass of checked operands; returns the spectra of ``x`` and ``w``."""
        with self._products():
            ws = self._ex.w_spectrum(w)
            if hasattr(self._ex, "forward_keeping"):  # (the block product: the pass and x's spectra in one kernel)
                return self._ex.forward_keeping(x, ws, out), ws
            xs = self._ex.x_spectrum(x)
            self._ex.forward_from(xs, ws, out)
        return xs, ws

    def _holds_dy(self, dy) -> bool:
        """Whether ``dy``'s spectrum is kept (``dy`` as given: transformed once for both backward passes)."""
        return self._dys is not None and self._dy is dy

    def _dy_spectrum(self, dy):
        if not self._holds_dy(dy):
            self._dys, self._dy = self._ex.dy_spectrum(self._check("dy", dy, self.problem.y_shape)), dy
        return self._dys

    def _need(self, pass_):
        if pass_ not in self._pending:
            raise RuntimeError(f"{'backward_data' if pass_ == 'dgrad' else 'backward_filter'}() needs a forward() "
                               "first, and runs once per forward pass")

    def _done(self, pass_):
        self._pending.discard(pass_)
        if pass_ == "dgrad":
            self._ws = None
        else:
            self._xs = None
        if not self._pending:
            self.release()

    def backward_data(self, dy, out=None):
        """``dx`` from ``dy`` and the kept weight spectrum."""
        self._need("dgrad")
        made = self._made_by_fused("dgrad", dy, out)
        if made is not None:
            self._done("dgrad")
            return made
        dx = self._out(out, self.problem.x_shape)
        with self._products():
            if self._fuses(dy, "wgrad"):  # (dw as well, for backward_filter)
                dw = self._out(None, self.problem.w_shape)
                self._both(dy, dx, dw)
                self._made["wgrad"] = (dy, dw)
            elif hasattr(self._ex, "backward_data_keeping") and not self._holds_dy(dy):
                checked = self._check("dy", dy, self.problem.y_shape)  # (the pass and dy's spectra in one kernel)
                self._dys, self._dy = self._ex.backward_data_keeping(checked, self._ws, dx), dy
            else:
                self._ex.backward_data_from(self._dy_spectrum(dy), self._ws, dx)
        self._done("dgrad")
        return self._result(dx, out, "dgrad")

    def backward_filter(self, dy, out=None):
        """``dw`` from ``dy`` and the kept input spectrum (summed over the whole batch)."""
        self._need("wgrad")
        made = self._made_by_fused("wgrad", dy, out)
        if made is not None:
            self._done("wgrad")
            return made
        dw = self._out(out, self.problem.w_shape)
        with self._products():
            if self._fuses(dy, "dgrad"):  # (dx as well, for backward_data)
                dx = self._out(None, self.problem.x_shape)
                self._both(dy, dx, dw)
                self._made["dgrad"] = (dy, dx)
            else:
                self._ex.backward_filter_from([(self._dy_spectrum(dy), self._xs)], dw)
        self._done("wgrad")
        return self._result(dw, out, "wgrad")

    # -- stateless form: the caller holds the spectra (one layer's autograd context per call) ---------
    def kept_forward(self, x, w, out=None):
        """``(y, spectra)``: the forward pass and the spectra of ``x`` and ``w`` for :meth:`kept_backward`
        (nothing is kept on this object: each call's spectra are the caller's)."""
        p = self.problem
        x, w = self._check("x", x, p.x_shape), self._check("w", w, p.w_shape)
        y = self._out(out, p.y_shape)
        spectra = self._forward_keeping(x, w, y)
        return self._result(y, out, "fwd"), spectra

    def kept_backward(self, spectra, dy, dx_out=None, dw_out=None, need_dx=True, need_dw=True):
        """``(dx, dw)`` (``None`` where not needed) from ``dy`` and :meth:`kept_forward`'s spectra:
        ``dy`` is transformed once for both."""
        p = self.problem
        dy = self._check("dy", dy, p.y_shape)
        xs, ws = spectra
        dx = dw = None
        with self._products():
            if need_dx and need_dw and getattr(self._ex, "fused", False):  # (one kernel: dx and dw)
                dx, dw = self._ex.backward_both(dy, ws, xs, self._out(dx_out, p.x_shape), self._out(dw_out, p.w_shape))
            elif need_dx and hasattr(self._ex, "backward_data_keeping"):  # (one kernel: dx and dy's spectra)
                dx = self._out(dx_out, p.x_shape)
                dys = self._ex.backward_data_keeping(dy, ws, dx)
            else:
                dys = self._ex.dy_spectrum(dy)
                if need_dx:
                    dx = self._ex.backward_data_from(dys, ws, self._out(dx_out, p.x_shape))
            if need_dw and dw is None:
                dw = self._ex.backward_filter_from([(dys, xs)], self._out(dw_out, p.w_shape))
        return (None if dx is None else self._result(dx, dx_out, "dgrad"),
                None if dw is None else self._result(dw, dw_out, "wgrad"))

    def __call__(self, x, w, dy):
        """One round trip: ``(y, dx, dw)``."""
        y = self.forward(x, w)
        return y, self.backward_data(dy), self.backward_filter(dy)

    def __repr__(self):
        return f"<RoundTrip {self.config.label()} {self.problem.describe()}>"

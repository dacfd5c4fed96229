"""The array operations of the frequency-major FFT path, once on NumPy (pocketfft, explicit transposes) and once
on CuPy (cuFFT plans, cuBLAS GEMMs, cuFFT callbacks, convtune's packed and narrow products and its own transforms).

:class:`NumpyOps` checks on the CPU the arithmetic and the index bookkeeping that :class:`CupyOps` runs on the GPU;
:class:`convtune.fft.freqmajor.FreqMajorConv` and :mod:`convtune.fft.spectral`'s packed paths call them.
"""

from __future__ import annotations

import math

import numpy

from . import fft64
from . import narrow as narrow_product
from .callbacks import (EMBED_THREADS, callbacks_available, callbacks_unavailable_reason, embed_kernel, load_callback,
                        set_jit_callback, store_callback)
from . import packedgemm
from .placement import fft_aligned, gather, is_fft_aligned
from .spectral_kernels import row_launch

CUBLAS_OPS = {"N": 0, "T": 1, "C": 2}  # cublasOperation_t


class _Ops:
    """What both array modules' frequency-major operations share: the sizes, and the unfused inverse
    transform followed by its gather."""

    #: convtune's own transforms (:mod:`convtune.fft.fft64`; GPU only), which read and write operands as they lie
    own = False
    #: float32 results hold bfloat16 values (rounded to them when written; own transforms only)
    round_bfloat16 = False

    def __init__(self, xp, sizes):
        self.xp, self.sizes = xp, tuple(sizes)
        self.spec_shape = self.sizes[:-1] + (self.sizes[-1] // 2 + 1,)
        self.total, self.F = math.prod(self.sizes), math.prod(self.spec_shape)

    def empty_spectrum(self, *shape):
        """An uninitialised (F, *shape) complex64 spectrum in this layout."""
        return self.xp.empty((self.F,) + shape, dtype=self.xp.complex64)

    def irfft_into(self, spec, target, geometry, blocks):
        """Inverse transform of (F, B) gathered into ``target`` (n, C, *counts): ``blocks`` are the
        slice copies of :func:`~convtune.fft.placement.gather_blocks` (``geometry`` is the same
        gather as (offset, step, count) per axis, for the GPU's fused store)."""
        full = self.irfft(spec).reshape(target.shape[:2] + self.sizes)
        gather(target, full, blocks)
        return target


def _embed_any(xp, a, sizes, steps):
    """(B, *n) -> (B, *L): sample ``k`` of each axis at ``k * step``, zeros elsewhere (any rank, any
    array module: a zero fill and a strided copy)."""
    buf = xp.zeros(a.shape[:1] + tuple(sizes), dtype=xp.float32)
    buf[(slice(None),) + tuple(slice(0, (n - 1) * s + 1, s) for n, s in zip(a.shape[1:], steps))] = a
    return buf


class NumpyOps(_Ops):
    """Frequency-major transforms and batched GEMM with NumPy (explicit transposes)."""

    def __init__(self, xp, sizes):
        super().__init__(xp, sizes)
        self.axes = tuple(range(1, 1 + len(sizes)))

    def embed(self, a, steps):
        return _embed_any(self.xp, a, self.sizes, steps)

    def rfft(self, a, steps):
        """(B, *n) real, sample ``k`` of each axis placed at ``k * step`` of L -> (F, B) complex64."""
        if a.shape[1:] != self.sizes:
            a = self.embed(a, steps)
        spec = self.xp.fft.rfftn(a, axes=self.axes).reshape(a.shape[0], -1)
        return self.xp.ascontiguousarray(spec.T, dtype=self.xp.complex64)

    def irfft(self, spec, out=None):
        """(F, B) -> (B, *L) float32, unnormalised (the 1/N is applied earlier); into ``out`` if given."""
        b = spec.shape[1]
        grid = spec.T.reshape((b,) + self.spec_shape)
        full = self.xp.fft.irfftn(grid, s=self.sizes, axes=self.axes, norm="forward")
        if out is None:
            return full.astype(self.xp.float32)
        out[...] = full
        return out

    def gemm(self, a, op_a, b, op_b, c, alpha, beta=0.0):
        """``c[f] = alpha * op(a[f]) @ op(b[f]) + beta * c[f]`` over the leading (frequency) axis."""
        prod = self._op(a, op_a) @ self._op(b, op_b)
        if beta:
            c *= beta
            c += alpha * prod
        else:
            c[...] = alpha * prod

    def _op(self, m, op):
        if op == "N":
            return m
        t = m.transpose(0, 2, 1)
        return t.conj() if op == "C" else t


class CupyOps(_Ops):
    """cuFFT plans and cuBLAS strided-batched CGEMM for the frequency-major layout.

    Two ways to get the layout (``strided``): cuFFT writes and reads it itself through its advanced
    data layout (output stride = number of transforms), or cuFFT keeps its packed layout and a
    cuBLAS ``geam`` transposes the spectrum (one extra read and write of it). On an H100
    (``benchmarks/fft_phases.py``, fbfft-L2) a strided R2C moved about 310 GB/s and a packed R2C
    plus the transpose about 880 GB/s; on 16x16 transforms the two were within 15% either way, so
    both are candidates there and the transpose is the default.

    ``fused``: packed transforms with JIT-linked callbacks (see :meth:`_callback_plan`) for the
    zero-extension and the output gather. The store callback's destination is a device word the
    plan owns and each call updates with a stream-ordered fill, so calls on one stream may be in
    flight together; calls from several streams at once on one plan are not supported.

    ``packed``: no layout change at all. Spectra stay as cuFFT writes them, (B, F), and are handed
    around as transposed views (F, B), so the executor's code is the same. The product is
    convtune's own batched complex GEMM (``convtune_packed_cgemm``), which reads and writes rows
    of F contiguous frequencies; the ``geam`` transposes are gone.

    ``own``: the transforms are convtune's own one-pass kernels (:mod:`convtune.fft.fft64`, 64x64
    only) instead of cuFFT's; they zero-extend and gather themselves, as the fused plans' callbacks
    do, and their spectra have the kernels' own frequency order, which the product does not see.
    """

    def __init__(self, xp, sizes, strided=False, fused=False, packed=False, own=False, narrow=False, tf32=False):
        from cupy.cuda import cufft, device
        from cupy_backends.cuda.libs import cublas
        if fused and strided:
            raise ValueError("the fused (callback) transforms use cuFFT's packed layout, not the strided one")
        if packed and strided:
            raise ValueError("the packed product reads cuFFT's packed layout, not the strided one")
        if own and (fused or strided):
            raise ValueError("convtune's own transforms replace cuFFT's; the fused and strided variants are cuFFT's")
        reason = fft64.applies(sizes) if own else None
        if reason is not None:
            raise ValueError(reason)
        if narrow and not packed:
            raise ValueError("the narrow product reads the packed layout: it needs packed=True")
        if tf32 and narrow:
            raise ValueError("the narrow product has no TF32 form (it is float32)")
        # the packed product on TF32 tensor cores (cuBLAS's products follow gemm_precision instead)
        self.packed, self.own, self.narrow, self.tf32 = packed, own, narrow, tf32 and packed
        #: the narrow product's ``(RM, RN, threads)`` for every call (``None``: ``convtune.fft.narrow.block``'s;
        #: benchmarks/narrow_blocks.py times others)
        self.narrow_blocks = None
        if fused and not callbacks_available():
            raise ValueError(f"fused transforms need cuFFT JIT callbacks: {callbacks_unavailable_reason()}")
        super().__init__(xp, sizes)
        self.strided, self.fused = strided, fused
        self._cufft, self._cublas, self._device = cufft, cublas, device
        self._plans = {}  # (forward?, transforms) -> PlanNd: exactly what the plan is built from
        self._embeds = {}  # (operand shape, steps) -> the embedding kernel's grid and scalar arguments
        self._scalars = {}  # value -> (host complex64 scalar, its address), made once (no allocation, no ctypes)

    def _plan(self, forward: bool, batch: int):
        key = (forward, batch)
        plan = self._plans.get(key)
        if plan is None:
            cufft, L, S = self._cufft, list(self.sizes), list(self.spec_shape)
            kind = cufft.CUFFT_R2C if forward else cufft.CUFFT_C2R
            if not self.strided:  # packed layouts (no embeds: cuFFT's defaults)
                idist, odist = (self.total, self.F) if forward else (self.F, self.total)
                plan = cufft.PlanNd(L, None, 1, idist, None, 1, odist, kind, batch, "C", -1, None)
            elif forward:  # real rows in, frequency-major spectrum out
                plan = cufft.PlanNd(L, L, 1, self.total, S, batch, 1, kind, batch, "C", -1, None)
            else:
                plan = cufft.PlanNd(L, S, batch, 1, L, 1, self.total, kind, batch, "C", -1, None)
            self._plans[key] = plan
        return plan

    def embed(self, a, steps):
        """(B, *n) -> (B, *L), written once by one kernel: zeros and samples together (a zero fill
        followed by a strided copy writes the placed samples twice); 3-D: a zero fill and a copy."""
        if a.ndim > 3:
            return _embed_any(self.xp, a, self.sizes, steps)
        key = (a.shape, tuple(steps))
        launch = self._embeds.get(key)
        if launch is None:  # grid and arguments made once per operand shape (the hot path's host time)
            n = (1,) * (3 - a.ndim) + a.shape[1:]
            L = (1,) * (3 - a.ndim) + self.sizes
            s = (1,) * (3 - a.ndim) + tuple(steps)
            rows = a.shape[0] * L[0]
            grid, shift, seg_len = row_launch(rows, L[1], EMBED_THREADS)
            launch = self._embeds[key] = (embed_kernel(seg_len > 0), grid, (numpy.int64(rows),) +
                                          tuple(numpy.int32(v) for v in L + n + s + (seg_len or shift,)))
        kernel, grid, args = launch
        out = self.xp.empty(a.shape[:1] + self.sizes, dtype=self.xp.float32)
        kernel(grid, (EMBED_THREADS,), (self.xp.ascontiguousarray(a), out) + args)
        return out

    def _transpose(self, a):
        """(r, c) complex64 -> (c, r), with cuBLAS geam (row-major (r, c) is column-major (c, r))."""
        r, c = a.shape
        out = self.xp.empty((c, r), dtype=self.xp.complex64)
        self._cublas.cgeam(self._device.get_cublas_handle(), 1, 1, r, c, self._scalar(1.0), a.data.ptr, c,
                           self._scalar(0.0), a.data.ptr, c, out.data.ptr, r)
        return out

    def _scalar(self, value) -> int:
        """Host address of a complex64 scalar (cuBLAS reads alpha and beta from host memory)."""
        held = self._scalars.get(value)
        if held is None:  # (the array is kept beside its address: its memory must live as long as the executor)
            scalar = numpy.array([value], dtype=numpy.complex64)
            held = self._scalars[value] = (scalar, scalar.ctypes.data)
        return held[1]

    def rfft(self, a, steps):
        """(B, *n) real, sample ``k`` of each axis placed at ``k * step`` of L -> (F, B) complex64;
        the zero-extension is one kernel, or (fused) cuFFT's load callback reading ``a`` itself."""
        if self.own:  # convtune's kernels read ``a`` as it lies: (B, *n) or (n, C, *n), any strides and dtype
            if fft64.dense_channels_last(a):  # (whole sectors: channels-first first, in its dtype)
                a = fft64.channels_first_copy(a)
            b = math.prod(a.shape[:-2])
            spec = fft64.rfft(a, self.xp.empty((b, self.F), dtype=self.xp.complex64), tuple(steps))
            return spec.T if self.packed else self._transpose(spec)
        b = a.shape[0]
        a = fft_aligned(self.xp.ascontiguousarray(a))
        shape = (self.F, b) if self.strided else (b, self.F)
        spec = self.xp.empty(shape, dtype=self.xp.complex64)
        if a.shape[1:] == self.sizes:
            plan = self._plan(True, b)
        elif self.fused:
            plan = self._load_plan(b, a.shape[1:], tuple(steps))
        else:
            a, plan = self.embed(a, steps), self._plan(True, b)
        plan.fft(a, spec, self._cufft.CUFFT_FORWARD)
        if self.packed:
            return spec.T  # a view: the packed product reads rows of F frequencies
        return spec if self.strided else self._transpose(spec)

    def empty_spectrum(self, *shape):
        if not self.packed:
            return super().empty_spectrum(*shape)
        return self.xp.empty(shape + (self.F,), dtype=self.xp.complex64).transpose((len(shape),) +
                                                                                  tuple(range(len(shape))))

    def _to_packed(self, spec):
        """(F, B) spectrum -> C-contiguous (B, F) for the inverse transform (a view when packed)."""
        if self.packed:
            rows = spec.T
            return rows if rows.flags.c_contiguous else self.xp.ascontiguousarray(rows)
        return self._transpose(spec)

    def irfft_into(self, spec, target, geometry, blocks):
        """Inverse transform of (F, B) gathered into ``target`` (n, C, *counts); fused, cuFFT's store
        callback writes the gathered elements straight into ``target`` (no full-size copy is read)."""
        b = spec.shape[1]
        if self.own:  # written into ``target`` as it lies, in its dtype (see FreqMajorConv's ``io``)
            cl = fft64.dense_channels_last(target)  # (whole sectors: channels-first, then one transposing pass)
            whole = self.xp.empty(target.shape, dtype=target.dtype) if cl else target
            fft64.irfft(self._to_packed(spec), whole, tuple(geometry), round_bfloat16=self.round_bfloat16)
            return fft64.channels_last_into(whole, target) if cl else target
        if not (self.fused and target.flags.c_contiguous and is_fft_aligned(target)):
            return super().irfft_into(spec, target, geometry, blocks)
        plan, slot = self._store_plan(b, tuple(geometry))
        if slot[1] != target.data.ptr:  # the callback reads its destination from this device word
            slot[1] = target.data.ptr
            slot[0].fill(target.data.ptr)  # a stream-ordered kernel: calls in flight keep their own
        scratch = self.xp.empty((b,) + self.sizes, dtype=self.xp.float32)  # cuFFT's own intermediate stages
        plan.fft(self._to_packed(spec), scratch, self._cufft.CUFFT_INVERSE)
        return target

    def _load_plan(self, batch, n_shape, steps):
        key = ("load", batch, n_shape, steps)
        held = self._plans.get(key)
        if held is None:
            name = "convtune_ld_" + "_".join(map(str, self.sizes + tuple(n_shape) + tuple(steps)))
            code = load_callback(name, self.sizes, n_shape, steps)
            held = self._plans[key] = self._callback_plan(True, batch, code, name, 0)
        return held[0]

    def _store_plan(self, batch, geometry):
        key = ("store", batch, geometry)
        held = self._plans.get(key)
        if held is None:
            name = "convtune_st_" + "_".join(map(str, self.sizes + sum(map(tuple, geometry), ())))
            code = store_callback(name, self.sizes, geometry)
            slot = [self.xp.zeros(1, dtype=self.xp.uint64), 0]  # [device word, the pointer it holds]
            held = self._plans[key] = self._callback_plan(False, batch, code, name, slot[0].data.ptr) + (slot,)
        return held[0], held[-1]

    def _callback_plan(self, forward, batch, code, name, caller_info):
        """A packed R2C (load callback) or C2R (store callback) plan with a JIT-linked callback.

        CuPy compiles the callback to LTO IR; convtune hands it to cuFFT itself, because CuPy's
        ``setJITCallback`` passes a temporary name buffer and the address of a stack variable for
        the caller info, which cuFFT reads again when it makes the plan (plans then failed at
        random with CUFFT_INVALID_SIZE). The buffers live as long as the plan: they are returned
        with it."""
        import ctypes

        import cupy
        cufft = self._cufft
        kind, cb_kind = (cufft.CUFFT_R2C, cufft.CUFFT_CB_LD_REAL) if forward else \
            (cufft.CUFFT_C2R, cufft.CUFFT_CB_ST_REAL)
        role = "cb_load" if forward else "cb_store"
        with cupy.fft.config.set_cufft_callbacks(cb_ver="jit", **{role: code, role + "_name": name}) as manager:
            lto = manager.cb_load_lto if forward else manager.cb_store_lto
        handle = cufft.create()
        cufft.setAutoAllocation(handle, 0)
        name_bytes, info = name.encode(), ctypes.c_void_p(caller_info)
        set_callback, destroy = set_jit_callback()
        result = set_callback(handle, name_bytes, lto, len(lto), cb_kind, ctypes.byref(info))
        if result != 0:
            destroy(handle)
            raise RuntimeError(f"cufftXtSetJITCallback({name}) failed with cufftResult {result}")
        idist, odist = (self.total, self.F) if forward else (self.F, self.total)
        plan = cufft.PlanNd(list(self.sizes), None, 1, idist, None, 1, odist, kind, batch, "C", -1, None,
                            prealloc_plan=handle)
        return plan, lto, name_bytes, info

    def irfft(self, spec, out=None):
        """May overwrite ``spec`` (cuFFT's multi-dimensional C2R does); the callers own it. ``out``,
        if given, is C-contiguous (B, *L) float32."""
        b = spec.shape[1]
        if not self.strided:
            spec = self._to_packed(spec)
        if self.own:
            target = out if out is not None else self.xp.empty((b,) + self.sizes, dtype=self.xp.float32)
            return fft64.irfft(spec, target, tuple((0, 1, L) for L in self.sizes))
        target = out if out is not None and is_fft_aligned(out) else \
            self.xp.empty((b,) + self.sizes, dtype=self.xp.float32)
        self._plan(False, b).fft(spec, target, self._cufft.CUFFT_INVERSE)
        if out is None:
            return target
        if target is not out:
            out[...] = target
        return out

    def gemm(self, a, op_a, b, op_b, c, alpha, beta=0.0):
        """Row-major ``c = alpha op(a) op(b) + beta c`` per frequency, as the column-major
        ``c^T = op(b)^T op(a)^T``; a stored row-major matrix is its own transpose in column-major, so
        each operand keeps its op code and its row stride is its leading dimension."""
        m, k = (a.shape[1], a.shape[2]) if op_a == "N" else (a.shape[2], a.shape[1])
        n = b.shape[2] if op_b == "N" else b.shape[1]
        if self.packed:
            return self._packed_gemm(a, op_a, b, op_b, c, m, n, k, alpha, beta)
        item = c.itemsize
        for arr in (a, b, c):
            if arr.strides[2] != item:
                raise ValueError("frequency-major GEMM operands need unit stride along their rows")
        self._cublas.cgemmStridedBatched(
            self._device.get_cublas_handle(), CUBLAS_OPS[op_b], CUBLAS_OPS[op_a], n, m, k, self._scalar(alpha),
            b.data.ptr, b.strides[1] // item, b.strides[0] // item,
            a.data.ptr, a.strides[1] // item, a.strides[0] // item,
            self._scalar(beta), c.data.ptr, c.strides[1] // item, c.strides[0] // item, a.shape[0])


    def _packed_gemm(self, a, op_a, b, op_b, c, m, n, k, alpha, beta):
        """``c = alpha op(a) op(b) + beta c`` per frequency on (F, rows, cols) views whose frequency
        axis is contiguous: each matrix element is a row of F frequencies, so only row strides
        (in units of F elements) reach the kernel."""
        row = c.itemsize * self.F

        def strides(arr):  # (row index, column index) strides in rows of F; an axis of extent 1 has none
            out = tuple(st // row if dim > 1 else 0 for st, dim in zip(arr.strides[1:], arr.shape[1:]))
            if (arr.shape[0] > 1 and arr.strides[0] != c.itemsize) or \
                    any(dim > 1 and st % row for st, dim in zip(arr.strides[1:], arr.shape[1:])):
                raise ValueError("packed GEMM operands need a contiguous frequency axis")
            return out
        sa, sb, sc = strides(a), strides(b), strides(c)
        s_am, s_ak = sa if op_a == "N" else sa[::-1]
        s_bk, s_bn = sb if op_b == "N" else sb[::-1]
        if self.narrow:
            return narrow_product.gemm(a, b, c, m, n, k, self.F, (s_am, s_ak, s_bk, s_bn) + sc, op_a == "C",
                                       op_b == "C", alpha, beta, self.narrow_blocks)
        packedgemm.gemm(a, b, c, m, n, k, self.F, (s_am, s_ak, s_bk, s_bn) + sc, op_a == "C", op_b == "C", alpha,
                        beta, self.tf32)  # (TF32 tensor cores in tf32 math)


def is_cupy(xp) -> bool:
    return xp.__name__ == "cupy"

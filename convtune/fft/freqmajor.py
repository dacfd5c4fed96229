"""FFT convolution with frequency-major spectra: the channel product is one strided-batched GEMM.

:class:`~convtune.fft.spectral.SpectralConv` keeps spectra as the FFT library returns them,
``(batch, channels, F)``, and the channel reduction at each frequency then needs transposed copies
of both operands and of the result (CuPy's batched ``matmul`` copies non-contiguous operands).
Here every spectrum is stored frequency-major, ``(F, batch, channels)``, so at every frequency the
operands are plain row-major matrices and the reduction is **one strided-batched complex GEMM**
over the ``F`` frequencies, with the conjugations done by the GEMM's ``op`` argument and the
inverse transform's ``1/N`` by its ``alpha``. On the GPU the layout comes from one cuBLAS ``geam``
transpose per spectrum, or (``strided``) from cuFFT's advanced data layout directly. Zero-extension
is one kernel that writes each element once or (``fused``) happens inside the forward transform, in
a cuFFT JIT load callback that reads the unextended operand; with ``fused`` the inverse transform's
store callback also writes only the wanted outputs (crop, strided outputs, filter taps) into the
result. The inverse transform may overwrite its input (a temporary spectrum), and an input gradient
that is the whole inverse transform is written in place. ``packed`` skips the layout change
altogether: spectra stay in cuFFT's (B, F) layout and are passed around as transposed views, and
the product is convtune's own batched complex GEMM kernel, which reads and writes rows of F
contiguous frequencies (on the H100 about two thirds of cuBLAS's speed; it wins where the
transposes cost more than that, see BENCHMARKS.md runs 18 and 19); with ``narrow``, for few channels,
the product on that layout is instead :mod:`convtune.fft.narrow`'s register-blocked kernel. ``own``
replaces cuFFT with convtune's own one-pass 64x64 transforms (:mod:`convtune.fft.fft64`, run 20).

Passes per call (``W`` the weight spectrum, ``N`` the transform size)::

    forward          Y_f  = X_f @ W_f^H / N        (n x Cg) @ (Cg x Kg)
    backward-data    DX_f = DY_f @ W_f / N         (n x Kg) @ (Kg x Cg)
    backward-filter  DW_f = DY_f^H @ X_f / N       (Kg x n) @ (n x Cg), summed over batch chunks

and the spatial geometry (padding as a cyclic shift, stride by upsampling ``dy``, dilation in the
placed kernel) is that of :mod:`convtune.fft.spectral`. Groups are one GEMM per group on
sub-matrices (a leading dimension larger than the width), again without copies.

On NumPy the same layout is produced with pocketfft and explicit transposes, so the CPU checks
the arithmetic and the index bookkeeping of the same passes.
"""

from __future__ import annotations

import functools
import logging
import math

import numpy

from ..direct.geometry import batch_chunks
from ..problem import ConvProblem
from . import fft64, narrow as narrow_product
from .cost import spectrum_elems
from .spectral_kernels import row_launch
from .spectral import (fft_aligned, filter_gather, forward_gather, gather, gather_blocks, gather_positions,
                       input_gather, is_fft_aligned)

log = logging.getLogger("convtune")

#: Above this many groups one GEMM per group costs more launches than the pointwise product saves.
MAX_GROUPS = 16

_OPS = {"N": 0, "T": 1, "C": 2}  # cublasOperation_t


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
        slice copies of :func:`~convtune.fft.spectral.gather_blocks` (``geometry`` is the same
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


class _NumpyOps(_Ops):
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


class _CupyOps(_Ops):
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
            grid, shift, seg_len = row_launch(rows, L[1], _EMBED_THREADS)
            launch = self._embeds[key] = (_embed_kernel(seg_len > 0), grid, (numpy.int64(rows),) +
                                          tuple(numpy.int32(v) for v in L + n + s + (seg_len or shift,)))
        kernel, grid, args = launch
        out = self.xp.empty(a.shape[:1] + self.sizes, dtype=self.xp.float32)
        kernel(grid, (_EMBED_THREADS,), (self.xp.ascontiguousarray(a), out) + args)
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
            code = _load_callback(name, self.sizes, n_shape, steps)
            held = self._plans[key] = self._callback_plan(True, batch, code, name, 0)
        return held[0]

    def _store_plan(self, batch, geometry):
        key = ("store", batch, geometry)
        held = self._plans.get(key)
        if held is None:
            name = "convtune_st_" + "_".join(map(str, self.sizes + sum(map(tuple, geometry), ())))
            code = _store_callback(name, self.sizes, geometry)
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
        set_callback, destroy = _set_jit_callback()
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
            self._device.get_cublas_handle(), _OPS[op_b], _OPS[op_a], n, m, k, self._scalar(alpha),
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
                                       op_b == "C", alpha, beta)
        tiles = ((m + _PG_TILE - 1) // _PG_TILE) * ((n + _PG_TILE - 1) // _PG_TILE)
        grid = (tiles * ((self.F + _PG_FREQS - 1) // _PG_FREQS),)
        i64, i32 = numpy.int64, numpy.int32
        args = (a, b, c, i32(m), i32(n), i32(k), i32(self.F), i64(s_am), i64(s_ak), i64(s_bk), i64(s_bn),
                i64(sc[0]), i64(sc[1]), i32(op_a == "C"), i32(op_b == "C"), numpy.float32(alpha), i32(1 if beta else 0))
        if self.tf32:  # TF32 tensor cores (tf32 math)
            _packed_tf32_kernel()(grid, (_PG_THREADS,), args, shared_mem=_PGT_SMEM)
        else:
            _packed_gemm_kernel()(grid, (_PG_THREADS,), args)


# Tile of the packed-layout GEMM: 4 frequencies x (64 x 64) outputs per block of 256 threads, each
# thread one frequency and an 8 x 8 block of outputs; the reduction runs 4 at a time through two
# shared-memory buffers that cp.async fills (the next 4 arrive while the current ones are multiplied).
# A wide tile per frequency keeps the operand traffic from L2 at 1/32 of an element per multiply-add.
_PG_THREADS, _PG_FREQS, _PG_TILE = 256, 4, 64

# What both packed kernels (float32 and TF32) share: the tile's sizes, the shared-memory layout of an operand's
# rows and the asynchronous copy that fills it.
_PACKED_COMMON = f"#define FT {_PG_FREQS}\n#define MT {_PG_TILE}\n" + r"""
// shared-memory index of (row, frequency): rows of 4 frequencies, 4 more elements after every 8 rows,
// so the 8 column blocks that a warp reads fall in different banks
#define SIDX(r, f) ((r) * FT + (f) + ((r) >> 3) * FT)

#ifndef CONVTUNE_CPU_STANDINS  // (tests/cuda_cpu.py runs these kernels on the CPU with stand-ins of its own)
__device__ __forceinline__ void convtune_cp8(float2* dst, const float2* src, bool ok) {
    // 8 bytes global -> shared, asynchronously; zeros where ``ok`` is false (nothing is read)
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global.L2::128B [%0], [%1], 8, %2;\n" :: "r"(d), "l"(src), "r"(ok ? 8 : 0));
}
__device__ __forceinline__ void convtune_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// wait until at most N of this thread's committed groups are still in flight
template <int N> __device__ __forceinline__ void convtune_cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
__device__ __forceinline__ unsigned convtune_tf32(float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ void convtune_mma_tf32(float* c, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
"""

_PACKED_GEMM_SOURCE = _PACKED_COMMON + r"""
#define KT 4
#define SROWS (MT * FT + (MT / 8) * FT)

extern "C" __global__ void __launch_bounds__(256, 1)
convtune_packed_cgemm(const float2* __restrict__ A, const float2* __restrict__ B, float2* __restrict__ C,
                      int M, int N, int K, int F, long long sAm, long long sAk, long long sBk, long long sBn,
                      long long sCm, long long sCn, int conjA, int conjB, float alpha, int accumulate)
{
    // C[m, n, f] = alpha * sum_k opA[m, k, f] * opB[k, n, f] (+ C), element (r, c) of an operand at
    // (r * s_r + c * s_c) * F + f: rows of F contiguous frequencies, read 4 frequencies (a sector) at a time
    __shared__ float2 As[2][KT][SROWS];
    __shared__ float2 Bs[2][KT][SROWS];
    const int tid = threadIdx.x;
    const int tf = tid & 3, tm = tid >> 5, tn = (tid >> 2) & 7;
    // one block per (64 x 64 tile, 4 frequencies), the tiles of one set of frequencies next to each other
    const int mtiles = (M + MT - 1) / MT, tiles = mtiles * ((N + MT - 1) / MT);
    const int tile = blockIdx.x % tiles, f0 = (blockIdx.x / tiles) * FT;
    const int m0 = (tile % mtiles) * MT, n0 = (tile / mtiles) * MT;
    const float sa = conjA ? -1.f : 1.f, sb = conjB ? -1.f : 1.f;
    float2 acc[8][8];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[r][c] = make_float2(0.f, 0.f);

    // element e = tid + 256 j of a 4 x 64 x 4 tile: frequency e & 3, row (e >> 2) & 63, k e >> 8
    auto issue = [&](int k0, int buf) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int e = tid + 256 * j, f = f0 + (e & 3), r = (e >> 2) & 63, kk = k0 + j;
            const bool fk = f < F && kk < K;
            const bool oka = fk && m0 + r < M, okb = fk && n0 + r < N;
            convtune_cp8(&As[buf][j][SIDX(r, e & 3)],
                         oka ? A + ((long long)(m0 + r) * sAm + (long long)kk * sAk) * F + f : A, oka);
            convtune_cp8(&Bs[buf][j][SIDX(r, e & 3)],
                         okb ? B + ((long long)kk * sBk + (long long)(n0 + r) * sBn) * F + f : B, okb);
        }
        convtune_cp_commit();
    };
    issue(0, 0);
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += KT) {
        if (k0 + KT < K) {
            issue(k0 + KT, buf ^ 1);
            convtune_cp_wait<1>();
        } else {
            convtune_cp_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            float2 a[8], b[8];
#pragma unroll
            for (int r = 0; r < 8; ++r) { a[r] = As[buf][kk][SIDX(tm * 8 + r, tf)]; a[r].y *= sa; }
#pragma unroll
            for (int c = 0; c < 8; ++c) { b[c] = Bs[buf][kk][SIDX(tn * 8 + c, tf)]; b[c].y *= sb; }
#pragma unroll
            for (int r = 0; r < 8; ++r)
#pragma unroll
                for (int c = 0; c < 8; ++c) {
                    acc[r][c].x = fmaf(a[r].x, b[c].x, fmaf(-a[r].y, b[c].y, acc[r][c].x));
                    acc[r][c].y = fmaf(a[r].x, b[c].y, fmaf(a[r].y, b[c].x, acc[r][c].y));
                }
        }
        __syncthreads();
        buf ^= 1;
    }
    const int f = f0 + tf;
    if (f >= F) return;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int m = m0 + tm * 8 + r;
        if (m >= M) break;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const int n = n0 + tn * 8 + c;
            if (n >= N) break;
            float2* out = C + ((long long)m * sCm + (long long)n * sCn) * F + f;
            float2 v = make_float2(alpha * acc[r][c].x, alpha * acc[r][c].y);
            if (accumulate) { v.x += out->x; v.y += out->y; }
            *out = v;
        }
    }
}
"""


# The same product on TF32 tensor cores (tf32 math: mma.sync m16n8k8, float32 sums), the same tile of 4 frequencies
# x (64 x 64) outputs per block of 256 threads: each warp one frequency and 32 of the 64 columns (4 x 4 fragments of
# 16 x 8, a complex product as 4 real ones), the reduction 8 at a time through two shared-memory buffers that
# cp.async fills (dynamic shared memory, 72 KiB), and the results through shared memory 16 rows at a time, so that 4
# adjacent threads write one output's 4 frequencies (a whole sector). On the H100, fbfft-L2's three products took
# 0.34 to 0.38 ms against the float32 kernel's 0.53 to 0.61 (written in place from the fragments: 0.52 to 0.74).
_PGT_SMEM = 2 * 2 * 8 * (_PG_TILE * _PG_FREQS + (_PG_TILE // 8) * _PG_FREQS + 1) * 8

_PACKED_TF32_SOURCE = _PACKED_COMMON + r"""
#define KT 8
#define SROWS_T (MT * FT + (MT / 8) * FT + 1)  // +1: a fragment's 4 k rows fall in different banks
extern "C" __global__ void __launch_bounds__(256, 1)
convtune_packed_cgemm_tf32(const float2* __restrict__ A, const float2* __restrict__ B, float2* __restrict__ C,
                           int M, int N, int K, int F, long long sAm, long long sAk, long long sBk, long long sBn,
                           long long sCm, long long sCn, int conjA, int conjB, float alpha, int accumulate)
{
    extern __shared__ float2 smem[];
    float2* As = smem;                      // [2][KT][SROWS_T]
    float2* Bs = smem + 2 * KT * SROWS_T;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int fw = warp >> 1, nh = warp & 1;  // the warp's frequency and half of the 64 columns
    const int mtiles = (M + MT - 1) / MT, tiles = mtiles * ((N + MT - 1) / MT);
    const int tile = blockIdx.x % tiles, f0 = (blockIdx.x / tiles) * FT;
    const int m0 = (tile % mtiles) * MT, n0 = (tile / mtiles) * MT;
    const float sa = conjA ? -1.f : 1.f, sb = conjB ? -1.f : 1.f;
    float re[4][4][4], im[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) { re[i][j][q] = 0.f; im[i][j][q] = 0.f; }
    const int lf = tid & 3, lr = (tid >> 2) & 63;
    auto issue = [&](int k0, int buf) {
        const int f = f0 + lf;
#pragma unroll
        for (int j = 0; j < KT; ++j) {
            const int kk = k0 + j;
            const bool fk = f < F && kk < K;
            const bool oka = fk && m0 + lr < M, okb = fk && n0 + lr < N;
            convtune_cp8(&As[(buf * KT + j) * SROWS_T + SIDX(lr, lf)],
                oka ? A + ((long long)(m0 + lr) * sAm + (long long)kk * sAk) * F + f : A, oka);
            convtune_cp8(&Bs[(buf * KT + j) * SROWS_T + SIDX(lr, lf)],
                okb ? B + ((long long)kk * sBk + (long long)(n0 + lr) * sBn) * F + f : B, okb);
        }
        convtune_cp_commit();
    };
    issue(0, 0);
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += KT) {
        if (k0 + KT < K) {
            issue(k0 + KT, buf ^ 1);
            convtune_cp_wait<1>();
        } else {
            convtune_cp_wait<0>();
        }
        __syncthreads();
        const float2* a_s = As + buf * KT * SROWS_T;
        const float2* b_s = Bs + buf * KT * SROWS_T;
        unsigned ar[4][4], ai[4][4], br[4][2], bi[4][2], nbi[4][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = i * 16 + g;
            const float2 v0 = a_s[t * SROWS_T + SIDX(r, fw)], v1 = a_s[t * SROWS_T + SIDX(r + 8, fw)];
            const float2 v2 = a_s[(t + 4) * SROWS_T + SIDX(r, fw)], v3 = a_s[(t + 4) * SROWS_T + SIDX(r + 8, fw)];
            ar[i][0] = convtune_tf32(v0.x); ar[i][1] = convtune_tf32(v1.x); ar[i][2] = convtune_tf32(v2.x); ar[i][3] = convtune_tf32(v3.x);
            ai[i][0] = convtune_tf32(sa * v0.y); ai[i][1] = convtune_tf32(sa * v1.y); ai[i][2] = convtune_tf32(sa * v2.y); ai[i][3] = convtune_tf32(sa * v3.y);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = nh * 32 + j * 8 + g;
            const float2 w0 = b_s[t * SROWS_T + SIDX(n, fw)], w1 = b_s[(t + 4) * SROWS_T + SIDX(n, fw)];
            br[j][0] = convtune_tf32(w0.x); br[j][1] = convtune_tf32(w1.x);
            bi[j][0] = convtune_tf32(sb * w0.y); bi[j][1] = convtune_tf32(sb * w1.y);
            nbi[j][0] = convtune_tf32(-sb * w0.y); nbi[j][1] = convtune_tf32(-sb * w1.y);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                convtune_mma_tf32(re[i][j], ar[i], br[j]);
                convtune_mma_tf32(re[i][j], ai[i], nbi[j]);
                convtune_mma_tf32(im[i][j], ar[i], bi[j]);
                convtune_mma_tf32(im[i][j], ai[i], br[j]);
            }
        __syncthreads();
        buf ^= 1;
    }
    // the results through shared memory, one 16-row slice at a time, so that 4 adjacent threads write the 4
    // frequencies of one output (a whole 32-byte sector) as the float32 kernel does
    float2* cs = smem;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int row = g + (q >> 1) * 8, col = nh * 32 + j * 8 + 2 * t + (q & 1);
                cs[(row * 64 + col) * FT + fw] = make_float2(alpha * re[i][j][q], alpha * im[i][j][q]);
            }
        __syncthreads();
#pragma unroll 4
        for (int s = 0; s < 16; ++s) {
            const int e = tid + 256 * s, f = f0 + (e & 3), col = (e >> 2) & 63, row = e >> 8;
            const int m = m0 + i * 16 + row, n = n0 + col;
            if (m < M && n < N && f < F) {
                float2* out = C + ((long long)m * sCm + (long long)n * sCn) * F + f;
                float2 v = cs[e];
                if (accumulate) { v.x += out->x; v.y += out->y; }
                *out = v;
            }
        }
        __syncthreads();
    }
}
"""


@functools.lru_cache(maxsize=None)
def _packed_tf32_kernel():
    import cupy
    kernel = cupy.RawKernel(_PACKED_TF32_SOURCE, "convtune_packed_cgemm_tf32", options=("--std=c++17",))
    kernel.max_dynamic_shared_size_bytes = _PGT_SMEM  # (over the 48 KiB a block gets without opting in)
    return kernel


def packed_available(backend) -> bool:
    """Whether the packed product's kernel can run: CuPy on a GPU of compute capability 8.0 or newer."""
    if backend.name != "cupy":
        return False
    major = str(backend.device_info().compute_capability).split(".")[0]
    return major.isdigit() and int(major) >= 8


@functools.lru_cache(maxsize=None)
def _packed_gemm_kernel():
    import cupy
    return cupy.RawKernel(_PACKED_GEMM_SOURCE, "convtune_packed_cgemm", options=("--std=c++17",))


_EMBED_SOURCE = r"""
__device__ __forceinline__ void convtune_embed_row(const float* __restrict__ src, float* __restrict__ dst,
                                                   long long row, int L0, int L1, int n0, int n1, int s0, int s1,
                                                   int c, int c_end, int step) {
    // elements c, c + step, ... < c_end of output row (image b, row r); no per-element index division on
    // the common s1 == 1 path
    long long b = row / L0;
    int r = (int)(row - b * L0);
    float* out = dst + row * L1;
    if (r % s0 != 0 || r / s0 >= n0) {
        for (; c < c_end; c += step) out[c] = 0.0f;
        return;
    }
    const float* in = src + (b * n0 + r / s0) * n1;
    if (s1 == 1) {
        for (; c < c_end; c += step) out[c] = c < n1 ? in[c] : 0.0f;
    } else {
        for (; c < c_end; c += step) {
            int q = c / s1;
            out[c] = (c == q * s1 && q < n1) ? in[q] : 0.0f;
        }
    }
}

extern "C" __global__ void convtune_fft_embed(const float* __restrict__ src, float* __restrict__ dst,
                                              long long rows, int L0, int L1, int n0, int n1, int s0, int s1,
                                              int row_shift) {
    // short rows (spectral_kernels.row_launch): 2^row_shift threads per row, as many rows as fit in the block
    const int per_row = 1 << row_shift;
    long long row = (long long)blockIdx.x * (blockDim.x >> row_shift) + (threadIdx.x >> row_shift);
    if (row >= rows) return;
    convtune_embed_row(src, dst, row, L0, L1, n0, n1, s0, s1, threadIdx.x & (per_row - 1), L1, per_row);
}

extern "C" __global__ void convtune_fft_embed_long(const float* __restrict__ src, float* __restrict__ dst,
                                                   long long rows, int L0, int L1, int n0, int n1, int s0, int s1,
                                                   int seg_len) {
    // long rows: a block per segment of seg_len elements of a row, all its threads on it
    unsigned int segs = (L1 + seg_len - 1) / seg_len, seg = blockIdx.x % segs;
    long long row = blockIdx.x / segs;
    if (row >= rows) return;
    int c = seg * seg_len + threadIdx.x;
    convtune_embed_row(src, dst, row, L0, L1, n0, n1, s0, s1, c, min(L1, (int)(seg + 1) * seg_len), blockDim.x);
}
"""
_EMBED_THREADS = 256

def _load_callback(name: str, L, n, steps) -> str:
    """cuFFT load callback of the fused forward transform, any rank: element ``offset`` of the zero-extended
    (B, *L) operand, read from the unextended (B, *n) one (sample k of an axis at k * step, zero elsewhere)."""
    at = _unravel(L)
    keep = " && ".join(f"i{j} % {s} == 0 && i{j} / {s} < {m}" for j, (s, m) in enumerate(zip(steps, n)))
    return f"""#include <cufftXt.h>
__device__ cufftReal {name}(void* dataIn, unsigned long long offset, void* info, void* shared) {{
{at}
    if ({keep})
        return ((const float*)dataIn)[{_ravel("b", [f"i{j} / {s}" for j, s in enumerate(steps)], n)}];
    return 0.0f;
}}
"""


def _store_callback(name: str, L, geometry) -> str:
    """cuFFT store callback of the fused inverse transform, any rank: element ``offset`` of the (B, *L) result
    lands at output position q of an axis when (index + offset_axis) mod L == q * step, q < count; the output's
    address is the device word ``info`` points to (the plan's own output is scratch)."""
    at = _unravel(L)
    shift = "\n".join(f"    int t{j} = (i{j} + {o}) % {size};" for j, ((o, _, _), size) in enumerate(zip(geometry, L)))
    keep = " && ".join(f"t{j} % {s} == 0 && t{j} / {s} < {c}" for j, (_, s, c) in enumerate(geometry))
    index = _ravel("b", [f"t{j} / {s}" for j, (_, s, _) in enumerate(geometry)], [c for _, _, c in geometry])
    return f"""#include <cufftXt.h>
__device__ void {name}(void* dataOut, unsigned long long offset, cufftReal element, void* info, void* shared) {{
{at}
{shift}
    if ({keep})
        (*(float**)info)[{index}] = element;
}}
"""


def _unravel(L) -> str:
    """C lines splitting a callback's ``offset`` into the batch index ``b`` and per-axis indices i0, i1, ..."""
    lines = [f"    const unsigned long long image = {' * '.join(f'(unsigned long long){v}' for v in L)};",
             "    unsigned long long b = offset / image;",
             "    int pos = (int)(offset - b * image);"]
    for j in range(len(L) - 1, 0, -1):
        lines.append(f"    int i{j} = pos % {L[j]}; pos /= {L[j]};")
    lines.append("    int i0 = pos;")
    return "\n".join(lines)


def _ravel(batch: str, index, extents) -> str:
    """C expression of the flat position of (batch, *index) in a C-contiguous (B, *extents) array."""
    expr = batch
    for i, e in zip(index, extents):
        expr = f"({expr}) * {e} + {i}"
    return expr


#: cuFFT's JIT (LTO) callbacks arrived in cuFFT 11.3.3 (CUDA 12.8).
MIN_CALLBACK_CUFFT = 11303


@functools.lru_cache(maxsize=None)
def callbacks_unavailable_reason() -> str | None:
    """Why cuFFT JIT callbacks cannot be used here, or None."""
    try:
        import cupy
        from cupy.cuda import cufft
        version = cufft.getVersion()
    except Exception as exc:  # no CuPy or no cuFFT: the reason is the message
        return f"cuFFT unavailable ({type(exc).__name__}: {exc})"
    if version < MIN_CALLBACK_CUFFT:
        return f"cuFFT {version} is older than {MIN_CALLBACK_CUFFT} (CUDA 12.8), the first with JIT callbacks"
    if not hasattr(cupy.fft.config, "set_cufft_callbacks"):
        return "this CuPy has no cuFFT callback support"
    try:
        _set_jit_callback()
    except OSError as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=None)
def _set_jit_callback():
    """``cufftXtSetJITCallback`` and ``cufftDestroy`` of the cuFFT library CuPy's own calls go to, through ctypes.

    A process can map two copies of cuFFT (CuPy's, and PyTorch's from its own wheel, or the one
    ``cuda.pathfinder`` loads by path); a handle made by one is an invalid plan to the other
    (``cufftXtSetJITCallback`` then fails with cufftResult 1). The symbols are therefore looked up
    through CuPy's cuFFT binding module: the dynamic linker searches that module's own dependencies,
    which are the copy that makes CuPy's handles (``cufftCreate``, ``PlanNd``). No handle is probed:
    cuFFT handles are small integers, and another copy may hold a live plan with the same number."""
    import ctypes
    from cupy.cuda import cufft
    cufft.getVersion()  # makes CuPy load the library
    try:
        binding = ctypes.CDLL(cufft.__file__)
    except OSError as exc:
        raise OSError(f"cannot open CuPy's cuFFT binding {cufft.__file__}: {exc}") from None
    if getattr(binding, "cufftCreate", None) is None:
        raise OSError(f"CuPy's cuFFT binding {cufft.__file__} does not link cuFFT: no cufftCreate among its "
                      "dependencies")
    fn = next((getattr(binding, s) for s in ("cufftXtSetJITCallback_12_7", "cufftXtSetJITCallback")
               if getattr(binding, s, None) is not None), None)
    if fn is None:
        raise OSError(f"no cufftXtSetJITCallback in the cuFFT library CuPy links ({_library_of(binding.cufftCreate)})")
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                   ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = ctypes.c_int
    destroy = binding.cufftDestroy
    destroy.argtypes, destroy.restype = [ctypes.c_int], ctypes.c_int
    log.debug("cuFFT callbacks through %s", _library_of(fn))
    return fn, destroy


def _library_of(fn) -> str:
    """The path of the shared library that defines the ctypes function ``fn`` (``dladdr``), or ``?``."""
    import ctypes

    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                    ("saddr", ctypes.c_void_p)]

    info = DlInfo()
    for libname in (None, "libdl.so.2"):
        try:
            dladdr = ctypes.CDLL(libname).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes, dladdr.restype = [ctypes.c_void_p, ctypes.POINTER(DlInfo)], ctypes.c_int
        if dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) and info.fname:
            return info.fname.decode(errors="replace")
    return "?"


def callbacks_available() -> bool:
    return callbacks_unavailable_reason() is None


@functools.lru_cache(maxsize=None)
def _embed_kernel(long_rows: bool = False):
    """The embedding kernel for short rows, or (``long_rows``) for rows split into segments (see row_launch)."""
    import cupy
    return cupy.RawKernel(_EMBED_SOURCE, "convtune_fft_embed_long" if long_rows else "convtune_fft_embed")


def _is_cupy(xp) -> bool:
    return xp.__name__ == "cupy"


def unsupported_reason(problem: ConvProblem) -> str | None:
    """Why :class:`FreqMajorConv` cannot run ``problem``, or ``None``."""
    if problem.groups > MAX_GROUPS:
        return (f"{problem.groups} groups: the frequency-major product runs one GEMM per group and takes at "
                f"most {MAX_GROUPS}")
    return None


class FreqMajorConv:
    """One problem's frequency-major FFT executor at fixed transform sizes; built once, called many
    times (the cuFFT plans are made on the first call of each batch chunk size and kept)."""

    def __init__(self, xp, problem: ConvProblem, sizes: tuple[int, ...], chunk: int, strided: bool = False,
                 fused: bool = False, packed: bool = False, own: bool = False, narrow: bool = False,
                 tf32: bool = False):
        reason = unsupported_reason(problem)
        if reason is not None:
            raise ValueError(reason)
        self.xp, self.p, self.sizes = xp, problem, tuple(sizes)
        self.chunk = max(1, min(chunk, problem.batch))
        if packed and not _is_cupy(xp):
            raise ValueError("the packed product is a CUDA kernel (GPU only)")
        if own and not _is_cupy(xp):
            raise ValueError("convtune's own transforms are CUDA kernels (GPU only)")
        # a half-precision or channels_last problem: convtune's own transforms read and write its operands as they
        # lie (float32 storage of bfloat16 values, or its 16 bits), everything between in float32
        self.io = (problem.dtype, problem.layout) != ("float32", "channels_first")
        if self.io and not own:
            raise ValueError(f"a {problem.dtype} {problem.layout} problem runs here with convtune's own transforms "
                             "only (they read and write it; the others run its float32 channels-first problem "
                             "between conversions)")
        self.ops = _CupyOps(xp, self.sizes, strided, fused, packed, own, narrow, tf32) if _is_cupy(xp) else \
            _NumpyOps(xp, self.sizes)
        self.ops.round_bfloat16 = problem.dtype == "bfloat16"
        self.F, self.total = self.ops.F, self.ops.total
        p = problem
        # each gather twice: as slice copies, and as the (offset mod L, step, count) of the fused store
        self._fwd_geometry, self._fwd_index = self._gather(forward_gather(p))
        self._wgrad_geometry, self._wgrad_index = self._gather(filter_gather(p))
        self._dgrad_geometry, self._dgrad_index = self._gather(input_gather(p))
        # the input gradient is the whole inverse transform (no crop): it is written in place
        self._dgrad_whole = not any(p.padding) and p.input_size == self.sizes
        # sample k of an operand sits at k * step of its zero-extended L-sized buffer
        self._x_at = (1,) * p.rank
        self._dy_at = p.stride
        self._w_at = p.dilation

    # -- layout helpers ------------------------------------------------------------
    def _gather(self, spec):
        geometry = tuple((offset % L, step, count) for (offset, step, count), L in zip(spec, self.sizes))
        return geometry, gather_blocks(self.sizes, gather_positions(spec))

    def _spectrum(self, a, steps):
        """(F, n, C) spectrum of a batch operand (n, C, *spatial), zero-extended to L (sample k of
        an axis at k * step)."""
        n, c = a.shape[:2]
        if self.ops.own:  # (convtune's kernels take the operand as it lies)
            return self.ops.rfft(a, steps).reshape(self.F, n, c)
        return self.ops.rfft(a.reshape((n * c,) + a.shape[2:]), steps).reshape(self.F, n, c)

    def _groups(self, spec, per_group):
        """Per-group views (F, rows, per_group) of an (F, rows, G * per_group) spectrum (one group: the spectrum
        itself, no view made: a CuPy view costs microseconds of host time on every pass)."""
        if self.p.groups == 1:
            return [spec]
        return [spec[:, :, g * per_group:(g + 1) * per_group] for g in range(self.p.groups)]

    def _weight_groups(self, ws):
        """Per-group (F, Kg, Cg) views of the weight spectrum (F, K, Cg) (one group: itself)."""
        p = self.p
        if p.groups == 1:
            return [ws]
        return [ws[:, g * p.out_per_group:(g + 1) * p.out_per_group, :] for g in range(p.groups)]

    def _times_weight(self, s, in_per_group, w_g, op_w, out_channels, out_per_group):
        """(F, nb * out_channels) product of a batch chunk's spectrum ``s`` (F, nb, channels) and the
        per-group weight spectra."""
        nb = s.shape[1]
        res = self.ops.empty_spectrum(nb, out_channels)
        for a, ws, r in zip(self._groups(s, in_per_group), w_g, self._groups(res, out_per_group)):
            self.ops.gemm(a, "N", ws, op_w, r, 1.0 / self.total)
        return res.reshape(self.F, nb * out_channels)

    # -- spectra: what a round trip keeps between passes -----------------------------
    def x_spectrum(self, x):
        """(F, n, C) spectrum of the input (or of a batch chunk of it)."""
        return self._spectrum(x, self._x_at)

    def dy_spectrum(self, dy):
        """(F, n, K) spectrum of the output gradient (upsampled by the stride)."""
        return self._spectrum(dy, self._dy_at)

    def w_spectrum(self, w):
        """(F, K, Cg) spectrum of the weight (dilated)."""
        return self._spectrum(w, self._w_at)

    def forward_from(self, xs, ws, out):
        """``out`` (nb, K, *out) from the spectra of a batch chunk's input and of the weight."""
        p = self.p
        spec = self._times_weight(xs, p.in_per_group, self._weight_groups(ws), "C", p.out_channels,
                                  p.out_per_group)
        return self.ops.irfft_into(spec, out, self._fwd_geometry, self._fwd_index)

    def backward_data_from(self, dys, ws, out):
        """``out`` (nb, C, *in) from the spectra of a batch chunk's output gradient and of the weight."""
        p = self.p
        spec = self._times_weight(dys, p.out_per_group, self._weight_groups(ws), "N", p.in_channels,
                                  p.in_per_group)
        if self._dgrad_whole and out.flags.c_contiguous and not self.ops.own:
            self.ops.irfft(spec, out=out.reshape((out.shape[0] * p.in_channels,) + self.sizes))
            return out
        return self.ops.irfft_into(spec, out, self._dgrad_geometry, self._dgrad_index)

    def backward_filter_from(self, pairs, out):
        """``out`` (K, Cg, *k) from ``(dy spectrum, x spectrum)`` of each batch chunk, summed over them."""
        p, ops = self.p, self.ops
        scale = 1.0 / self.total
        acc = ops.empty_spectrum(p.out_channels, p.in_per_group)
        acc_g = self._weight_groups(acc)
        for i, (dys, xs) in enumerate(pairs):
            for ds, s, a in zip(self._groups(dys, p.out_per_group), self._groups(xs, p.in_per_group), acc_g):
                ops.gemm(ds, "C", s, "N", a, scale, beta=0.0 if i == 0 else 1.0)
        ops.irfft_into(acc.reshape(self.F, p.out_channels * p.in_per_group), out, self._wgrad_geometry,
                       self._wgrad_index)
        return out

    # -- passes ------------------------------------------------------------------
    def forward(self, x, w, out):
        ws = self.w_spectrum(w)
        for n0, n1 in batch_chunks(self.p.batch, self.chunk):
            self.forward_from(self.x_spectrum(x[n0:n1]), ws, out[n0:n1])
        return out

    def backward_data(self, dy, w, out):
        ws = self.w_spectrum(w)
        for n0, n1 in batch_chunks(self.p.batch, self.chunk):
            self.backward_data_from(self.dy_spectrum(dy[n0:n1]), ws, out[n0:n1])
        return out

    def backward_filter(self, x, dy, out):
        pairs = ((self.dy_spectrum(dy[n0:n1]), self.x_spectrum(x[n0:n1]))
                 for n0, n1 in batch_chunks(self.p.batch, self.chunk))  # one chunk's spectra alive at a time
        return self.backward_filter_from(pairs, out)

    def __call__(self, a, b, out):
        return {"fwd": self.forward, "dgrad": self.backward_data, "wgrad": self.backward_filter}[self.p.pass_](a, b, out)


def workspace_bytes(p: ConvProblem, sizes: tuple[int, ...], chunk: int) -> int:
    """Temporary bytes of one call: the zero-extended real buffers, the three spectra, the inverse
    transform's output, and cuFFT's work area (counted as large as the largest spectrum)."""
    nb = max(1, min(chunk, p.batch))
    F, total = spectrum_elems(sizes), math.prod(sizes)
    rows = (nb * p.in_channels, nb * p.out_channels, p.out_channels * p.in_per_group)
    spectra = 8 * F * sum(rows)
    real = 4 * total * (sum(rows) + max(rows))
    return spectra + real + 8 * F * max(rows)

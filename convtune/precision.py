"""Data types and memory layouts of a problem: what they mean, how they are stored, how they are checked.

**dtypes.** ``float32``, and the half-precision ``bfloat16`` and ``float16``: the dtype of the
operands and the result. Every strategy accumulates in float32 or better.

* Storage: ``float32`` and ``float16`` arrays are what they say. ``bfloat16`` is kept in float32
  arrays whose values are bfloat16 numbers (NumPy and CuPy have no bfloat16; PyTorch's bfloat16
  tensors convert to and from them exactly). The array API (``convtune.conv``) therefore reads
  float32 and float16 arrays; bfloat16 problems come from PyTorch, the command line, or a plan
  called on float32 arrays of bfloat16 values.
* Accuracy, as for the math modes: the relative error ``||out - ref|| / ||ref||`` against a float64
  reference computed from the same (half-rounded) operands. Rounding the exact result to the dtype
  alone costs up to one unit roundoff ``u`` (bfloat16: 2^-8, float16: 2^-11); a half-precision
  problem's bound is ``4u`` (bfloat16 1.6e-2, float16 2.0e-3), or the math mode's where that is
  looser (``tf32``: 1e-3 against float16's 2.0e-3: float16's). An fp32-accumulating result lands near
  ``u/2``; a half-accumulating one misses the bound on any long reduction. The bound comes from what
  cuDNN's own half-precision engines reach (PyTorch's convolution, ``benchmark`` on, on the H100, every
  pass and layout of the public suite, 2026-11-24, ``benchmarks/half_bounds.py``): bfloat16 at most
  0.8u (median 0.42u), float16 at most 2.25u (the ResNet-50 stem's filter gradient; median 0.43u).
  ``2u`` would reject cuDNN's own float16 filter gradient there; ``4u`` leaves PyTorch's convolution a
  margin of 1.8x and still rejects half-precision accumulation.

**Layouts.** ``channels_first`` (NCHW, NCL; the default) or ``channels_last`` (NHWC, NLC): the memory
order of every operand and of the result. Arrays keep their logical shape ``(N, C, *spatial)``, as
PyTorch's tensors do; the layout is in their strides.

**Reading what a strategy cannot.** A strategy reads the dtypes and layouts it lists
(``native_dtypes``, ``native_layouts``; float32 channels-first for most). Any other problem runs
through :func:`bounded`: the operands are converted to float32 channels-first, the strategy's
float32 executor runs, and its result is rounded to the dtype and written in the layout. The
planner times that whole, conversions included, as the candidate.
"""

from __future__ import annotations

from .executor import Executor, as_executor

DTYPES = ("float32", "bfloat16", "float16")
LAYOUTS = ("channels_first", "channels_last")
#: Unit roundoff (half the spacing of numbers in [1, 2)) of each dtype.
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
#: The bound on a half-precision problem's relative error: four unit roundoffs (see the module docstring).
DTYPE_TOLERANCE = {"bfloat16": 4 * UNIT_ROUNDOFF["bfloat16"], "float16": 4 * UNIT_ROUNDOFF["float16"]}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
#: The array dtype a problem's dtype is stored in.
STORAGE = {"float32": "float32", "bfloat16": "float32", "float16": "float16"}


def check(dtype: str, layout: str) -> None:
    """``ValueError`` naming the acceptable values where ``dtype`` or ``layout`` is unknown."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; acceptable dtypes: {', '.join(DTYPES)}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; acceptable layouts: {', '.join(LAYOUTS)}")


def tolerance(dtype: str, math_tolerance: float) -> float:
    """The bound on a problem's relative error: its math mode's, or its dtype's where that is looser."""
    return max(math_tolerance, DTYPE_TOLERANCE.get(dtype, 0.0))


def dtype_of(array) -> str:
    """The problem dtype of an array (``ValueError`` for one convtune does not run)."""
    name = str(array.dtype)
    if name in ("float32", "float16"):
        return name
    raise ValueError(f"convtune runs float32 and float16 arrays; got {name}. Convert with .astype('float32')"
                     + (" (a bfloat16 problem takes float32 arrays of bfloat16 values: see convtune.precision)"
                        if name == "bfloat16" else ""))


def layout_of(array) -> str:
    """``channels_last`` where the array's strides are those of a dense channels-last array (and not also
    those of a channels-first one, as with one channel), else ``channels_first``."""
    shape, strides = array.shape, array.strides
    if len(shape) < 3 or shape[1] == 1:
        return "channels_first"
    item = array.itemsize
    order = (0, *range(2, len(shape)), 1)  # memory order of channels_last: N, spatial..., C
    expected, step = [0] * len(shape), item
    for axis in reversed(order):
        expected[axis] = step
        step *= shape[axis]
    if all(s == e or n == 1 for s, e, n in zip(strides, expected, shape)):
        return "channels_last"
    return "channels_first"


def laid_out(xp, a, layout: str):
    """``a`` (logical shape ``(N, C, *spatial)``) with the memory order of ``layout``: itself where it has
    it already, else a copy."""
    if layout == "channels_first" or a.ndim < 3:
        return xp.ascontiguousarray(a)
    if layout_of(a) == "channels_last":
        return a
    order = (0, *range(2, a.ndim), 1)
    inverse = [order.index(axis) for axis in range(a.ndim)]
    return xp.ascontiguousarray(a.transpose(order)).transpose(inverse)


def round_to(xp, a, dtype: str):
    """``a`` (float32) rounded to ``dtype`` (to nearest, ties to even), in the dtype's storage: a new array
    for half precision, ``a`` itself for float32."""
    if dtype == "float32":
        return a
    if dtype == "float16":  # beyond float16's range is infinity, as rounding says (NumPy would warn too)
        errstate = getattr(xp, "errstate", None)
        if errstate is None:
            return a.astype(xp.float16)
        with errstate(over="ignore"):
            return a.astype(xp.float16)
    bits = xp.ascontiguousarray(a, dtype=xp.float32).view(xp.uint32)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    return bits.view(xp.float32).reshape(a.shape)


def empty_result(xp, problem, fill=None):
    """An array for ``problem``'s result in its storage dtype and layout (filled with ``fill`` if given)."""
    out = empty_in(xp, problem.result_shape, STORAGE[problem.dtype], problem.layout)
    if fill is not None:
        out[...] = fill
    return out


def stored(xp, a, problem):
    """A float32 channels-first array as ``problem`` stores its operands: rounded to its dtype, in its
    layout."""
    return laid_out(xp, round_to(xp, a, problem.dtype), problem.layout)


# -- the memory a by-address launch reads ---------------------------------------------------------------
def _channels_last_memory(ndim: int, layout: str) -> bool:
    """Whether ``layout``'s memory order differs from the logical ``(N, C, *spatial)`` one (channels last, with at
    least one spatial axis)."""
    return layout == "channels_last" and ndim >= 3


def _memory_order(ndim: int, layout: str) -> tuple:
    """Axis order of ``layout``'s memory for a logical ``(N, C, *spatial)`` array."""
    return (0, *range(2, ndim), 1) if _channels_last_memory(ndim, layout) else tuple(range(ndim))


def launch_strides(shape, layout: str) -> tuple[int, ...]:
    """Element strides, per logical axis of ``shape`` (``(N, C, *spatial)``), of the dense memory a by-address launch
    reads in ``layout`` (:func:`launch_memory`)."""
    order = _memory_order(len(shape), layout)
    strides, step = [0] * len(shape), 1
    for axis in reversed(order):
        strides[axis] = step
        step *= shape[axis]
    return tuple(strides)


def launch_memory(xp, a, dtype: str, layout: str):
    """``a`` (stored as :mod:`convtune.precision` stores ``dtype`` in ``layout``) as the memory a by-address
    launch of that dtype and layout reads: a C-contiguous array in the layout's memory order (``(N, *spatial,
    C)`` for channels_last) in the dtype's own element type (bfloat16: its 16 bits, as ``uint16``). A view
    where ``a`` is that memory already (float32 and float16)."""
    if dtype != "bfloat16" and a.flags.c_contiguous and not _channels_last_memory(a.ndim, layout):
        return a  # (channels-first memory already: no view made, on every call of a cached pass)
    a = xp.ascontiguousarray(a.transpose(_memory_order(a.ndim, layout)))
    if dtype == "bfloat16":  # float32 storage of bfloat16 values: their upper 16 bits, exactly
        a = (a.view(xp.uint32) >> 16).astype(xp.uint16)
    return a


def bits_of(xp, a, layout: str):
    """A bfloat16 operand (float32 storage, logical shape, ``layout``) as its 16 bits: a ``uint16`` array of the same
    logical shape whose memory is in ``layout``'s order (a copy)."""
    return _logical(launch_memory(xp, a, "bfloat16", layout), layout)


def empty_bits(xp, shape, layout: str):
    """An uninitialised bfloat16 result of logical ``shape`` as its 16 bits (see :func:`bits_of`)."""
    return _logical(launch_result(xp, shape, "bfloat16", layout), layout)


def launch_result(xp, shape, dtype: str, layout: str):
    """An uninitialised result of logical ``shape`` as a launch writes it (see :func:`launch_memory`)."""
    return _empty_memory(xp, shape, {"float32": xp.float32, "float16": xp.float16, "bfloat16": xp.uint16}[dtype],
                         layout)


def from_launch(xp, memory, dtype: str, layout: str):
    """A launch's result memory (:func:`launch_result`) as a logical ``(N, C, *spatial)`` array in the dtype's
    storage (a view, but for bfloat16's widening)."""
    if dtype == "bfloat16":
        memory = (memory.astype(xp.uint32) << 16).view(xp.float32)
    return _logical(memory, layout)


def launched(launch, problem, xp, workspace: int = 0):
    """The :class:`~convtune.executor.Executor` of a by-address ``launch(a, b, out, stream[, workspace])`` that
    reads and writes ``problem``'s dtype and layout itself (bfloat16 as 16-bit numbers): its ``run`` makes the
    operands launch memory (:func:`launch_memory`) and writes the result back in the problem's storage; it
    carries ``launch`` (``launch_reads_bfloat16``; ``launch_workspace`` bytes, passed as a fifth argument where
    not 0) and ``timed`` (the launch on memory prepared once: what the PyTorch bridge's calls run, without the
    packing the array calls add)."""
    dtype, layout, shape = problem.dtype, problem.layout, problem.result_shape

    def prepared(a, b):
        ws = xp.empty(workspace, dtype=xp.uint8) if workspace else None
        return (launch_memory(xp, a, dtype, layout), launch_memory(xp, b, dtype, layout),
                launch_result(xp, shape, dtype, layout), ws)

    def call(ma, mb, res, ws):
        args = (ma.data.ptr, mb.data.ptr, res.data.ptr, xp.cuda.get_current_stream())
        launch(*args) if ws is None else launch(*args, ws.data.ptr)

    def run(a, b, out=None):
        held = prepared(a, b)
        call(*held)
        result = from_launch(xp, held[2], dtype, layout)
        if out is None:
            return laid_out(xp, result, layout)
        out[...] = result
        return out

    def timed(a, b, out):
        held = prepared(a, b)
        return lambda: call(*held)
    return Executor(run, launch=launch, launch_reads_bfloat16=True, launch_workspace=workspace, timed=timed)


def bounded(run, problem, xp):
    """``run`` (the float32 channels-first executor of ``problem``'s strategy) as an executor of ``problem``
    in its dtype and layout: operands converted to float32 channels-first, the result rounded to the
    dtype and written in the layout (see the module docstring).

    On the GPU the result is rounded and laid out in one kernel (:func:`_rounding_kernel`), and the
    :class:`~convtune.executor.Executor` carries ``timed``: the operands read from the dtype's own memory in
    the layout (bfloat16 as 16 bits), widened to float32 channels-first, ``run``, the result narrowed back,
    one kernel per conversion, as the PyTorch bridge runs it (its conversions are PyTorch's, from and to
    half-precision tensors). Its ``float32`` is ``run`` itself, for a caller that makes the conversions."""
    dtype, layout, shape = problem.dtype, problem.layout, problem.result_shape
    f32 = xp.float32
    gpu = hasattr(xp, "ElementwiseKernel")

    def call(a, b, out=None):
        return narrowed(xp, run(widened(xp, a), widened(xp, b)), problem, out)
    run = as_executor(run)  # (the float32 executor, run directly by a caller that converts: the PyTorch bridge)
    timed = None
    if gpu:
        def timed(a, b, out):
            ma, mb = (_logical(launch_memory(xp, v, dtype, layout), layout) for v in (a, b))
            result = _logical(launch_result(xp, shape, dtype, layout), layout)
            a32, b32, r32 = xp.empty(a.shape, f32), xp.empty(b.shape, f32), xp.empty(shape, f32)
            widen, narrow = _widening_kernel(xp, dtype), _rounding_kernel(xp, dtype, bits=True)

            def go():
                widen(ma, a32)
                widen(mb, b32)
                run(a32, b32, r32)
                narrow(r32, result)
                return result  # (the dtype's own memory, as a logical view)
            return go
    return Executor(call, timed=timed, float32=run)


def widened(xp, a):
    """A problem's operand (its dtype's storage, its layout) as float32 channels-first: ``a`` itself where it is."""
    return xp.ascontiguousarray(a, dtype=xp.float32)


def narrowed(xp, result, problem, out=None):
    """A float32 channels-first ``result`` as ``problem`` stores its result: rounded to its dtype, in its layout
    (into ``out`` where given; on the GPU in one kernel)."""
    dtype, layout = problem.dtype, problem.layout
    if hasattr(xp, "ElementwiseKernel"):  # one pass: rounded and laid out
        if out is None:
            out = empty_in(xp, result.shape, STORAGE[dtype], layout)
        _rounding_kernel(xp, dtype, bits=False)(result, out)
        return out
    result = round_to(xp, result, dtype)
    if out is None:
        return laid_out(xp, result, layout)
    out[...] = result
    return out


def empty_in(xp, shape, storage: str, layout: str):
    """An uninitialised array of logical ``shape`` whose memory is in ``layout``'s order (``storage``: a dtype name
    of ``xp``)."""
    if not _channels_last_memory(len(shape), layout):
        return xp.empty(shape, dtype=storage)
    return _logical(_empty_memory(xp, shape, getattr(xp, storage), layout), layout)


def _empty_memory(xp, shape, element, layout: str):
    """Uninitialised C-contiguous memory for an array of logical ``shape`` in ``layout``'s order."""
    return xp.empty(tuple(shape[axis] for axis in _memory_order(len(shape), layout)), dtype=element)


def _logical(memory, layout: str):
    """Memory in ``layout``'s order (C-contiguous, ``(N, *spatial, C)`` for channels_last) as a logical
    ``(N, C, *spatial)`` view."""
    order = _memory_order(memory.ndim, layout)
    return memory.transpose([order.index(axis) for axis in range(memory.ndim)])


# (CuPy's elementwise kernels index each array by its own strides: one kernel converts and lays out at once)
_WIDEN = {"bfloat16": ("uint16 h", "y = __uint_as_float(((unsigned int)h) << 16)"),
          "float16": ("float16 h", "y = (float)h"), "float32": ("float32 h", "y = h")}
_BF16_ROUNDED = "unsigned int r = __float_as_uint(x); r = (r + (((r >> 16) & 1u) + 0x7FFFu)) & 0xFFFF0000u;"
_NARROW = {("bfloat16", False): ("float32 y", _BF16_ROUNDED + " y = __uint_as_float(r)"),
           ("bfloat16", True): ("uint16 y", _BF16_ROUNDED + " y = (unsigned short)(r >> 16)"),
           ("float16", False): ("float16 y", "y = (float16)x"), ("float16", True): ("float16 y", "y = (float16)x"),
           ("float32", False): ("float32 y", "y = x"), ("float32", True): ("float32 y", "y = x")}


def _widening_kernel(xp, dtype: str):
    """``k(h, y)``: ``dtype``'s memory (bfloat16 as its 16 bits) into float32 ``y``, any strides on both."""
    return _kernel(xp, "in", dtype, False)


def _rounding_kernel(xp, dtype: str, bits: bool):
    """``k(x, y)``: float32 ``x`` rounded to ``dtype`` (to nearest, ties to even, as :func:`round_to`) into
    ``y``: ``dtype``'s storage (bfloat16 in float32), or with ``bits`` its own memory (bfloat16 as 16 bits)."""
    return _kernel(xp, "out", dtype, bits)


_KERNELS: dict = {}


def _kernel(xp, way: str, dtype: str, bits: bool):
    key = (way, dtype, bits)
    kernel = _KERNELS.get(key)
    if kernel is None:
        if way == "in":
            params, body = _WIDEN[dtype]
            kernel = xp.ElementwiseKernel(params, "float32 y", body, f"convtune_widen_{dtype}")
        else:
            params, body = _NARROW[dtype, bits]
            kernel = xp.ElementwiseKernel("float32 x", params, body,
                                          f"convtune_round_{dtype}{'_bits' if bits else ''}")
        _KERNELS[key] = kernel
    return kernel

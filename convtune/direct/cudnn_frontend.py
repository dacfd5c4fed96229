"""How a convolution problem maps onto the cuDNN frontend's graph API (``nvidia-cudnn-frontend``, module ``cudnn``):
the module loaded lazily, the tensors' dims and strides, data types, the numeric notes that rule a plan out, and how
an execution binds its operands. The strategy itself is :mod:`convtune.strategies.cudnn`."""

from __future__ import annotations

import importlib
import inspect

from ..problem import ConvProblem

#: Numeric notes that rule a plan out, per math mode (float32 problems; see :func:`excluded_notes`).
EXCLUDED_NOTES = {"fp32": ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION"),
                  "tf32": ("DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION")}


def excluded_notes(math: str, dtype: str) -> tuple[str, ...]:
    """The numeric notes that rule a plan out: per math mode for float32; for bfloat16 and float16 operands
    tensor cores are their engines' own way (multiplying half numbers is exact in float32) and only a
    reduction in reduced precision is ruled out (accumulation is float32 or better, see convtune.precision).

    >>> excluded_notes("fp32", "bfloat16")
    ('REDUCED_PRECISION_REDUCTION',)
    """
    if dtype == "float32":
        return EXCLUDED_NOTES[math]
    return ("REDUCED_PRECISION_REDUCTION",)


def load():
    """The cudnn module, or the reason it cannot be used."""
    try:
        return importlib.import_module("cudnn"), None
    except Exception as exc:  # ImportError, or a library that fails to load
        return None, f"the cuDNN frontend is not importable ({type(exc).__name__}: {exc}); pip install " \
                     "'convtune[cudnn]' (nvidia-cudnn-frontend)"


def geometry(p: ConvProblem):
    """Shapes and geometry as cuDNN takes them: 4-D tensors for ranks 1 (given a height-1 axis) and 2,
    5-D for rank 3."""
    def lift(values, fill):
        return [fill, *values] if p.rank == 1 else list(values)
    x = [p.batch, p.in_channels, *lift(p.input_size, 1)]
    w = [p.out_channels, p.in_per_group, *lift(p.kernel_size, 1)]
    y = [p.batch, p.out_channels, *lift(p.output_size, 1)]
    return x, w, y, lift(p.padding, 0), lift(p.stride, 1), lift(p.dilation, 1)


def strides(dims, layout: str = "channels_first"):
    """Element strides of a dense tensor of logical ``dims`` ``(N, C, *spatial)`` in ``layout``'s memory order
    (channels_last: N, spatial..., C; a 1-D problem's lifted height axis is spatial too)."""
    order = list(range(len(dims)))
    if layout == "channels_last":
        order = [0, *range(2, len(dims)), 1]
    out, acc = [0] * len(dims), 1
    for axis in reversed(order):
        out[axis] = acc
        acc *= dims[axis]
    return out


#: The frontend's data type of each problem dtype (operands and result; compute is always float32).
DATA_TYPES = {"float32": "FLOAT", "bfloat16": "BFLOAT16", "float16": "HALF"}


def ordered_uids(execute, tensors) -> tuple | None:
    """The operands' uids where the frontend's ``execute_plan_at_index`` binds buffers by position
    (``tensor_uids``: 1.32 does; older ones may not), else ``None`` (the mapping form)."""
    try:
        if "tensor_uids" not in inspect.signature(execute).parameters:
            return None
        return tuple(int(t.uid) if hasattr(t, "uid") else int(t.get_uid()) for t in tensors)
    except (TypeError, ValueError, AttributeError):  # no signature, or tensors without uids yet
        return None

"""Dtypes and memory formats of the drop-in's tensors: which PyTorch dtypes convtune runs, a call's layout, the
memory format of a result (channels_last where an operand is), and dense copies in a given format."""

from __future__ import annotations


import torch

from ..problem import ConvProblem

CHANNELS_LAST = torch.channels_last
CHANNELS_LAST_3D = torch.channels_last_3d
CONTIGUOUS = torch.contiguous_format
#: The memory order of a channels-last 1-D call (N, L, C), for which PyTorch has no memory format: a by-address
#: launch of such a problem reads and writes it (see ArrayPlan)
NLC = "NLC"

def channels_last_format(dim: int):
    """PyTorch's channels-last memory format for tensors of ``dim`` dimensions (``None``: there is none)."""
    return {4: CHANNELS_LAST, 5: CHANNELS_LAST_3D}.get(dim)


def layout_format(problem: ConvProblem):
    """PyTorch's memory format for a problem's tensors: channels-last for a channels_last problem of rank 2 or 3,
    else contiguous (a 1-D channels_last problem's (N, L, C) memory has no format of its own)."""
    fmt = channels_last_format(problem.rank + 2) if problem.layout == "channels_last" else None
    return fmt or CONTIGUOUS


def is_channels_last(t) -> bool:
    """A 4-D or 5-D tensor laid out channels-last (and not also plain contiguous, as C == 1 tensors are)."""
    fmt = channels_last_format(t.dim())
    return fmt is not None and not t.is_contiguous() and t.is_contiguous(memory_format=fmt)


def result_format(a, b):
    """The memory format of a pass's result: channels-last where either operand is (as PyTorch's cuDNN and
    oneDNN convolutions decide it; in a channels_last model both are)."""
    return channels_last_format(a.dim()) if is_channels_last(a) or is_channels_last(b) else CONTIGUOUS


#: PyTorch's dtypes convtune runs, by the problem's name for them.
DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def tensor_layout(x, w=None) -> str:
    """A call's layout: ``channels_last`` where the input (or, 2-D and 3-D, the weight) is laid out
    channels-last (NHWC, NDHWC; NLC for a 1-D convolution's input), else ``channels_first``."""
    if x.is_contiguous() and (w is None or w.is_contiguous()):  # (the common case, answered first)
        return "channels_first"
    if x.dim() in (4, 5):
        return "channels_last" if is_channels_last(x) or (w is not None and is_channels_last(w)) else "channels_first"
    if x.dim() == 3 and x.size(1) > 1 and x.size(2) > 1 and x.stride(1) == 1 and x.stride(2) == x.size(1):
        return "channels_last"
    return "channels_first"


def in_result_format(out, a, b):
    """``out`` in the memory format of a pass's result on operands ``a`` and ``b`` (:func:`result_format`):
    itself where it has it, else a copy."""
    if a.is_contiguous() and b.is_contiguous():  # channels-first operands (the common case: a third of the host time)
        return out if out.is_contiguous() else out.contiguous()
    fmt = result_format(a, b)
    return out if out.is_contiguous(memory_format=fmt) else out.contiguous(memory_format=fmt)


def dense(t):
    """``t`` as it is where it is dense (contiguous or channels_last), else a contiguous copy."""
    if t.is_contiguous() or is_channels_last(t):
        return t
    return t.contiguous()


def dense_as(t, dtype, fmt):
    """``t`` in ``dtype``, dense in memory format ``fmt`` (itself where it is; ``Tensor.to`` alone would keep
    a non-dense tensor of the same dtype as it is); ``fmt`` :data:`NLC`: a 3-D tensor dense in (N, L, C) order."""
    if fmt is NLC:
        t = t.to(dtype)
        return t if t.transpose(1, 2).is_contiguous() else t.transpose(1, 2).contiguous().transpose(1, 2)
    if t.dtype != dtype:
        t = t.to(dtype=dtype, memory_format=fmt)
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)

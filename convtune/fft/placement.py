"""Where an FFT convolution's operands and results sit inside the transforms: alignment for the FFT libraries,
and the gathers (``(offset, step, count)`` per axis) that read a pass's outputs out of a cyclic result."""

from __future__ import annotations

import itertools

from ..problem import ConvProblem

#: cuFFT rejects (CUFFT_INVALID_VALUE) real buffers not aligned like its complex type; a batch chunk
#: of an odd-sized operand can start anywhere.
FFT_ALIGNMENT = 8


def is_fft_aligned(a) -> bool:
    ptr = getattr(getattr(a, "data", None), "ptr", None)  # device arrays only; NumPy's FFT takes any
    return ptr is None or ptr % FFT_ALIGNMENT == 0


def fft_aligned(a):
    """``a``, or an aligned copy where it is a device array that cuFFT would reject."""
    return a if is_fft_aligned(a) else a.copy()


def gather_blocks(sizes, per_axis):
    """Copy blocks ``[(src, dst), ...]`` that gather positions (taken mod L) per axis.

    Positions ``start + k*step`` wrap around L at most once, so each axis splits into at most two
    strided runs, and the gather is a few slice copies instead of an index array.
    """
    runs_per_axis = []
    for positions, L in zip(per_axis, sizes):
        positions = [v % L for v in positions]
        runs, start = [], 0
        for k in range(1, len(positions) + 1):
            if k == len(positions) or positions[k] < positions[k - 1]:
                step = positions[start + 1] - positions[start] if k - start > 1 else 1
                runs.append((slice(positions[start], positions[k - 1] + 1, step), slice(start, k)))
                start = k
        runs_per_axis.append(runs)
    blocks = []
    for combo in itertools.product(*runs_per_axis):
        src = (slice(None), slice(None)) + tuple(r[0] for r in combo)
        dst = (slice(None), slice(None)) + tuple(r[1] for r in combo)
        blocks.append((src, dst))
    return blocks


def gather(out, full, blocks):
    for src, dst in blocks:
        out[dst] = full[src]


# The gathers from a circular result, per axis (offset, step, count): output q is element
# (q*step - offset) mod L.
def forward_gather(p: ConvProblem):
    """Forward output q reads (q*s - pad) mod L."""
    return tuple(zip(p.padding, p.stride, p.output_size))


def filter_gather(p: ConvProblem):
    """Filter tap k reads (k*dil - pad) mod L."""
    return tuple(zip(p.padding, p.dilation, p.kernel_size))


def input_gather(p: ConvProblem):
    """Input-gradient position i reads i + pad."""
    return tuple((-pad, 1, n) for pad, n in zip(p.padding, p.input_size))


def gather_positions(spec):
    """Per axis, the circular indices a gather ``(offset, step, count)`` reads."""
    return [[q * step - offset for q in range(count)] for offset, step, count in spec]

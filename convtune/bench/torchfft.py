"""The ``torch-fft`` peer: the FFT convolution a PyTorch user writes by hand for large kernels.

The recipe: ``torch.fft.rfftn`` of the input and of the flipped kernel at the
next 2·3·5·7-smooth size of ``n + k - 1`` per axis (what ``scipy.fft.next_fast_len`` picks for
cuFFT; the input is zero-padded only where the layer's padding exceeds ``k - 1``, since padding up
to that is a shift of the crop), the channel product (elementwise for a depthwise layer, ``torch.einsum`` over the
groups otherwise), ``torch.fft.irfftn``, crop; the gradients by autograd. A dilated kernel is the
kernel with zeros between its taps; a stride keeps every ``s``-th output of the stride-1 result.

It is a peer for *FFT-class* layers (:func:`unsupported_reason`): stride 1 and a (dilated) kernel
of at least :data:`MIN_KERNEL` per axis; for the others nobody writes an FFT convolution.

Its passes, timed one by one like every contestant's: the forward without autograd; backward-data
and backward-filter as ``torch.autograd.grad`` of one forward graph built beforehand (so each pass
runs only its own branch of the backward). :func:`round_trip` times what a training step runs: the
forward with autograd and one ``backward`` computing both gradients.

Every run sets PyTorch's TF32 switches to the problem's math mode (:func:`set_math`): TF32 for ``tf32``, off for
``fp32``. The dense layers' channel product is a complex matmul that TF32 speeds up; left to whatever the peer run
before it set (the ``torch-tf32`` peer turns TF32 on), it ran fbfft-L2's and dense-k31's round trips at 2.6e-4
relative error, 20x over the fp32 bound, and faster than an fp32 peer.
"""

from __future__ import annotations

from ..fft.sizes import next_smooth
from ..problem import ConvProblem

NAME = "torch-fft"
#: Smallest (dilated) kernel extent per axis for which the peer is written.
MIN_KERNEL = 7


def unsupported_reason(problem: ConvProblem) -> str | None:
    if problem.dtype == "float16":
        return "float16: torch.fft runs half precision at powers of two only"
    if any(s != 1 for s in problem.stride):
        return "strided: nobody writes an FFT convolution for it"
    if min(problem.dilated_kernel) < MIN_KERNEL:
        return f"a kernel under {MIN_KERNEL} per axis: nobody writes an FFT convolution for it"
    return None


def fft_conv(torch, x, w, problem: ConvProblem):
    """PyTorch's convolution of ``x`` (N, C, *n) with ``w`` (O, C/g, *k) for ``problem``'s geometry,
    as an FFT convolution in PyTorch (differentiable)."""
    rank = problem.rank
    if any(d != 1 for d in problem.dilation):
        dilated = w.new_zeros(w.shape[:2] + problem.dilated_kernel)
        dilated[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in problem.dilation)] = w
        w = dilated
    k = problem.dilated_kernel
    # zero padding up to k - 1 per axis is inside the linear convolution of size n + k - 1 already (a
    # crop further left): only padding beyond it is added, so the transforms are no larger than needed
    extra = tuple(max(0, p - (kk - 1)) for p, kk in zip(problem.padding, k))
    pads = [p for pad in reversed(extra) for p in (pad, pad)]
    xp = torch.nn.functional.pad(x, pads) if any(extra) else x
    n = xp.shape[2:]
    sizes = tuple(next_smooth(a + b - 1) for a, b in zip(n, k))
    axes = tuple(range(2, 2 + rank))
    X = torch.fft.rfftn(xp, s=sizes, dim=axes)
    W = torch.fft.rfftn(torch.flip(w, dims=axes), s=sizes, dim=axes)
    g = problem.groups
    if problem.depthwise and problem.out_per_group == 1:
        Y = X * W[:, 0].unsqueeze(0)
    else:
        batch, spec = X.shape[0], X.shape[2:]
        Xg = X.reshape(batch, g, problem.in_per_group, *spec)
        Wg = W.reshape(g, problem.out_per_group, problem.in_per_group, *spec)
        Y = torch.einsum("ngc...,goc...->ngo...", Xg, Wg).reshape(batch, problem.out_channels, *spec)
    full = torch.fft.irfftn(Y, s=sizes, dim=axes)
    start = tuple(kk - 1 - (p - e) for kk, p, e in zip(k, problem.padding, extra))
    crop = tuple(slice(s, s + o) for s, o in zip(start, problem.output_size))
    return full[(slice(None), slice(None)) + crop]


def set_math(torch, problem: ConvProblem) -> None:
    """PyTorch's TF32 switches (matmul and cuDNN) as ``problem``'s math mode allows: on for ``tf32``, else off."""
    tf32 = problem.math == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def _as_tensor(torch, array):
    return torch.from_numpy(array) if type(array).__module__.startswith("numpy") else torch.from_dlpack(array)


def make_pass(torch, problem: ConvProblem, a, b):
    """``fn() -> tensor`` computing ``problem``'s pass from the bench's operands ``a, b`` (NumPy or
    CuPy arrays, viewed without a copy)."""
    ta, tb = _as_tensor(torch, a), _as_tensor(torch, b)
    if problem.pass_ == "fwd":
        def run():
            set_math(torch, problem)
            with torch.no_grad():
                return fft_conv(torch, ta, tb, problem)
        return run
    gen = torch.Generator(device=ta.device).manual_seed(1)
    if problem.pass_ == "dgrad":  # a = dy, b = w: the input's values do not enter its gradient
        x = torch.randn(problem.x_shape, generator=gen, device=ta.device, dtype=ta.dtype, requires_grad=True)
        w, dy, wrt = tb, ta, x
    else:  # wgrad: a = x, b = dy
        w = torch.randn(problem.w_shape, generator=gen, device=ta.device, dtype=ta.dtype, requires_grad=True)
        x, dy, wrt = ta, tb, w
    y = fft_conv(torch, x, w, problem)

    def run():
        set_math(torch, problem)
        return torch.autograd.grad(y, wrt, dy, retain_graph=True)[0]
    return run


def round_trip(torch, problem: ConvProblem, x, w, dy):
    """``fn()`` running what a training step runs: the forward with autograd, then one backward that
    computes both gradients; returns (y, dx, dw)."""
    tx = _as_tensor(torch, x).detach().requires_grad_(True)
    tw = _as_tensor(torch, w).detach().requires_grad_(True)
    tdy = _as_tensor(torch, dy)

    def run():
        set_math(torch, problem)
        tx.grad = tw.grad = None
        y = fft_conv(torch, tx, tw, problem)
        y.backward(tdy)
        return y.detach(), tx.grad, tw.grad
    return run


def floor_ms(problem: ConvProblem, bandwidth_bytes_s: float | None, round_trip_: bool = False) -> float | None:
    """The minimal-traffic time of a pass (its operands read once, its result written once) or of a
    round trip (x, w, y, dy, dx and dw once each) at ``bandwidth_bytes_s``."""
    if not bandwidth_bytes_s:
        return None
    # the forward moves x, w and y once; a round trip's six tensors are those three shapes twice
    moved = 2 * problem.for_pass("fwd").min_bytes() if round_trip_ else problem.min_bytes()
    return moved / bandwidth_bytes_s * 1e3

"""Overlap-save tiling: a large stride-1 convolution as a batch of small ones on tiles.

Per axis, with ``e`` the dilated kernel's extent and tile length ``T``, each tile of ``T`` padded
input samples yields ``t = T - e + 1`` whole outputs, so ``m = ceil(o / t)`` tiles starting every
``t`` samples cover the ``o`` outputs::

    y[j*t + q] = sum_a xpad[j*t + q + a*d] w[a] = sum_a X_j[q + a*d] w[a],   X_j = xpad[j*t : j*t + T]

The tiles become extra batch entries of an unpadded problem on ``T`` samples (batch ``N * M``,
``M`` the tile count), whose transforms are ``T`` long: the kernel is transformed once per call and
its spectrum serves every tile. The backward passes follow by adjointness:

* backward-data runs on ``t``-sample blocks of ``dy`` (zeros past ``o``); each block's gradient is
  ``T`` long and overlaps the next block's by ``e - 1`` samples, so the blocks are added back
  (overlap-add), and the padding is cropped;
* backward-filter sums over tiles as over the batch: the input tiles against the ``dy`` blocks.

Tiles need ``t >= e - 1`` (each output block's gradient spills into the next block only), so
``T >= 2e - 1``. The search axis is ``T`` (:data:`TILE_LENGTHS`, the same on every axis); the cost
model keeps the tilings worth timing (:mod:`convtune.strategies.fft`).

Examples
--------
>>> from convtune.problem import ConvProblem
>>> p = ConvProblem.make(batch=2, in_channels=8, out_channels=8, input_size=(200, 200), kernel_size=5, padding=2)
>>> tiling = Tiling(p, (32, 32))
>>> tiling.counts, tiling.inner.describe()
((8, 8), 'conv2d fwd N=128 C=8->8 in=32x32 k=5x5 s=1x1 p=0x0 d=1x1 g=1 fp32')
"""

from __future__ import annotations

import itertools
import math

from ..problem import ConvProblem

#: Tile lengths the planner considers (per axis, the same on every axis): powers of 2, which the
#: FFT libraries transform fastest and convtune's own transforms take at 64.
TILE_LENGTHS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def applies(p: ConvProblem) -> str | None:
    """Why overlap-save tiling does not apply to ``p`` at any tile length, or None."""
    if any(s != 1 for s in p.stride):
        return "tiling runs stride-1 problems (a strided one is tiled in its polyphase form)"
    return None


def tile_reason(p: ConvProblem, tile: tuple[int, ...]) -> str | None:
    """Why ``p`` cannot be tiled with ``tile`` samples per axis, or None."""
    reason = applies(p)
    if reason is not None:
        return reason
    if len(tile) != p.rank:
        return f"tile {tuple(tile)} has {len(tile)} entries, the problem {p.rank} axes"
    for axis, (T, e) in enumerate(zip(tile, p.dilated_kernel)):
        if T < 2 * e - 1:
            return (f"axis {axis}: a tile of {T} is shorter than 2e - 1 = {2 * e - 1} for a dilated kernel of {e} "
                    "(each tile's gradient may overlap its neighbour's only)")
    return None


def tile_lengths(p: ConvProblem) -> list[int]:
    """The lengths of :data:`TILE_LENGTHS` that tile ``p`` into at least two tiles."""
    lengths = []
    for T in TILE_LENGTHS:
        if tile_reason(p, (T,) * p.rank) is None and math.prod(Tiling(p, (T,) * p.rank).counts) >= 2:
            lengths.append(T)
    return lengths


class Tiling:
    """The tiles of one problem, the problem they make, and the rearrangements between the two."""

    def __init__(self, problem: ConvProblem, tile: tuple[int, ...]):
        reason = tile_reason(problem, tuple(tile))
        if reason is not None:
            raise ValueError(f"overlap-save tiling of {problem.describe()}: {reason}")
        p = self.p = problem
        self.tile = tuple(tile)
        self.step = tuple(T - e + 1 for T, e in zip(self.tile, p.dilated_kernel))  # whole outputs per tile
        self.counts = tuple(-(-o // t) for o, t in zip(p.output_size, self.step))
        self.M = math.prod(self.counts)
        # the padded input the tiles read: m*t + e - 1 >= n + 2p samples per axis
        self.grid = tuple(m * t + T - t for m, t, T in zip(self.counts, self.step, self.tile))
        self.inner = p.replace(batch=p.batch * self.M, input_size=self.tile, padding=(0,) * p.rank)

    # -- shapes ------------------------------------------------------------------------
    def _blocked(self, lead: int, channels: int, per_tile) -> tuple[tuple, tuple]:
        """Shape (lead, channels, m0, w0, m1, w1, ...) of a grid of ``m`` blocks of ``w`` per axis,
        and the axis order that brings it to (lead, m0, m1, ..., channels, w0, w1, ...)."""
        r = self.p.rank
        shape = (lead, channels) + tuple(v for m, w in zip(self.counts, per_tile) for v in (m, w))
        return shape, (0,) + tuple(2 + 2 * i for i in range(r)) + (1,) + tuple(3 + 2 * i for i in range(r))

    def _unblocked_order(self) -> tuple:
        """Axis order from (lead, m0, m1, ..., channels, w0, w1, ...) back to (lead, channels, m0, w0, ...)."""
        r = self.p.rank
        return (0, 1 + r) + tuple(v for i in range(r) for v in (1 + i, 2 + r + i))

    # -- operands ----------------------------------------------------------------------
    def input_tiles(self, xp, x):
        """(N, C, *n) -> (N*M, C, *T): overlapping windows of the zero-padded input."""
        n, c = x.shape[:2]
        grid = xp.zeros((n, c) + self.grid, dtype=x.dtype)
        grid[(slice(None),) * 2 + tuple(slice(q, q + s) for q, s in zip(self.p.padding, self.p.input_size))] = x
        shape, order = self._blocked(n, c, self.tile)
        item = grid.itemsize
        axis_strides = [item * math.prod(self.grid[i + 1:]) for i in range(self.p.rank)]
        strides = grid.strides[:2] + tuple(v for t, st in zip(self.step, axis_strides) for v in (t * st, st))
        windows = xp.lib.stride_tricks.as_strided(grid, shape=shape, strides=strides)
        return xp.ascontiguousarray(windows.transpose(order)).reshape((n * self.M, c) + self.tile)

    def output_blocks(self, xp, dy):
        """(N, K, *o) -> (N*M, K, *t): the output (gradient) in non-overlapping blocks, zeros past ``o``."""
        n, k = dy.shape[:2]
        covered = tuple(m * t for m, t in zip(self.counts, self.step))
        if covered != self.p.output_size:
            grid = xp.zeros((n, k) + covered, dtype=dy.dtype)
            grid[(slice(None),) * 2 + tuple(slice(0, o) for o in self.p.output_size)] = dy
            dy = grid
        shape, order = self._blocked(n, k, self.step)
        return xp.ascontiguousarray(dy.reshape(shape).transpose(order)).reshape((n * self.M, k) + self.step)

    # -- results -----------------------------------------------------------------------
    def join_outputs(self, xp, blocks, out):
        """(N*M, K, *t) output blocks -> ``out`` (N, K, *o), cropped to ``o``."""
        n, k = out.shape[:2]
        joined = blocks.reshape((n,) + self.counts + (k,) + self.step).transpose(self._unblocked_order())
        covered = tuple(m * t for m, t in zip(self.counts, self.step))
        whole = out if covered == self.p.output_size and out.flags.c_contiguous else \
            xp.empty((n, k) + covered, dtype=out.dtype)
        whole.reshape(self._blocked(n, k, self.step)[0])[...] = joined
        if whole is not out:
            out[...] = whole[(slice(None),) * 2 + tuple(slice(0, o) for o in self.p.output_size)]
        return out

    def overlap_add(self, xp, grads, out):
        """(N*M, C, *T) gradients of the input tiles -> ``out`` (N, C, *n): each tile's first ``t``
        samples and its last ``e - 1`` (which belong to the next tile's span) added into place, the
        padding cropped."""
        n, c = out.shape[:2]
        r = self.p.rank
        tiles = grads.reshape((n,) + self.counts + (c,) + self.tile).transpose(self._unblocked_order())
        acc = xp.zeros((n, c) + tuple((m + 1) * t for m, t in zip(self.counts, self.step)), dtype=out.dtype)
        blocks = acc.reshape((n, c) + tuple(v for m, t in zip(self.counts, self.step) for v in (m + 1, t)))
        # per axis: the tile's head [0, t) lands in blocks 0..m-1, its tail [t, T) at the start of blocks 1..m
        for parts in itertools.product((0, 1), repeat=r):
            dst, src = [slice(None)] * 2, [slice(None)] * 2
            for tail, m, t, T in zip(parts, self.counts, self.step, self.tile):
                width = T - t if tail else t
                if width == 0:
                    break
                dst += [slice(tail, tail + m), slice(0, width)]
                src += [slice(None), slice(t if tail else 0, (t if tail else 0) + width)]
            else:
                blocks[tuple(dst)] += tiles[tuple(src)]
        out[...] = acc[(slice(None),) * 2 + tuple(slice(q, q + s) for q, s in zip(self.p.padding, self.p.input_size))]
        return out


def chunk_images(tiling: Tiling, chunk: int) -> int:
    """Whole images per batch chunk of at most ``chunk`` tiles (at least one image)."""
    return max(1, min(tiling.p.batch, chunk // tiling.M))


class TiledConv:
    """Runs a problem's pass through executors of the tiled problem :class:`Tiling` makes, a batch chunk of
    whole images at a time (at most ``chunk`` tiles, at least one image), so the tiles of only one chunk
    are held at a time."""

    def __init__(self, xp, problem: ConvProblem, tile: tuple[int, ...], make_inner, chunk: int):
        self.xp, self.tiling = xp, Tiling(problem, tile)
        self.images = chunk_images(self.tiling, chunk)
        self._make, self._inner = make_inner, {}

    def inner(self, images: int):
        """``(problem, executor)`` of ``images`` images' tiles (one per chunk size: the last chunk may be
        smaller)."""
        held = self._inner.get(images)
        if held is None:
            q = self.tiling.inner.replace(batch=images * self.tiling.M)
            held = self._inner[images] = (q, self._make(q))
        return held

    def __call__(self, a, b, out):
        xp, tiling, pass_ = self.xp, self.tiling, self.tiling.p.pass_
        part = None  # a later chunk's filter gradient, added to the first's
        for n0 in range(0, tiling.p.batch, self.images):
            n1 = min(n0 + self.images, tiling.p.batch)
            q, inner = self.inner(n1 - n0)
            if pass_ == "fwd":
                blocks = inner(tiling.input_tiles(xp, a[n0:n1]), b, xp.empty(q.y_shape, dtype=out.dtype))
                tiling.join_outputs(xp, blocks, out[n0:n1])
            elif pass_ == "dgrad":
                grads = inner(tiling.output_blocks(xp, a[n0:n1]), b, xp.empty(q.x_shape, dtype=out.dtype))
                tiling.overlap_add(xp, grads, out[n0:n1])
            elif n0 == 0:  # the filter gradient sums over the chunks
                inner(tiling.input_tiles(xp, a[n0:n1]), tiling.output_blocks(xp, b[n0:n1]), out)
            else:
                part = xp.empty_like(out) if part is None else part
                out += inner(tiling.input_tiles(xp, a[n0:n1]), tiling.output_blocks(xp, b[n0:n1]), part)
        return out


def workspace_bytes(p: ConvProblem, tile: tuple[int, ...], chunk: int, inner_bytes: int) -> int:
    """A chunk's inner workspace (``inner_bytes``, of :func:`chunk_images` images' tiles) plus its padded
    grid, tiles, blocks and joined result, and a filter gradient's partial sum."""
    tiling = Tiling(p, tile)
    images = chunk_images(tiling, chunk)
    q = tiling.inner.replace(batch=images * tiling.M)
    grid = images * p.in_channels * math.prod(tiling.grid)
    joined = images * max(p.in_channels, p.out_channels) * math.prod((m + 1) * t for m, t in
                                                                     zip(tiling.counts, tiling.step))
    return inner_bytes + 4 * (grid + math.prod(q.x_shape) + math.prod(q.y_shape) + joined + math.prod(p.w_shape))

"""A by-address launch replayed from CUDA graphs, one per operand addresses: the 1x1 plans' cuBLASLt GEMMs, the
cuDNN plans' executions and the launches of the depthwise kernels and of the row and plane FFTs.

A cuBLAS or cuBLASLt call costs 10 to 16 µs of host time on the H100, which is about what PyTorch's whole
convolution call costs; the cuDNN frontend's execute costs 110 to 140. Launching the same GEMM from a CUDA graph
captured once costs 1.6 to 3.1 µs, with identical results. A graph holds its operands' addresses, so there is one graph
per ``(a, b, out)``. In a training or inference loop, PyTorch's caching allocator hands a layer the same addresses
step after step.

The policy:
- The first call with some addresses launches directly and remembers them.
- The second call captures a graph for them, on a side stream of its own in thread-local capture mode, so that
  other threads' work is not part of the capture. Later calls replay that graph on the caller's stream.
- A launch that needs device memory besides its operands (a workspace) gets it from the plan, allocated once
  (:func:`owning`): one address, the same in every graph.
- Graphs and remembered addresses are bounded, the oldest dropped first.
- If the addresses keep changing, so that graphs are made far more often than replayed, replay is switched off for
  this launch and its calls go direct. That is logged once.
- A capture that fails also switches replay off and is logged once. The call that failed is made directly.
- ``CONVTUNE_REPLAY=0`` in the environment switches replay off for launches made from then on: every call direct.
- A call whose stream is itself capturing (a CUDA graph of the caller's) is never captured here: it goes direct,
  into the caller's graph. The PyTorch layer records PyTorch's convolution in captures for these plans anyway
  (their strategies do not say ``recordable``). An array call under a capture of the caller's, with a graph already
  made for its addresses, launches that graph into the capture.

A graph holds no data, only the addresses. Replaying it is what a direct call with the same addresses would do,
whatever those addresses hold by then.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref

log = logging.getLogger("convtune")

#: The switch: ``0`` launches directly, never from graphs.
ENV = "CONVTUNE_REPLAY"
#: Graphs kept per launch, and the addresses remembered from calls that have no graph yet.
GRAPHS, SEEN = 64, 256
#: Replay is switched off once this many graphs have been made with fewer than REPLAYS_PER_GRAPH replays each.
CHURN_GRAPHS, REPLAYS_PER_GRAPH = 128, 4

#: Every launch made in the process and still alive (for :func:`counts`).
_LAUNCHES: weakref.WeakSet = weakref.WeakSet()


def counts() -> tuple[int, int, float]:
    """Graphs made, replays, and the host seconds making the graphs took, summed over every by-address launch alive in
    the process: what a benchmark reads before and after some steps to say how often the operands' addresses changed
    under the plans (each new address triple costs a capture where the same addresses would cost a replay)."""
    launches = list(_LAUNCHES)
    return (sum(r.made for r in launches), sum(r.replayed for r in launches),
            sum(r.capture_s for r in launches))


def _capturing(stream) -> bool:
    """Is ``stream`` capturing (a CuPy stream; a stand-in without ``is_capturing`` is not)? A capture of our own begun
    then could invalidate the caller's, so its call goes direct and is recorded there."""
    is_capturing = getattr(stream, "is_capturing", None)
    try:
        return bool(is_capturing()) if is_capturing is not None else False
    except Exception:  # (not knowing: no capture of ours)
        return True


def _cupy_side_stream():
    import cupy
    return cupy.cuda.Stream(non_blocking=True), cupy.cuda.runtime.streamCaptureModeThreadLocal


class AddressReplay:
    """``launch(a, b, out, stream)`` (device addresses and a CuPy stream; its GPU work only, nothing allocated or
    synchronised) served from CUDA graphs per ``(a, b, out)``, by the policy above. ``what`` names the launch in
    the log. ``side_stream()`` gives the capture stream and capture mode (``None``: a CuPy stream of its own); tests
    pass stand-ins. ``holds``: what the launch writes besides its operands (a workspace), kept as long as it is."""

    def __init__(self, launch, what: str, side_stream=None, holds=None):
        self._launch, self.what, self._side_stream = launch, what, side_stream or _cupy_side_stream
        self.holds = holds
        self._graphs: dict = {}  # (a, b, out) -> graph, oldest first
        self._seen: dict = {}  # addresses called once, oldest first (a dict as an ordered set)
        self._side = None  # (stream, capture mode), made at the first capture
        self._lock = threading.Lock()  # one capture at a time on the side stream, and the dicts' changes
        self.made = self.replayed = 0
        self.capture_s = 0.0  # host seconds spent making graphs (capture and instantiation)
        self.off: str | None = f"{ENV}=0" if os.environ.get(ENV) == "0" else None  # why replay is off, if it is
        _LAUNCHES.add(self)

    def __call__(self, a: int, b: int, out: int, stream) -> None:
        key = (a, b, out)
        graph = self._graphs.get(key)
        if graph is not None:
            self.replayed += 1
            graph.launch(stream)
            return
        if self.off is None:
            if key in self._seen:
                graph = self._capture(key, stream)
                if graph is not None:
                    graph.launch(stream)
                    return
            else:
                with self._lock:  # (the bookkeeping from several threads: autograd's and the caller's)
                    self._seen[key] = None
                    if len(self._seen) > SEEN:
                        self._seen.pop(next(iter(self._seen)), None)
        self._launch(a, b, out, stream)

    def _capture(self, key, stream):
        if _capturing(stream):  # a capture of the caller's own (a CUDA graph of its step) records the direct call
            return None
        started = time.perf_counter()
        try:
            return self._make(key, stream)
        finally:
            self.capture_s += time.perf_counter() - started

    def _make(self, key, stream):
        with self._lock:
            made = self._graphs.get(key)  # (another thread's capture of the same addresses, just made)
            if made is not None or self.off is not None:
                return made
            try:
                if self._side is None:
                    self._side = self._side_stream()
                side, mode = self._side
                side.begin_capture(mode)
                try:
                    self._launch(*key, side)
                finally:
                    graph = side.end_capture()
            except Exception as exc:  # the call goes direct; so do all later ones
                self._switch_off(f"capturing it in a CUDA graph failed ({type(exc).__name__}: {exc})")
                return None
            self._seen.pop(key, None)
            self._graphs[key] = graph
            if len(self._graphs) > GRAPHS:
                self._graphs.pop(next(iter(self._graphs)), None)
            self.made += 1
            if self.made >= CHURN_GRAPHS and self.replayed < REPLAYS_PER_GRAPH * self.made:
                self._graphs.clear()
                self._switch_off(f"its operands' addresses keep changing ({self.made} graphs made, "
                                 f"{self.replayed} replays)")
                return None
            return graph

    def _switch_off(self, why: str) -> None:
        self.off = why
        log.info("convtune: %s is launched directly from now on, not replayed from CUDA graphs: %s", self.what, why)


def owning(launch, workspace: int, xp, what: str, side_stream=None) -> AddressReplay:
    """``launch(a, b, out, stream[, workspace])`` (the fifth argument where ``workspace`` bytes are needed) as an
    :class:`AddressReplay` of four arguments that owns its workspace: a block of ``workspace`` bytes allocated here,
    once, for the plan's life, so that a call allocates nothing (not even the first, which may come inside a caller's
    CUDA graph capture) and every graph holds the same address. The plan's calls share the block, as the calls of a
    cuDNN plan share its workspace: one stream at a time. (A strategy whose ``prepare`` builds candidates only to
    compile their kernels builds them without this, so that they allocate nothing.)"""
    if not workspace:
        return AddressReplay(launch, what, side_stream)
    block = xp.empty(workspace, dtype=xp.uint8)
    at = block.data.ptr

    def direct(a: int, b: int, out: int, stream) -> None:
        launch(a, b, out, stream, at)
    return AddressReplay(direct, what, side_stream, holds=block)

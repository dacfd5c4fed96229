"""Run a CUDA kernel source on the CPU, for tests: compiled by the host's C++ compiler with a thin stand-in for the
CUDA built-ins, each block's threads as OS threads and ``__syncthreads`` a barrier. It checks a kernel's indexing,
synchronisation and arithmetic where no GPU is (CI); it says nothing of its speed. Grids of up to three dimensions,
blocks of up to two; ``__shared__`` arrays (blocks run one after another); ``__shfl_down_sync`` by whole warps (a
barrier per warp); ``__syncwarp(mask)`` by the lanes of ``mask``; float ``atomicAdd``. What it cannot stand in for:
inline PTX (``asm`` statements do nothing, so float16's conversions and tensor-core instructions are not emulated),
other warp-level intrinsics, shuffles by part of a warp.

``kernels(source, names)`` gives, per ``extern "C" __global__`` kernel named, a callable with the signature of a
CuPy launchable function: ``k(grid, block, args, shared_mem, stream)``, where ``args`` holds host addresses (ints) or
NumPy arrays for pointers and NumPy scalars for the rest, in the kernel's parameter order.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

_PRELUDE = r"""
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
struct float2 { float x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
using std::min;
using std::max;
static inline float2 make_float2(float x, float y) { return {x, y}; }
struct dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static std::barrier<>* g_barrier;
static std::vector<std::barrier<>*> g_warps;
static float g_exchange[1024];
static char* g_smem;
static inline void __syncthreads() { g_barrier->arrive_and_wait(); }
static inline int linear_thread() { return threadIdx.x + threadIdx.y * blockDim.x; }
static inline float __shfl_down_sync(unsigned, float v, int delta) {
    const int t = linear_thread(), lane = t & 31, n = blockDim.x * blockDim.y;
    g_exchange[t] = v;
    g_warps[t >> 5]->arrive_and_wait();
    const float r = (lane + delta < 32 && t + delta < n) ? g_exchange[t + delta] : v;
    g_warps[t >> 5]->arrive_and_wait();
    return r;
}
static inline float atomicAdd(float* a, float v) { return std::atomic_ref<float>(*a).fetch_add(v); }
// __syncwarp(mask): the lanes of mask in the caller's warp meet (a barrier per warp and mask, made by the first to come)
static std::mutex g_syncwarp_lock;
static std::map<std::pair<int, unsigned>, std::unique_ptr<std::barrier<>>> g_syncwarp;
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    const int t = linear_thread(), n = blockDim.x * blockDim.y, warp = t >> 5;
    unsigned lanes = mask;
    if (32 * warp + 32 > n) lanes &= (1u << (n - 32 * warp)) - 1u;
    std::barrier<>* bar;
    {
        std::lock_guard<std::mutex> hold(g_syncwarp_lock);
        auto& slot = g_syncwarp[{warp, mask}];
        if (!slot) slot.reset(new std::barrier<>(__builtin_popcount(lanes)));
        bar = slot.get();
    }
    bar->arrive_and_wait();
}
template <typename P> static inline P __ldg(const P* p) { return *p; }
static inline void sincospif(float x, float* s, float* c) {
    const double a = M_PI * (double)x;
    *s = (float)std::sin(a);
    *c = (float)std::cos(a);
}
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
#define __device__
#define __global__
#define __forceinline__ inline
#define __align__(n) alignas(n)
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static
#define asm(...) ((void)0)
"""

_LAUNCHER = r"""
template <typename F> static void launch_blocks(int gx, int gy, int gz, int bx, int by, long long smem_bytes,
                                                F body) {
    std::vector<char> smem(smem_bytes > 0 ? smem_bytes : 1);
    const int n = bx * by;
    blockDim = {(unsigned)bx, (unsigned)by, 1};
    gridDim = {(unsigned)gx, (unsigned)gy, (unsigned)gz};
    for (int zb = 0; zb < gz; ++zb)
    for (int yb = 0; yb < gy; ++yb)
        for (int xb = 0; xb < gx; ++xb) {
            g_syncwarp.clear();
            std::barrier<> bar(n);
            std::vector<std::unique_ptr<std::barrier<>>> warps;
            g_warps.clear();
            for (int w = 0; w * 32 < n; ++w) {
                warps.emplace_back(new std::barrier<>(std::min(32, n - 32 * w)));
                g_warps.push_back(warps.back().get());
            }
            g_barrier = &bar;
            g_smem = smem.data();
            std::vector<std::thread> threads;
            for (int t = 0; t < n; ++t)
                threads.emplace_back([&body, t, bx, xb, yb, zb] {
                    threadIdx.x = t % bx; threadIdx.y = t / bx;
                    blockIdx.x = xb; blockIdx.y = yb; blockIdx.z = zb;
                    body();
                });
            for (auto& th : threads) th.join();
        }
}
"""

_KERNEL = re.compile(r'extern "C" __global__ void(?:\s+__launch_bounds__\([^)]*\))?\s+(\w+)\(([^)]*)\)', re.S)
_SHARED = re.compile(r"extern __shared__ (\w+) (\w+)\[\];")


def compiler() -> str | None:
    """The host C++ compiler these tests use (``None``: none found, skip)."""
    return shutil.which(os.environ.get("CXX", "g++"))


def _ctype(declaration: str):
    if "*" in declaration:
        return ctypes.c_void_p
    kind = " ".join(declaration.split()[:-1]).replace("const ", "")
    return {"int": ctypes.c_int, "long long": ctypes.c_longlong, "float": ctypes.c_float,
            "unsigned": ctypes.c_uint, "unsigned int": ctypes.c_uint}[kind]


def _dims(dims, rank: int) -> tuple:
    """A grid's (``rank`` 3) or block's (``rank`` 2) dimensions, padded with ones."""
    dims = tuple(int(d) for d in (dims if isinstance(dims, (tuple, list)) else (dims,)))
    assert len(dims) <= rank or all(d == 1 for d in dims[rank:]), f"at most {rank} dimensions here, not {dims}"
    return (dims + (1,) * rank)[:rank]


def expanded(source: str) -> str:
    """``source`` through the C preprocessor alone (its macros expanded: kernels a macro defines, parameter lists a
    macro holds; the CUDA keywords, which it does not define, left as they are)."""
    run = subprocess.run([compiler(), "-E", "-P", "-x", "c++", "-"], input=source, capture_output=True, text=True,
                         check=True)
    return run.stdout


def signatures(source: str) -> dict:
    """Each ``extern "C" __global__`` kernel of the (expanded) ``source``: its parameters' declarations."""
    return {m.group(1): [p.strip() for p in " ".join(m.group(2).split()).split(",")]
            for m in _KERNEL.finditer(source)}


def _argument(a):
    """A launch argument as ctypes takes it: a NumPy array by its address (as CuPy passes a device array), a NumPy
    scalar by its value."""
    if getattr(a, "ndim", 0) > 0:
        return a.ctypes.data
    return a.item() if hasattr(a, "item") else a


def _program(source: str, names=None) -> tuple[str, dict]:
    """C++ of ``source`` for the CPU: the prelude, the (expanded) kernels, the launcher and, per kernel of ``names``
    (default: every one), ``host_NAME(gx, gy, gz, bx, by, smem, params...)`` launching it; and the kernels'
    parameter declarations (:func:`signatures`)."""
    source = expanded(source)
    found = signatures(source)
    wrappers = []
    for name in found if names is None else names:
        params = found[name]
        arg_names = [q.split()[-1].lstrip("*") for q in params]
        wrappers.append(f'extern "C" void host_{name}(int gx, int gy, int gz, int bx, int by, long long smem, '
                        f'{", ".join(params)}) {{ launch_blocks(gx, gy, gz, bx, by, smem, [=] {{ '
                        f'{name}({", ".join(arg_names)}); }}); }}')
    code = _SHARED.sub(r"\1* \2 = reinterpret_cast<\1*>(g_smem);", source)
    return _PRELUDE + code + _LAUNCHER + "\n".join(wrappers) + "\n", found


def _require_compiler() -> None:
    if compiler() is None:
        import pytest
        pytest.skip("no C++ compiler to run the CUDA source on the CPU")


def launchables(source: str, names) -> tuple:
    """:func:`kernels`' launchables in the order of ``names``."""
    found = kernels(source, names)
    return tuple(found[n] for n in names)


def kernels(source: str, names) -> dict:
    """The kernels ``names`` of ``source``, compiled for the CPU (cached by the source's hash), as launchables (the
    calling test is skipped where there is no C++ compiler)."""
    _require_compiler()
    text, found = _program(source, names)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), "convtune-cuda-cpu")
    os.makedirs(folder, exist_ok=True)
    library = os.path.join(folder, f"{digest}.so")
    if not os.path.exists(library):
        path = os.path.join(folder, f"{digest}.cpp")
        with open(path, "w") as f:
            f.write(text)
        partial = library + f".{os.getpid()}"
        subprocess.run([compiler(), "-std=c++20", "-O0", "-shared", "-fPIC", "-pthread", "-w", path, "-o", partial],
                       check=True, capture_output=True, text=True)
        os.replace(partial, library)
    lib = ctypes.CDLL(library)
    out = {}
    for name in names:
        fn = getattr(lib, f"host_{name}")
        fn.argtypes = [ctypes.c_int] * 5 + [ctypes.c_longlong] + [_ctype(p) for p in found[name]]
        fn.restype = None

        def call(grid, block, args, shared_mem=0, stream=None, _fn=fn):
            _fn(*_dims(grid, 3), *_dims(block, 2), int(shared_mem), *map(_argument, args))
        out[name] = call
    return out


# -- running a by-address executor's launch on NumPy memory ------------------------------------------------------------
class Stream:
    """The stream argument of a launch on the CPU (its kernels ignore it)."""
    ptr = 0


def launch_memory(a, dtype: str, layout: str):
    """A float64 logical ``(N, C, *spatial)`` array as a launch reads it (dense in ``layout``'s order, in ``dtype``;
    bfloat16 as its 16 bits), and the float64 values that memory holds."""
    import numpy
    from convtune import precision
    stored = a.astype(numpy.float32)
    if dtype == "bfloat16":
        stored = precision.round_to(numpy, stored, dtype)
    return numpy.ascontiguousarray(precision.launch_memory(numpy, stored, dtype, layout)), stored.astype(numpy.float64)


def run_launch(executor, p, a, b):
    """``executor.launch`` (a by-address executor of problem ``p`` built on CPU stand-ins of its kernels) on float64
    operands ``a``, ``b``: the result as float64, and the float64 operands as the launch read them."""
    import numpy
    from convtune import precision
    ma, a64 = launch_memory(a, p.dtype, p.layout)
    mb, b64 = launch_memory(b, p.dtype, p.layout)
    res = precision.launch_result(numpy, p.result_shape, p.dtype, p.layout)
    res[...] = 0
    ws = numpy.zeros(max(1, executor.workspace), numpy.uint8)
    executor.launch(ma.ctypes.data, mb.ctypes.data, res.ctypes.data, Stream(), ws.ctypes.data)
    return precision.from_launch(numpy, res, p.dtype, p.layout).astype(numpy.float64), a64, b64


def gpu_errors(strategy_name: str, p, seed: int) -> dict:
    """Each of ``strategy_name``'s candidates for ``p`` on the GPU (its executor on operands of the problem's dtype and
    layout): its label -> its relative error against float64."""
    from convtune.backend import get_backend
    from convtune.planner import random_operands, relative_error
    from convtune.strategies import get_strategy
    backend = get_backend("cupy")
    xp = backend.xp
    a, b = random_operands(backend, p, seed=seed)
    ref = get_strategy("reference").build(p, None, backend)(a.astype(xp.float64), b.astype(xp.float64))
    strategy = get_strategy(strategy_name)
    assert strategy.supports(p, backend) is None, strategy.supports(p, backend)
    configs = strategy.candidates(p, backend)
    assert configs, f"{strategy_name} supports {p.describe()} but lists no candidate"
    return {strategy.describe(c): relative_error(xp, strategy.executor(p, c, backend)(a, b), ref) for c in configs}


# -- the same launches as a standalone program under AddressSanitizer (out-of-bounds reads and writes) --------------
def sanitized(source: str, executor, p, calls: list) -> subprocess.CompletedProcess:
    """Build ``source``'s kernels with the host compiler and AddressSanitizer into a program that makes the launches
    ``executor.launch`` makes for problem ``p`` (recorded into ``calls`` by stand-in kernels: build ``executor`` with
    :func:`recorders`' kernels) on heap buffers of exactly the operands', result's and workspace's sizes, and run it:
    an access outside any of them, or outside a block's shared memory, fails the run (its stderr says where). Slow (a
    compilation per call): ``CONVTUNE_ASAN=1`` turns on the tests that use it."""
    import math
    del calls[:]
    executor.launch(1, 2, 3, Stream(), 4 if executor.workspace else None)
    buffers = {1: ("a", math.prod(p.operand_shapes[0])), 2: ("b", math.prod(p.operand_shapes[1])),
               3: ("out", math.prod(p.result_shape)), 4: ("ws", max(1, executor.workspace // 4))}
    return sanitized_calls(source, buffers, calls)


def sanitized_calls(source: str, buffers: dict, calls: list) -> subprocess.CompletedProcess:
    """:func:`sanitized`'s program for recorded ``calls`` whose pointer arguments are the keys of ``buffers`` (an
    address or stand-in number -> ``(name, floats)``; 0 is a null pointer): each buffer a heap array of exactly that
    many floats."""
    _require_compiler()
    names = {address: name for address, (name, _) in buffers.items()}
    names[0] = "nullptr"
    body = []
    for name, grid, block, smem, args in calls:
        rendered = []
        for value in args:
            if isinstance(value, int):
                rendered.append(f"(void*){names[value]}")
            else:
                suffix = "f" if value.dtype.kind == "f" else ("LL" if value.dtype.itemsize == 8 else "")
                rendered.append(repr(value.item()) + suffix)
        dims = ", ".join(map(str, _dims(grid, 3) + _dims(block, 2)))
        body.append(f"host_{name}({dims}, {smem}, {', '.join(rendered)});")
    arrays = "\n".join(f"float* {k} = new float[{v}]; for (long i = 0; i < {v}; ++i) {k}[i] = (float)(i % 13) - 6;"
                       for k, v in buffers.values())
    text = _program(source)[0] + f"int main() {{\n{arrays}\n" + "\n".join(body) + "\nreturn 0;\n}\n"
    folder = tempfile.mkdtemp(prefix="convtune-asan-")
    path, program = os.path.join(folder, "run.cpp"), os.path.join(folder, "run")
    with open(path, "w") as f:
        f.write(text)
    subprocess.run([compiler(), "-std=c++20", "-O1", "-g", "-fpermissive", "-fsanitize=address", "-pthread", "-w",
                    path, "-o", program], check=True, capture_output=True, text=True)
    return subprocess.run([program], capture_output=True, text=True, env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0"})


def recorders(names):
    """Stand-in kernels that record their launches (for :func:`sanitized`): one per name, sharing one list."""
    calls = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __call__(self, grid, block, args, shared_mem=0, stream=None):
            calls.append((self.name, grid, block, int(shared_mem), args))
    return tuple(Recorder(n) for n in names), calls

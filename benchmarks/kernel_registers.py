"""Registers and spills of the one-block FFT kernels (fft-row, fft-plane), from ptxas through NVRTC: no GPU needed.

    python3 benchmarks/kernel_registers.py --nvrtc PATH/libnvrtc.so.13 [--arch sm_90]

On a machine without CUDA, NVRTC comes as a wheel: ``pip download --no-deps nvidia-cuda-nvrtc`` and unzip it;
the library is ``nvidia/cu13/lib/libnvrtc.so.13``. Each source is compiled as CuPy compiles it (``--std=c++17``)
for ``--arch`` with ``--ptxas-options=-v``, and each kernel's registers and spill bytes (stores/loads) are printed.
A kernel capped by ``__launch_bounds__`` whose values do not fit spills to local memory (L1), which the timings
do not show by themselves.
"""

from __future__ import annotations

import argparse
import ctypes
import re
import sys

from convtune.fft import planeconv, rowconv

#: (points, radices, threads: 0 for rowconv.threads) of the rows: hyena-long-dw's 4096, long-16k-dw's 16384
ROWS = [(4096, "8", 0), (4096, "16", 0), (16384, "8", 0), (16384, "16", 0), (16384, "32", 0), (16384, "8", 1024),
        (16384, "16", 1024)]
PLANES = [((72, 72), None, "8"), ((72, 72), (512, 1), "8"), ((72, 72), None, "16x9"), ((72, 72), (512, 1), "16x9"),
          ((81, 96), None, "16"), ((81, 96), (512, 1), "16"), ((81, 96), None, "16x9"), ((81, 96), (512, 1), "16x9"),
          ((128, 128), None, "16"), ((128, 128), (256, 1), "16")]


def ptxas_report(lib, source: str, arch: str) -> dict:
    """``{kernel: (registers, spill stores, spill loads)}`` of ``source``."""
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [b"--std=c++17", f"--gpu-architecture={arch}".encode(), b"--ptxas-options=-v"]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    text = log.value.decode(errors="replace")
    if status:
        raise RuntimeError(f"NVRTC failed ({status}):\n{text[:3000]}")
    out, kernel = {}, None
    for line in text.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            kernel = m.group(1)
        elif kernel and (m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            out[kernel] = [0, int(m.group(1)), int(m.group(2))]
        elif kernel and (m := re.search(r"Used (\d+) registers", line)):
            out.setdefault(kernel, [0, 0, 0])[0] = int(m.group(1))
    return {k: tuple(v) for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvrtc", required=True, help="path of libnvrtc.so")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args(argv)
    lib = ctypes.CDLL(args.nvrtc)
    cases = [(f"fft-row m={m} radices={r} threads={t or rowconv.threads(m)}", rowconv.source("float32", m, r, t))
             for m, r, t in ROWS]
    cases += [(f"fft-plane {s[0]}x{s[1]} shape={sh or planeconv.launch_shape(s)} radices={r}",
               planeconv.source("float32", s, sh, r)) for s, sh, r in PLANES]
    for title, source in cases:
        print(f"== {title}")
        for kernel, (regs, stores, loads) in sorted(ptxas_report(lib, source, args.arch).items()):
            spill = f", spills {stores}/{loads} B" if stores or loads else ""
            print(f"   {kernel:28s} {regs:4d} registers{spill}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

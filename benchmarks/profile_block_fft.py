"""One launch of each one-block FFT plan of issue 22's layers, for a profiler (no verification, no timing loop):

    ncu -k regex:'rowfft_|planefft_' python3 benchmarks/profile_block_fft.py hyena-long-dw:fwd replknet-dw31:wgrad

Each argument is LAYER:PASS[:CONFIG-LABEL]; without a label every candidate of the strategy runs once. The layers
are ``benchmarks/block_fft.py``'s.
"""

from __future__ import annotations

import sys

from convtune.backend import get_backend
from convtune.planner import random_operands
from convtune.strategies import get_strategy

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from block_fft import LAYERS, problem  # noqa: E402


def main(argv=None) -> int:
    be = get_backend("cupy")
    for arg in (argv if argv is not None else sys.argv[1:]):
        name, pass_, *label = arg.split(":", 2)
        p = problem(LAYERS[name][0], "float32", "channels_first").for_pass(pass_)
        block = get_strategy("fft-row" if p.rank == 1 else "fft-plane")
        a, b = random_operands(be, p, seed=1)
        for config in block.candidates(p, be):
            if label and config.label() != label[0]:
                continue
            run = block.executor(p, config, be)
            run(a, b)
            be.synchronize()
            print(f"{name} {pass_} {config.label()}: ran once", flush=True)
        del a, b
        be.xp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())

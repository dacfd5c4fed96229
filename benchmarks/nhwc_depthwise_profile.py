"""One launch each of the channels-last depthwise kernels on ConvNeXt-T stage 0 (bfloat16 channels_last, batch 32:
the tiled and plain forward, the tiled filter gradient), timed once with CUDA events, for Nsight Compute:

    ncu -k regex:dwl_ --section SpeedOfLight --section Occupancy python3 benchmarks/nhwc_depthwise_profile.py
"""
import convtune
from convtune.backend import get_backend
from convtune.planner import random_operands
from convtune.strategies import get_strategy
from convtune.strategies.depthwise import DepthwiseConfig
be = get_backend("cupy")
cp = be.xp
dw = get_strategy("depthwise")
for pass_, variant in (("fwd", "nhwc-tiled"), ("fwd", "nhwc"), ("wgrad", "nhwc-tiled")):
    p = convtune.ConvProblem.make(batch=32, in_channels=96, out_channels=96, input_size=(56, 56), kernel_size=7,
                                  padding=3, groups=96, dtype="bfloat16", layout="channels_last", pass_=pass_)
    a, b = random_operands(be, p, 1)
    run = dw.executor(p, DepthwiseConfig(threads=256, variant=variant, rows=4), be)
    fn = run.timed(a, b, None)
    fn()
    cp.cuda.Device().synchronize()
    ev = [cp.cuda.Event() for _ in range(2)]
    ev[0].record(); fn(); ev[1].record(); ev[1].synchronize()
    print(pass_, variant, "ms", cp.cuda.get_elapsed_time(ev[0], ev[1]))

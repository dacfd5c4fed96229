"""Problem shapes shared by the correctness tests: 1-D, 2-D, 3-D, odd sizes, stride,
padding, dilation, groups and depthwise; small enough for the CPU."""

from convtune import ConvProblem

CASES = {
    "1d-basic": dict(batch=2, in_channels=3, out_channels=4, input_size=(17,), kernel_size=5),
    "1d-stride-pad": dict(batch=3, in_channels=2, out_channels=5, input_size=(23,), kernel_size=4, stride=3, padding=2),
    "1d-dilation": dict(batch=2, in_channels=3, out_channels=2, input_size=(19,), kernel_size=3, dilation=3, padding=1),
    "1d-depthwise-long": dict(batch=2, in_channels=4, out_channels=4, input_size=(16,), kernel_size=16, padding=15,
                              groups=4),
    "2d-odd": dict(batch=2, in_channels=3, out_channels=5, input_size=(7, 9), kernel_size=(3, 2)),
    "2d-stride-pad-dil": dict(batch=2, in_channels=4, out_channels=6, input_size=(11, 10), kernel_size=(3, 3),
                              stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
    "2d-groups": dict(batch=2, in_channels=6, out_channels=4, input_size=(8, 8), kernel_size=3, padding=1, groups=2),
    "2d-depthwise": dict(batch=2, in_channels=5, out_channels=5, input_size=(9, 9), kernel_size=3, padding=1, groups=5),
    "2d-depthwise-mult": dict(batch=1, in_channels=3, out_channels=6, input_size=(6, 7), kernel_size=(2, 3), groups=3,
                              stride=2),
    "2d-depthwise-7x7": dict(batch=2, in_channels=3, out_channels=3, input_size=(40, 70), kernel_size=7, padding=3,
                             groups=3),
    "2d-depthwise-dil": dict(batch=2, in_channels=4, out_channels=4, input_size=(21, 37), kernel_size=(3, 5),
                             dilation=(2, 3), padding=(1, 4), groups=4),
    "2d-1x1": dict(batch=3, in_channels=8, out_channels=4, input_size=(5, 5), kernel_size=1),
    "2d-1x1-stride": dict(batch=2, in_channels=4, out_channels=3, input_size=(7, 6), kernel_size=1, stride=2),
    "2d-kernel-fills": dict(batch=2, in_channels=2, out_channels=3, input_size=(5, 4), kernel_size=(7, 6), padding=1),
    "2d-big-pad": dict(batch=2, in_channels=2, out_channels=2, input_size=(4, 5), kernel_size=2, padding=3, stride=2),
    "2d-large-kernel": dict(batch=2, in_channels=3, out_channels=4, input_size=(16, 16), kernel_size=9, padding=4),
    # strided cases for the polyphase FFT: depthwise, and inputs past the last output's reach (tail)
    "2d-depthwise-stride": dict(batch=2, in_channels=3, out_channels=3, input_size=(11, 12), kernel_size=3,
                                stride=2, padding=1, groups=3),
    # 64x64 transforms (convtune's own GPU transforms), with padding, stride and dilation
    "2d-fft64": dict(batch=2, in_channels=3, out_channels=4, input_size=(56, 60), kernel_size=(9, 3), padding=(4, 2),
                     stride=(1, 2), dilation=(1, 2)),
    # overlap-save tiles: a dense kernel with padding and dilation; a strided layer tiled in its polyphase form
    "2d-tiles": dict(batch=2, in_channels=3, out_channels=4, input_size=(45, 38), kernel_size=(5, 3), padding=(2, 1),
                     dilation=(1, 2)),
    "2d-tiles-stride": dict(batch=1, in_channels=2, out_channels=3, input_size=(70, 41), kernel_size=3, stride=2,
                            padding=1),
    "2d-stride-tail": dict(batch=2, in_channels=3, out_channels=2, input_size=(9, 10), kernel_size=(2, 5),
                           stride=(2, 3)),
    # 3-D: odd sizes and padding; stride, dilation and groups per axis; depthwise; a strided 1x1x1 downsample
    "3d-basic": dict(batch=2, in_channels=3, out_channels=4, input_size=(5, 6, 7), kernel_size=3, padding=1),
    "3d-stride-dil-groups": dict(batch=2, in_channels=4, out_channels=6, input_size=(7, 6, 9), kernel_size=(3, 2, 3),
                                 stride=(2, 1, 2), padding=(1, 0, 2), dilation=(1, 2, 1), groups=2),
    "3d-depthwise": dict(batch=1, in_channels=3, out_channels=3, input_size=(8, 7, 8), kernel_size=5, padding=2,
                         groups=3),
    "3d-1x1-stride": dict(batch=2, in_channels=4, out_channels=5, input_size=(5, 7, 9), kernel_size=1, stride=2),
}


def problem(name, pass_="fwd", **changes):
    return ConvProblem.make(**{**CASES[name], **changes}, pass_=pass_)

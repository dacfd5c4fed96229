"""Strategies register themselves on import; this package imports them all."""

from .base import (Config, Strategy, all_strategies, get_strategy, register, strategy_versions,  # noqa: F401
                   unregister, versions_agree)
from . import reference, im2col, fft, fftrow, fftplane, cudnn, depthwise, pytorch  # noqa: F401,E402  (registration side effect)

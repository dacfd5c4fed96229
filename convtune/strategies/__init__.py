"""Strategies register themselves on import; this package imports them all, in the order the planner lists them."""

from ..versioning import strategy_versions, versions_agree
from .base import Config, Strategy, all_strategies, get_strategy, register, unregister

# isort: off
from . import reference, im2col, fft, fftrow, fftplane, cudnn, depthwise, pytorch  # (registration, in this order)
# isort: on

__all__ = ["Config", "Strategy", "all_strategies", "get_strategy", "register", "unregister", "strategy_versions",
           "versions_agree", "reference", "im2col", "fft", "fftrow", "fftplane", "cudnn", "depthwise", "pytorch"]

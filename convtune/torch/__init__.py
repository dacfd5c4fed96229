"""convtune for PyTorch: a drop-in for ``nn.Conv1d``/``Conv2d``/``Conv3d`` (``pip install 'convtune[torch]'``).

Three lines turn a model's convolutions into convtune's tuned plans::

    import convtune.torch as ct
    ct.patch(model)                                   # in place; ct.unpatch(model) undoes it
    ct.tune(model, example_batch)                     # optional: tune ahead, with progress; layers whose
                                                      # every pass is PyTorch's own get their class back

* :mod:`~convtune.torch.modules`: ``Conv1d``/``Conv2d``/``Conv3d`` (subclasses of PyTorch's), ``patch``,
  ``unpatch``;
* :mod:`~convtune.torch.functional`: ``conv1d``/``conv2d``/``conv3d`` with PyTorch's arguments;
* :mod:`~convtune.torch.tuning`: ``tune`` (tune ahead), ``collect`` (a model's problems);
* the operators ``torch.ops.convtune.conv_fwd``/``conv_dgrad``/``conv_wgrad`` (for ``torch.compile``);
* :mod:`~convtune.torch.models`: model specs (``torchvision:NAME``, ``timm:NAME``, ``module:callable``,
  and convtune's own large-kernel models) for ``convtune tune`` and ``convtune bench-model``.

Plans come from the default runtime (:func:`convtune.use_cache` configures it) unless a module or
call is given its own ``runtime``. What convtune cannot run falls back to PyTorch's convolution,
with the reason logged once.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("convtune.torch needs PyTorch: pip install 'convtune[torch]'") from exc

from . import _ops  # noqa: F401,E402  (registers torch.ops.convtune.*)
from .functional import conv1d, conv2d, conv3d  # noqa: E402
from .modules import Conv1d, Conv2d, Conv3d, patch, unpatch  # noqa: E402
from .tuning import TuneReport, collect, tune  # noqa: E402

__all__ = ["Conv1d", "Conv2d", "Conv3d", "patch", "unpatch", "conv1d", "conv2d", "conv3d", "tune", "collect",
           "TuneReport"]

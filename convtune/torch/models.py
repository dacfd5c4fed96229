"""PyTorch models by spec, and convtune's own large-kernel models.

A model spec is one of

* ``torchvision:NAME`` (``torchvision.models.get_model(NAME, weights=None)``);
* ``timm:NAME`` (``timm.create_model(NAME, pretrained=False)``);
* ``convtune:NAME``, one of :data:`BUILTIN` (below);
* ``module.path:callable`` or ``path/to/file.py:callable``, called with no arguments.

Models are built without downloading weights (convtune needs shapes, not values). For ``convtune
tune`` they are built on the meta device, so not even their memory is allocated.

The built-in models are the large-kernel architectures convtune is for, written here from their
papers' descriptions (layer layout, channel widths, kernel sizes), with ``nn.Conv2d``/``nn.Conv1d``
everywhere a convolution is:

* ``replknet-31b``: RepLKNet-31B (Ding et al., 2022): channels 128/256/512/1024, depths 2/2/18/2,
  depthwise kernels 31/29/27/13, each with a parallel 5x5 depthwise branch as in training;
* ``slak-t``: SLaK-T (Liu et al., 2023) in its dense form: ConvNeXt-T's layout (96/192/384/768,
  depths 3/3/9/3) with 51/49/47/13 depthwise kernels and a 5x5 branch (SLaK's sparse,
  decomposed kernels are not modelled);
* ``longconv-1d``: a long-convolution sequence model in the Hyena/S4 style: 4 blocks of a
  pointwise projection, a depthwise causal convolution with a kernel as long as the sequence
  (768 channels x 4096 samples), a gate and an output projection.
"""

from __future__ import annotations

import importlib
import importlib.util
import math as _math
from pathlib import Path

import torch
from torch import nn

from ..errors import NetworkError
from ..netlayer import Layer
from .tuning import collect

__all__ = ["build_model", "default_input_shape", "model_layers", "BUILTIN", "replknet", "slak", "longconv"]


# -- RepLKNet ---------------------------------------------------------------------------------------
def _conv_bn(cin, cout, k, stride=1, groups=1, act=True):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU()) if act else nn.Sequential(*layers)


class _LargeKernel(nn.Module):
    """A depthwise large kernel with a parallel small depthwise kernel (RepLKNet's training form)."""

    def __init__(self, channels, kernel, small):
        super().__init__()
        self.large = _conv_bn(channels, channels, kernel, groups=channels, act=False)
        self.small = _conv_bn(channels, channels, small, groups=channels, act=False) if small else None

    def forward(self, x):
        return self.large(x) + (self.small(x) if self.small is not None else 0)


class _RepLKBlock(nn.Module):
    def __init__(self, channels, kernel, small):
        super().__init__()
        self.norm = nn.BatchNorm2d(channels)
        self.pw1 = _conv_bn(channels, channels, 1)
        self.large = _LargeKernel(channels, kernel, small)
        self.act = nn.ReLU()
        self.pw2 = _conv_bn(channels, channels, 1, act=False)

    def forward(self, x):
        return x + self.pw2(self.act(self.large(self.pw1(self.norm(x)))))


class _ConvFFN(nn.Module):
    def __init__(self, channels, ratio=4):
        super().__init__()
        self.norm = nn.BatchNorm2d(channels)
        self.pw1 = _conv_bn(channels, channels * ratio, 1, act=False)
        self.act = nn.GELU()
        self.pw2 = _conv_bn(channels * ratio, channels, 1, act=False)

    def forward(self, x):
        return x + self.pw2(self.act(self.pw1(self.norm(x))))


class RepLKNet(nn.Module):
    def __init__(self, channels=(128, 256, 512, 1024), depths=(2, 2, 18, 2), kernels=(31, 29, 27, 13), small=5,
                 num_classes=1000):
        super().__init__()
        c0 = channels[0]
        self.stem = nn.Sequential(_conv_bn(3, c0, 3, stride=2), _conv_bn(c0, c0, 3, groups=c0), _conv_bn(c0, c0, 1),
                                  _conv_bn(c0, c0, 3, stride=2, groups=c0))
        stages = []
        for i, (c, depth, k) in enumerate(zip(channels, depths, kernels)):
            blocks = []
            for _ in range(depth):
                blocks += [_RepLKBlock(c, k, small), _ConvFFN(c)]
            if i + 1 < len(channels):  # transition: 1x1 to the next width, then a strided depthwise 3x3
                nxt = channels[i + 1]
                blocks += [_conv_bn(c, nxt, 1), _conv_bn(nxt, nxt, 3, stride=2, groups=nxt)]
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.norm = nn.BatchNorm2d(channels[-1])
        self.head = nn.Linear(channels[-1], num_classes)

    def forward(self, x):
        x = self.norm(self.stages(self.stem(x)))
        return self.head(x.mean(dim=(2, 3)))


def replknet(**kwargs) -> RepLKNet:
    """RepLKNet-31B by default; smaller ones through the keyword arguments (``channels``, ``depths``,
    ``kernels``, ``small``, ``num_classes``)."""
    return RepLKNet(**kwargs)


# -- SLaK (ConvNeXt layout with large kernels) ----------------------------------------------------------
class _ChannelsLastNorm(nn.Module):
    """LayerNorm over the channels of an NCHW tensor."""

    def __init__(self, channels):
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=1e-6)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _SLaKBlock(nn.Module):
    def __init__(self, channels, kernel, small):
        super().__init__()
        self.dw = _LargeKernel(channels, kernel, small)
        self.norm = nn.LayerNorm(channels, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(channels, 4 * channels), nn.GELU(), nn.Linear(4 * channels, channels))
        self.gamma = nn.Parameter(torch.full((channels,), 1e-6))

    def forward(self, x):
        y = self.mlp(self.norm(self.dw(x).permute(0, 2, 3, 1))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class SLaK(nn.Module):
    def __init__(self, channels=(96, 192, 384, 768), depths=(3, 3, 9, 3), kernels=(51, 49, 47, 13), small=5,
                 num_classes=1000):
        super().__init__()
        layers = []
        for i, (c, depth, k) in enumerate(zip(channels, depths, kernels)):
            if i == 0:
                layers += [nn.Conv2d(3, c, 4, stride=4), _ChannelsLastNorm(c)]
            else:
                layers += [_ChannelsLastNorm(channels[i - 1]), nn.Conv2d(channels[i - 1], c, 2, stride=2)]
            layers += [_SLaKBlock(c, k, small) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(channels[-1], eps=1e-6)
        self.head = nn.Linear(channels[-1], num_classes)

    def forward(self, x):
        return self.head(self.norm(self.features(x).mean(dim=(2, 3))))


def slak(**kwargs) -> SLaK:
    """SLaK-T (dense kernels) by default; smaller ones through the keyword arguments."""
    return SLaK(**kwargs)


# -- a long-convolution sequence model -----------------------------------------------------------------
class _LongConvBlock(nn.Module):
    def __init__(self, channels, length):
        super().__init__()
        self.length = length
        self.norm = nn.GroupNorm(1, channels)
        self.proj_in = nn.Conv1d(channels, 2 * channels, 1)
        # causal: the full convolution's first `length` outputs see only the past
        self.filter = nn.Conv1d(channels, channels, length, padding=length - 1, groups=channels)
        with torch.no_grad():  # a decaying filter, as long-convolution models initialise theirs
            decay = torch.exp(-torch.arange(length, dtype=torch.float32) / (length / 8)).flip(0)
            self.filter.weight.mul_(decay.to(self.filter.weight.device))
        self.proj_out = nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        u, gate = self.proj_in(self.norm(x)).chunk(2, dim=1)
        u = self.filter(u)[..., :self.length]
        return x + self.proj_out(u * torch.sigmoid(gate))


class LongConv(nn.Module):
    def __init__(self, channels=768, length=4096, depth=4, num_classes=10):
        super().__init__()
        self.blocks = nn.Sequential(*[_LongConvBlock(channels, length) for _ in range(depth)])
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x):
        return self.head(self.blocks(x).mean(dim=2))


def longconv(**kwargs) -> LongConv:
    """768 channels x 4096 samples, 4 blocks by default."""
    return LongConv(**kwargs)


#: convtune's own models: name -> (factory, input shape without the batch)
BUILTIN = {
    "replknet-31b": (replknet, (3, 224, 224)),
    "slak-t": (slak, (3, 224, 224)),
    "longconv-1d": (longconv, (768, 4096)),
}


# -- specs -----------------------------------------------------------------------------------------------
def _import(name: str, extra: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise NetworkError(f"{name} is not importable ({exc}); install it ({extra}) to build its models") from None


def _factory(spec: str):
    """``(factory, default input shape or None)`` of a model spec."""
    head, _, name = spec.rpartition(":")
    if head == "torchvision":
        models = _import("torchvision.models",
                         "pip install 'convtune[models]', or torchvision alone: the build that matches your PyTorch")
        if name not in models.list_models():
            raise NetworkError(f"torchvision has no model {name!r}; see torchvision.models.list_models()")
        video = getattr(models, "video", None)  # r3d_18, r2plus1d_18, ...: 16-frame 112x112 clips
        shape = (3, 16, 112, 112) if video is not None and name in models.list_models(module=video) else (3, 224, 224)
        return (lambda: models.get_model(name, weights=None)), shape
    if head == "timm":
        timm = _import("timm", "pip install 'convtune[models]', or timm alone")
        if not timm.is_model(name):
            raise NetworkError(f"timm has no model {name!r}; see timm.list_models()")

        def make():
            return timm.create_model(name, pretrained=False)
        return make, None
    if head == "convtune":
        if name not in BUILTIN:
            raise NetworkError(f"no built-in model {name!r}; convtune's models: {', '.join(BUILTIN)}")
        return BUILTIN[name]
    if head.endswith(".py"):
        path = Path(head)
        if not path.is_file():
            raise NetworkError(f"model spec {spec}: no file {head}")
        module_spec = importlib.util.spec_from_file_location(f"convtune_model_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise NetworkError(f"model spec {spec}: {head} fails to import ({type(exc).__name__}: {exc})") from None
    else:
        try:
            module = importlib.import_module(head)
        except ImportError as exc:
            raise NetworkError(f"model spec {spec}: cannot import {head} ({exc}); give torchvision:NAME, "
                               f"timm:NAME, convtune:NAME ({', '.join(BUILTIN)}), module:callable or "
                               "file.py:callable") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise NetworkError(f"model spec {spec}: {head} has no callable {name!r}")
    return factory, None


def build_model(spec: str, device: str | torch.device = "cpu") -> nn.Module:
    """The model of ``spec``, with fresh (random) parameters, on ``device`` (``'meta'``: shapes only)."""
    factory, _shape = _factory(spec)
    try:
        with torch.device(device):
            model = factory()
    except NetworkError:
        raise
    except Exception as exc:
        raise NetworkError(f"model spec {spec}: building it failed ({type(exc).__name__}: {exc})") from None
    if not isinstance(model, nn.Module):
        raise NetworkError(f"model spec {spec}: the callable returned {type(model).__name__}, not an nn.Module")
    return model


def default_input_shape(spec: str, model: nn.Module | None = None) -> tuple[int, ...] | None:
    """The input shape (without the batch) a model is made for, where known."""
    _factory_fn, shape = _factory(spec)
    if shape is None and model is not None:  # timm models say it in their configuration
        cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None) or {}
        shape = tuple(cfg["input_size"]) if "input_size" in cfg else None
    return shape


def input_shape_for(spec: str, model: nn.Module, batch: int | None, input_shape) -> tuple[int, ...]:
    """The full input shape: ``input_shape`` (its batch replaced by ``batch`` when both are given), or
    the model's default shape with ``batch``."""
    if isinstance(input_shape, dict):  # the command line's form: {None: shape}
        if set(input_shape) != {None}:
            raise NetworkError(f"{spec}: a PyTorch model takes one --input-shape, N,C,... (NAME=... is for ONNX "
                               "models)")
        input_shape = input_shape[None]
    if input_shape is not None:
        shape = tuple(int(v) for v in input_shape)
        if len(shape) < 2 or min(shape) <= 0:
            raise NetworkError(f"--input-shape must be positive sizes with the batch first, e.g. 32,3,224,224; "
                               f"got {input_shape!r}")
        return (batch, *shape[1:]) if batch is not None else shape
    default = default_input_shape(spec, model)
    if default is None:
        raise NetworkError(f"{spec}: give --input-shape (batch first, e.g. 32,3,224,224): the model's input size "
                           "is not known")
    if batch is None:
        raise NetworkError(f"{spec}: give --batch N (plans are per batch size) or a full --input-shape")
    return (batch, *default)


def model_layers(spec: str, batch: int | None = None, input_shape=None, math: str = "fp32") -> list:
    """The convolution layers of a model spec as :class:`~convtune.netlayer.Layer` rows (one per call in
    one forward pass, named after its module; ``passes`` as training needs them), found on the
    meta device."""
    model = build_model(spec, "meta")
    shape = input_shape_for(spec, model, batch, input_shape)
    try:
        found = collect(model, torch.empty(shape, device="meta"), math, device_check=False)
    except Exception as exc:
        raise NetworkError(f"{spec}: a forward pass on an input of shape {shape} failed ({type(exc).__name__}: "
                           f"{exc}); check --input-shape") from None
    if not found:
        raise NetworkError(f"{spec} has no Conv1d/Conv2d/Conv3d layer convtune can run")
    layers, counts = [], {}
    for item in found:
        counts[item.name] = counts.get(item.name, 0) + 1
        name = item.name if counts[item.name] == 1 else f"{item.name}#{counts[item.name]}"
        layers.append(Layer(name or spec, item.problem, spec, item.passes))
    return layers


def parameter_count(model: nn.Module) -> int:
    return sum(_math.prod(p.shape) for p in model.parameters())

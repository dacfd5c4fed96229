"""Network descriptions: a YAML/JSON layer list (the format of the public benchmark
suite, ``shared/bench/layers.yaml``) or a built-in network name.

Each layer has ``name, batch, in_channels, out_channels, input, kernel`` and
optionally ``stride, padding, dilation, groups`` (an int or one per axis) and
``source``. A top-level list of layers is accepted too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import yaml

from . import onnxnet
from .errors import NetworkError
from .netlayer import Layer
from .problem import ConvProblem

REQUIRED = ("name", "batch", "in_channels", "out_channels", "input", "kernel")
OPTIONAL = ("stride", "padding", "dilation", "groups", "source")


def builtin_networks() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("convtune.networks").iterdir() if p.name.endswith(".yaml"))


def _parse_layer(index: int, entry, batch: int | None, math: str) -> Layer:
    where = f"layer {index + 1}"
    if not isinstance(entry, dict):
        raise NetworkError(f"{where}: expected a mapping of fields, got {type(entry).__name__}")
    if "name" in entry:
        where = f"layer {index + 1} ({entry['name']})"
    missing = [f for f in REQUIRED if f not in entry]
    if missing:
        raise NetworkError(f"{where}: missing field(s) {', '.join(missing)}; required: {', '.join(REQUIRED)}")
    unknown = sorted(set(entry) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise NetworkError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: "
                           f"{', '.join(REQUIRED + OPTIONAL)}")
    size = entry["input"]
    if isinstance(size, int):
        size = [size]
    if not isinstance(size, (list, tuple)):
        raise NetworkError(f"{where}: input must be a list of spatial sizes, got {size!r}")
    try:
        problem = ConvProblem.make(
            batch=batch if batch is not None else entry["batch"], in_channels=entry["in_channels"],
            out_channels=entry["out_channels"], input_size=tuple(size), kernel_size=entry["kernel"],
            stride=entry.get("stride", 1), padding=entry.get("padding", 0), dilation=entry.get("dilation", 1),
            groups=entry.get("groups", 1), math=math)
    except (ValueError, TypeError) as exc:
        raise NetworkError(f"{where}: {exc}") from exc
    return Layer(str(entry["name"]), problem, str(entry.get("source", "")))


def parse_network(text: str, origin: str, batch: int | None = None, math: str = "fp32") -> list[Layer]:
    try:
        doc = yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise NetworkError(f"{origin}: malformed YAML/JSON{at}: {getattr(exc, 'problem', exc)}") from None
    layers = doc.get("layers") if isinstance(doc, dict) else doc
    if not isinstance(layers, list) or not layers:
        raise NetworkError(f"{origin}: expected a non-empty list of layers (under a 'layers:' key or at the top)")
    parsed = [_parse_layer(i, e, batch, math) for i, e in enumerate(layers)]
    names = [layer.name for layer in parsed]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise NetworkError(f"{origin}: duplicate layer name(s) {', '.join(dupes)}")
    return parsed


def load_network(spec: str, batch: int | None = None, math: str = "fp32",
                 input_shape: tuple[int, ...] | dict | None = None, skipped: list | None = None,
                 dtype: str = "float32", layout: str = "channels_first") -> list[Layer]:
    """Layers of a network file (YAML or JSON), of a built-in network, of an ONNX model (``*.onnx``; see
    :mod:`convtune.onnxnet`: ``input_shape`` a dict of input name to shape, ``skipped`` collects the
    convolution nodes left out and why), or of a PyTorch model (``torchvision:NAME``, ``timm:NAME``,
    ``convtune:NAME`` or ``module:callable``; see :mod:`convtune.torch.models`: ``input_shape`` one
    shape). Every layer's problems are of ``dtype`` and ``layout`` (see :mod:`convtune.precision`).

    Examples
    --------
    >>> [layer.name for layer in load_network("alexnet")][:2]
    ['conv1', 'conv2']
    >>> load_network("alexnet", dtype="bfloat16", layout="channels_last")[0].problem.describe().endswith(
    ...     "bfloat16 channels_last fp32")
    True
    """
    layers = _load(spec, batch, math, input_shape, skipped)
    if (dtype, layout) == ("float32", "channels_first"):
        return layers
    return [replace(layer, problem=layer.problem.replace(dtype=dtype, layout=layout)) for layer in layers]


def _onnx_source(spec, batch, math, input_shape, skipped) -> list[Layer]:
    shapes = input_shape if isinstance(input_shape, dict) else ({} if input_shape is None else {None: input_shape})
    return onnxnet.onnx_layers(spec, batch=batch, input_shapes=shapes, math_mode=math, skipped=skipped)


def _pytorch_source(spec, batch, math, input_shape, skipped) -> list[Layer]:
    try:  # an optional dependency: PyTorch, and the models it can build
        from .torch.models import model_layers
    except ImportError as exc:
        raise NetworkError(f"{spec} is a PyTorch model: {exc}") from None
    return model_layers(spec, batch=batch, input_shape=input_shape, math=math)


def _file_source(spec, batch, math, input_shape, skipped) -> list[Layer]:
    try:
        text = Path(spec).read_text()
    except OSError as exc:
        raise NetworkError(f"cannot read network file {spec}: {exc.strerror or exc}") from None
    return parse_network(text, str(spec), batch, math)


def _builtin_source(spec, batch, math, input_shape, skipped) -> list[Layer]:
    text = resources.files("convtune.networks").joinpath(f"{spec}.yaml").read_text()
    return parse_network(text, f"built-in network {spec}", batch, math)


def _is_onnx(spec: str) -> bool:
    return Path(spec).suffix.lower() == ".onnx"


def _is_file(spec: str) -> bool:
    return Path(spec).suffix.lower() in (".yaml", ".yml", ".json") or Path(spec).exists()


@dataclass(frozen=True)
class Source:
    """Where a network's layers come from: ``matches(spec)`` says whether ``spec`` names one of this source's
    networks, ``load(spec, batch, math, input_shape, skipped)`` reads its layers; ``takes_input_shape`` whether
    ``--input-shape`` means anything to it."""

    name: str
    matches: Callable[[str], bool]
    load: Callable[..., list[Layer]]
    takes_input_shape: bool = False


#: The network sources :func:`load_network` consults, in this order; the first that matches loads.
SOURCES = (Source("onnx", _is_onnx, _onnx_source, takes_input_shape=True),
           Source("pytorch", lambda spec: is_model_spec(spec), _pytorch_source, takes_input_shape=True),
           Source("file", _is_file, _file_source),
           Source("builtin", lambda spec: spec in builtin_networks(), _builtin_source))


def _load(spec, batch, math, input_shape, skipped) -> list[Layer]:
    if batch is not None and (not isinstance(batch, int) or batch <= 0):
        raise NetworkError(f"batch must be a positive integer, got {batch!r}")
    source = next((s for s in SOURCES if s.matches(spec)), None)
    if input_shape is not None and (source is None or not source.takes_input_shape):
        raise NetworkError("--input-shape is for PyTorch and ONNX models (torchvision:NAME, timm:NAME, "
                           f"module:callable, FILE.onnx); {spec} lists its layers' shapes itself")
    if source is None:
        raise NetworkError(f"unknown network {spec!r}: not a file, and not a built-in network "
                           f"({', '.join(builtin_networks())})")
    return source.load(spec, batch, math, input_shape, skipped)


def is_model_spec(spec: str) -> bool:
    """Does ``spec`` name a PyTorch model (``prefix:name``) rather than a file or a built-in network?"""
    head, sep, tail = spec.rpartition(":")
    if not (sep and head and tail) or Path(spec).suffix.lower() in (".yaml", ".yml", ".json", ".onnx") or \
            Path(spec).exists():
        return False
    return head.endswith(".py") or ("/" not in head and "\\" not in head)


def unique_problems(layers: list[Layer], passes) -> list[tuple[ConvProblem, list[str]]]:
    """Distinct problems over layers x passes, in order, each with the layer names that share it."""
    seen: dict[str, tuple[ConvProblem, list[str]]] = {}
    for layer in layers:
        for pass_ in passes:
            if layer.passes is not None and pass_ not in layer.passes:
                continue
            p = layer.problem.for_pass(pass_)
            seen.setdefault(p.key(), (p, []))[1].append(layer.name)
    return list(seen.values())


def dumps_json(layers: list[Layer]) -> str:
    """The layers as a JSON network description (for tests and tools)."""
    rows = [dict(name=l.name, batch=l.problem.batch, in_channels=l.problem.in_channels,
                 out_channels=l.problem.out_channels, input=list(l.problem.input_size),
                 kernel=list(l.problem.kernel_size), stride=list(l.problem.stride), padding=list(l.problem.padding),
                 dilation=list(l.problem.dilation), groups=l.problem.groups) for l in layers]
    return json.dumps({"layers": rows}, indent=1)

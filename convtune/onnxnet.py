"""ONNX models as network descriptions: ``convtune tune model.onnx``.

Every ``Conv`` node becomes a layer named after the node (its op and index where it has no name),
with the input and weight shapes that ONNX shape inference gives; strides, ``pads``, ``auto_pad``
(``NOTSET``, ``VALID``, ``SAME_UPPER``, ``SAME_LOWER``), dilations and ``group`` become the problem's
geometry. A ``ConvTranspose`` node computes the backward-data pass of a convolution, so it becomes
the layer of that convolution (its output is that convolution's input; ``output_padding`` and
``output_shape`` only set that size). Nodes convtune cannot represent are reported with the reason
(asymmetric padding, 3-D convolutions, integer and quantized convolutions, element types other than
float32, convolutions inside subgraphs) and left out.

Dynamic dimensions (a symbolic batch, say) need ``--batch`` (the first dimension of every graph
input) or ``--input-shape NAME=N,C,H,W``; what stays unknown is a clear error. The ``onnx`` package
is an optional extra (``pip install 'convtune[onnx]'``).
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path

from .errors import NetworkError
from .netlayer import Layer
from .problem import ConvProblem

_FLOAT = 1  # onnx.TensorProto.FLOAT


def _onnx():
    try:
        return importlib.import_module("onnx")
    except ImportError:
        raise NetworkError("reading an ONNX model needs the onnx package: pip install 'convtune[onnx]'") from None


def _dims(type_proto):
    """A tensor type's dimensions: ints, or the symbolic name (or ``None``) where unknown."""
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in type_proto.tensor_type.shape.dim]


def _attributes(onnx, node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _fix_inputs(onnx, model, batch, input_shapes, origin):
    """Give every graph input a full static shape: ``input_shapes`` by name, ``batch`` for a symbolic first
    dimension; what stays unknown is an error that names the input and what to pass."""
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    if None in input_shapes:  # an unnamed shape: the model's only input
        if len(inputs) != 1:
            raise NetworkError(f"{origin} has inputs {', '.join(i.name for i in inputs)}: name the one --input-shape "
                               "is for (NAME=N,C,...)")
        input_shapes = {inputs[0].name: input_shapes.pop(None), **input_shapes}
    unknown_names = set(input_shapes) - {i.name for i in inputs}
    if unknown_names:
        raise NetworkError(f"{origin}: --input-shape names {', '.join(sorted(unknown_names))}, which the model has "
                           f"no input of; its inputs: {', '.join(i.name for i in inputs)}")
    for inp in inputs:
        dims = _dims(inp.type)
        if dims is None:
            if inp.name in input_shapes:
                dims = [None] * len(input_shapes[inp.name])
            else:
                raise NetworkError(f"{origin}: input {inp.name!r} has no shape; give --input-shape {inp.name}=N,C,...")
        if inp.name in input_shapes:
            given = list(input_shapes[inp.name])
            if len(given) != len(dims):
                raise NetworkError(f"{origin}: input {inp.name!r} has {len(dims)} dimensions, --input-shape gives "
                                   f"{len(given)}")
            dims = given
        elif batch is not None and dims:  # --batch sets every input's first dimension
            dims = [batch] + dims[1:]
        missing = [str(d) if d else f"dimension {k}" for k, d in enumerate(dims) if not isinstance(d, int) or d <= 0]
        if missing:
            raise NetworkError(f"{origin}: input {inp.name!r} has dynamic dimension(s) {', '.join(missing)}; give "
                               f"--batch N or --input-shape {inp.name}=" + ",".join(
                                   str(d) if isinstance(d, int) and d > 0 else "?" for d in dims))
        shape = inp.type.tensor_type.shape
        del shape.dim[:]
        for d in dims:
            shape.dim.add().dim_value = int(d)


def _padding(attrs, rank, in_sizes, kernel, stride, dilation, transposed=False):
    """Symmetric per-axis padding, or the reason there is none."""
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto == "VALID":
        return (0,) * rank, None
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        if transposed:  # the output is stride x the input: what the padding must take away
            extra = list(attrs.get("output_padding", [0] * rank))
            totals = [d * (k - 1) + 1 - s + o for k, s, d, o in zip(kernel, stride, dilation, extra)]
        else:
            totals = [max((math.ceil(n / s) - 1) * s + d * (k - 1) + 1 - n, 0)
                      for n, k, s, d in zip(in_sizes, kernel, stride, dilation)]
        if any(t % 2 for t in totals):
            return None, (f"auto_pad {auto} pads {totals} here, unevenly on the two sides of an axis; convtune "
                          "represents symmetric padding only")
        return tuple(max(t, 0) // 2 for t in totals), None
    if auto != "NOTSET":
        return None, f"unknown auto_pad {auto!r}"
    pads = list(attrs.get("pads", [0] * (2 * rank)))
    begin, end = pads[:rank], pads[rank:]
    if begin != end:
        return None, (f"asymmetric pads {pads} (begin {begin}, end {end}); convtune represents symmetric padding "
                      "only")
    return tuple(begin), None


def _conv_layer(onnx, node, shapes, types, index):
    """``(ConvProblem, None)`` for a Conv or ConvTranspose node, or ``(None, reason)``."""
    attrs = _attributes(onnx, node)
    x_name, w_name = node.input[0], node.input[1]
    x, w = shapes.get(x_name), shapes.get(w_name)
    if not x or not w or any(not isinstance(d, int) or d <= 0 for d in list(x) + list(w)):
        return None, "shape inference left its input or weight shape unknown"
    if types.get(x_name, _FLOAT) != _FLOAT or types.get(w_name, _FLOAT) != _FLOAT:
        name = onnx.TensorProto.DataType.Name(types.get(x_name) if types.get(x_name) != _FLOAT else types.get(w_name))
        return None, f"element type {name}: convtune tunes float32 convolutions"
    rank = len(x) - 2
    if rank not in (1, 2, 3):
        return None, f"{rank}-D convolutions are not supported"
    stride = tuple(attrs.get("strides", [1] * rank))
    dilation = tuple(attrs.get("dilations", [1] * rank))
    group = int(attrs.get("group", 1))
    kernel = tuple(w[2:])
    transposed = node.op_type == "ConvTranspose"
    if not transposed:
        padding, reason = _padding(attrs, rank, x[2:], kernel, stride, dilation)
        if reason:
            return None, reason
        return ConvProblem.make(batch=x[0], in_channels=x[1], out_channels=w[0], input_size=x[2:], kernel_size=kernel,
                                stride=stride, padding=padding, dilation=dilation, groups=group), None
    # ConvTranspose(X) = the input gradient of a convolution from its output Y to X's shape
    y = shapes.get(node.output[0])
    if not y or any(not isinstance(d, int) or d <= 0 for d in y):
        return None, "shape inference left its output shape unknown"
    padding, reason = _padding(attrs, rank, y[2:], kernel, stride, dilation, transposed=True)
    if reason:
        return None, reason
    problem = ConvProblem.make(batch=y[0], in_channels=y[1], out_channels=x[1], input_size=y[2:], kernel_size=kernel,
                               stride=stride, padding=padding, dilation=dilation, groups=group)
    if problem.y_shape != tuple(x):
        return None, (f"its output {tuple(y)} and input {tuple(x)} do not make a convolution convtune can represent "
                      f"(the convolution of {tuple(y)} gives {problem.y_shape})")
    return problem, None


def onnx_layers(path: str, batch: int | None = None, input_shapes: dict | None = None, math_mode: str = "fp32",
                skipped: list | None = None) -> list:
    """The convolution layers of an ONNX file (see the module docstring); ``skipped`` collects
    ``(node name, op type, reason)`` of the convolution nodes left out."""
    onnx = _onnx()
    origin = str(path)
    try:
        model = onnx.load(str(path))
    except OSError as exc:
        raise NetworkError(f"cannot read {origin}: {exc.strerror or exc}") from None
    except Exception as exc:  # a file that is not (or no longer) an ONNX protobuf
        raise NetworkError(f"{origin} is not a readable ONNX model ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:200]})") from None
    if not model.graph.node:
        raise NetworkError(f"{origin} is not an ONNX model with a graph (no nodes)")
    _fix_inputs(onnx, model, batch, dict(input_shapes or {}), origin)
    try:
        # data_prop: shapes computed from shape-valued tensors too (a Reshape after a Flatten, say), so that a
        # convolution behind one has its input shape
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise NetworkError(f"{origin}: ONNX shape inference failed ({' '.join(str(exc).split())[:300]})") from None
    graph = inferred.graph
    shapes, types = {}, {}
    for info in list(graph.input) + list(graph.value_info) + list(graph.output):
        shapes[info.name] = _dims(info.type)
        types[info.name] = info.type.tensor_type.elem_type
    for init in graph.initializer:
        shapes[init.name] = list(init.dims)
        types[init.name] = init.data_type
    layers, left_out, names = [], [] if skipped is None else skipped, set()
    for index, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{index}"
        if node.op_type in ("Conv", "ConvTranspose"):
            problem, reason = _conv_layer(onnx, node, shapes, types, index)
            if problem is None:
                left_out.append((name, node.op_type, reason))
                continue
            if math_mode != "fp32":
                problem = problem.replace(math=math_mode)
            unique = name if name not in names else f"{name}#{index}"
            names.add(unique)
            source = f"{origin}: {node.op_type}" + (" (its output is this convolution's input gradient)"
                                                    if node.op_type == "ConvTranspose" else "")
            layers.append(Layer(unique, problem, source))
        elif node.op_type in ("ConvInteger", "QLinearConv", "DeformConv"):
            left_out.append((name, node.op_type, f"{node.op_type} (integer, quantized or deformable convolutions) "
                                                 "is not supported"))
        elif any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            inner = [n.op_type for a in node.attribute if a.type == onnx.AttributeProto.GRAPH for n in a.g.node]
            if any(op in ("Conv", "ConvTranspose") for op in inner):
                left_out.append((name, node.op_type, "convolutions inside a subgraph (If, Loop, Scan) are not read"))
    if not layers:
        reasons = "; ".join(f"{n} ({op}): {r}" for n, op, r in left_out)
        raise NetworkError(f"{origin} has no convolution convtune can tune" + (f": {reasons}" if reasons else
                                                                                " (no Conv or ConvTranspose node)"))
    return layers


def is_onnx(spec: str) -> bool:
    return Path(spec).suffix.lower() == ".onnx"

"""ONNX models as network descriptions: every Conv attribute form, ConvTranspose, dynamic dimensions,
a model exported by PyTorch, and files that are not what they claim."""

import sys

import numpy as np
import pytest
from click.testing import CliRunner

import convtune
from convtune import ConvProblem
from convtune.cli import main
from convtune.errors import NetworkError
from convtune.network import load_network

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def conv_model(path, x_shape, w_shape, op="Conv", y_name="y", elem=TensorProto.FLOAT, extra_nodes=(), **attrs):
    """A one-node model (plus ``extra_nodes``): ``op(x, w) -> y`` with the weight as an initializer."""
    w = helper.make_tensor("w", elem, w_shape, np.zeros(int(np.prod(w_shape))).tolist())
    node = helper.make_node(op, ["x", "w"], [y_name], name="the_conv", **attrs)
    graph = helper.make_graph([node, *extra_nodes], "g", [helper.make_tensor_value_info("x", elem, x_shape)],
                              [helper.make_tensor_value_info(y_name, elem, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return str(path)


def problem(**kw):
    base = dict(batch=2, in_channels=4, out_channels=6, input_size=(11, 10), kernel_size=3)
    return ConvProblem.make(**{**base, **kw})


@pytest.mark.parametrize("attrs, expected", [
    (dict(), problem()),
    (dict(strides=[2, 1], pads=[1, 2, 1, 2], dilations=[1, 2]),
     problem(stride=(2, 1), padding=(1, 2), dilation=(1, 2))),
    (dict(group=2), problem(groups=2)),
    (dict(auto_pad="VALID"), problem()),
    (dict(auto_pad="SAME_UPPER"), problem(padding=1)),
    (dict(auto_pad="SAME_LOWER", dilations=[2, 2]), problem(padding=2, dilation=2)),
    (dict(auto_pad="NOTSET", pads=[0, 0, 0, 0]), problem()),
])
def test_conv_attribute_forms(tmp_path, attrs, expected):
    w_in = 4 // attrs.get("group", 1)
    path = conv_model(tmp_path / "m.onnx", [2, 4, 11, 10], [6, w_in, 3, 3], **attrs)
    (layer,) = load_network(path)
    assert layer.name == "the_conv" and layer.problem == expected


def test_three_dimensional_convolutions(tmp_path):
    path = conv_model(tmp_path / "m.onnx", [1, 2, 5, 6, 7], [3, 2, 3, 3, 3], strides=[1, 2, 2], pads=[1, 1, 1, 1, 1, 1])
    (layer,) = load_network(path)
    assert layer.problem == ConvProblem.make(batch=1, in_channels=2, out_channels=3, input_size=(5, 6, 7),
                                             kernel_size=3, stride=(1, 2, 2), padding=1)


def test_one_dimensional_and_math_modes(tmp_path):
    path = conv_model(tmp_path / "m.onnx", [3, 2, 50], [4, 1, 7], group=2, pads=[3, 3])
    (layer,) = load_network(path, math="tf32")
    assert layer.problem == ConvProblem.make(batch=3, in_channels=2, out_channels=4, input_size=(50,), kernel_size=7,
                                             padding=3, groups=2, math="tf32")


@pytest.mark.parametrize("attrs, x_shape, w_shape, op, message", [
    (dict(pads=[1, 0, 2, 0]), [2, 4, 11, 10], [6, 4, 3, 3], "Conv", "asymmetric pads"),
    (dict(auto_pad="SAME_UPPER", strides=[2, 2]), [2, 4, 10, 10], [6, 4, 3, 3], "Conv", "unevenly"),
    (dict(), [1, 2, 5, 6, 7, 4], [3, 2, 3, 3, 3, 1], "Conv", "4-D convolutions are not supported"),
])
def test_what_cannot_be_represented_is_reported_with_the_reason(tmp_path, attrs, x_shape, w_shape, op, message):
    path = conv_model(tmp_path / "m.onnx", x_shape, w_shape, op=op, **attrs)
    with pytest.raises(NetworkError, match=message):
        load_network(path)  # the only convolution: nothing left to tune
    skipped = []
    with pytest.raises(NetworkError):
        load_network(path, skipped=skipped)
    assert skipped and message in skipped[0][2]


def test_other_element_types_and_quantized_convolutions_are_reported(tmp_path):
    path = conv_model(tmp_path / "m.onnx", [1, 2, 8, 8], [3, 2, 3, 3], elem=TensorProto.FLOAT16)
    with pytest.raises(NetworkError, match="element type FLOAT16"):
        load_network(path)


@pytest.mark.parametrize("attrs, x_shape, w_shape, y_size", [
    (dict(strides=[2, 2], pads=[1, 1, 1, 1]), [2, 4, 5, 6], [4, 3, 4, 4], (10, 12)),
    (dict(strides=[3, 2], pads=[1, 0, 1, 0], output_padding=[2, 1], group=2), [1, 4, 4, 5], [4, 3, 3, 3], (12, 12)),
    (dict(strides=[2, 2], auto_pad="SAME_UPPER"), [1, 2, 4, 4], [2, 3, 4, 4], (8, 8)),
])
def test_conv_transpose_is_the_backward_data_pass_of_its_convolution(tmp_path, attrs, x_shape, w_shape, y_size):
    torch = pytest.importorskip("torch")
    path = conv_model(tmp_path / "m.onnx", x_shape, w_shape, op="ConvTranspose", **attrs)
    (layer,) = load_network(path)
    p = layer.problem
    assert p.input_size == y_size and p.y_shape == tuple(x_shape) and "input gradient" in layer.source
    # numerically: PyTorch's transposed convolution is convtune's backward-data pass of that problem
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    group = attrs.get("group", 1)
    padding = tuple(attrs.get("pads", [0, 0])[:2]) if "pads" in attrs else p.padding
    ty = torch.nn.functional.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), stride=attrs["strides"],
                                              padding=padding, output_padding=attrs.get("output_padding", 0),
                                              groups=group)
    rt = convtune.Runtime(miss_policy="heuristic")
    dx = convtune.conv_backward_data(x, w, p.x_shape, p.stride, p.padding, p.dilation, p.groups, runtime=rt)
    assert tuple(ty.shape) == p.x_shape
    np.testing.assert_allclose(dx, ty.numpy(), rtol=1e-4, atol=1e-4)


def test_dynamic_dimensions_need_batch_or_input_shape(tmp_path):
    path = conv_model(tmp_path / "m.onnx", ["N", 4, 11, 10], [6, 4, 3, 3])
    with pytest.raises(NetworkError, match=r"dynamic dimension\(s\) N; give --batch N or --input-shape x=\?,4,11,10"):
        load_network(path)
    assert load_network(path, batch=5)[0].problem.batch == 5
    assert load_network(path, input_shape={"x": (7, 4, 11, 10)})[0].problem.batch == 7
    assert load_network(path, input_shape={None: (3, 4, 11, 10)})[0].problem.batch == 3
    with pytest.raises(NetworkError, match="no input of"):
        load_network(path, input_shape={"image": (1, 4, 11, 10)})
    with pytest.raises(NetworkError, match="has 4 dimensions"):
        load_network(path, input_shape={"x": (1, 4, 11)})


def test_a_model_exported_by_pytorch_parses_and_tunes(tmp_path, fake_default_timer):
    torch = pytest.importorskip("torch")
    import warnings
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 5, stride=2, padding=2), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.ReLU(),
                                torch.nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1))
    path = tmp_path / "exported.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(1, 3, 32, 32),), str(path), dynamo=False, input_names=["image"],
                          dynamic_axes={"image": {0: "batch"}})
    layers = load_network(str(path), batch=4)
    assert [l.problem for l in layers] == [
        ConvProblem.make(batch=4, in_channels=3, out_channels=8, input_size=(32, 32), kernel_size=5, stride=2,
                         padding=2),
        ConvProblem.make(batch=4, in_channels=8, out_channels=8, input_size=(16, 16), kernel_size=3, padding=1,
                         groups=8),
        ConvProblem.make(batch=4, in_channels=4, out_channels=8, input_size=(32, 32), kernel_size=4, stride=2,
                         padding=1)]
    result = CliRunner().invoke(main, ["tune", str(path), "--input-shape", "image=2,3,32,32", "--passes", "fwd,dgrad",
                                       "--db", str(tmp_path / "p.db"), "--backend", "numpy"])
    assert result.exit_code == 0, result.output
    assert "6 tuned" in result.output and "/4/ConvTranspose" in result.output


@pytest.mark.parametrize("content, message", [
    (b"\x08\x01\x12garbage that is no protobuf \xff\xfe", "is not a readable ONNX model"),
    ("TRUNCATE", "is not a readable ONNX model|no nodes|shape inference failed"),
    ("NOCONV", "has no convolution convtune can tune"),
])
def test_malformed_truncated_and_unsupported_files_end_in_one_line(tmp_path, content, message):
    path = tmp_path / "bad.onnx"
    if content == "TRUNCATE":
        whole = conv_model(tmp_path / "whole.onnx", [2, 4, 11, 10], [6, 4, 3, 3])
        data = open(whole, "rb").read()
        path.write_bytes(data[: len(data) // 2])
    elif content == "NOCONV":
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
        onnx.save(helper.make_model(graph), str(path))
    else:
        path.write_bytes(content)
    result = CliRunner().invoke(main, ["tune", str(path), "--db", str(tmp_path / "p.db"), "--backend", "numpy"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    import re
    assert re.search(message, result.output)


def test_without_the_onnx_package_the_error_names_the_extra(tmp_path, monkeypatch):
    path = conv_model(tmp_path / "m.onnx", [2, 4, 11, 10], [6, 4, 3, 3])
    monkeypatch.setitem(sys.modules, "onnx", None)
    result = CliRunner().invoke(main, ["tune", path, "--db", str(tmp_path / "p.db"), "--backend", "numpy"])
    assert result.exit_code == 1 and "pip install 'convtune[onnx]'" in result.output


def test_skipped_nodes_are_named_by_tune_bench_and_explain(tmp_path, fake_default_timer):
    w = helper.make_tensor("w2", TensorProto.FLOAT, [6, 6, 3, 3], [0.0] * 324)
    uneven = helper.make_node("Conv", ["y", "w2"], ["z"], name="uneven", pads=[1, 0, 2, 0])
    path = conv_model(tmp_path / "m.onnx", [2, 4, 11, 10], [6, 4, 3, 3], pads=[1, 1, 1, 1], extra_nodes=[uneven])
    model = onnx.load(path)
    model.graph.initializer.append(w)
    model.graph.output[0].name = "z"
    onnx.save(model, path)
    db = str(tmp_path / "p.db")
    common = ["--passes", "fwd", "--db", db, "--backend", "numpy"]
    for args in (["tune", path, *common], ["bench", path, *common, "--repeats", "3", "-o", str(tmp_path / "r.json")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        assert "skipped uneven (Conv): asymmetric pads" in result.output
    result = CliRunner().invoke(main, ["explain", "uneven", "--net", path, "--db", str(db)])
    assert result.exit_code == 1 and "it is a Conv node convtune leaves out (asymmetric pads" in result.output


def test_a_conv1d_after_a_flatten_and_reshape_gets_its_shapes(tmp_path):
    """A Conv1d behind a Flatten and a Reshape whose target shape is computed (Shape, Gather, Concat): its input's
    shape needs shape inference with data propagation, which the loader asks for."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 6, 5])
    nodes = [helper.make_node("Flatten", ["x"], ["flat"], axis=1),  # (2, 120)
             helper.make_node("Shape", ["flat"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Concat", ["n", "rest"], ["target"], axis=0),
             helper.make_node("Reshape", ["flat", "target"], ["seq"]),  # (2, 8, 15)
             helper.make_node("Conv", ["seq", "w"], ["y"], name="conv1d", pads=[1, 1])]
    inits = [helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
             helper.make_tensor("rest", TensorProto.INT64, [2], [8, 15]),
             helper.make_tensor("w", TensorProto.FLOAT, [3, 8, 3], [0.0] * 72)]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / "flatten.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    skipped = []
    layers = load_network(str(path), skipped=skipped)
    assert skipped == [] and [l.problem for l in layers] == [
        ConvProblem.make(batch=2, in_channels=8, out_channels=3, input_size=(15,), kernel_size=3, padding=1)]

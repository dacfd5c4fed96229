import pytest

from convtune.errors import NetworkError
from convtune.network import builtin_networks, load_network, parse_network, unique_problems


def test_required_builtins_exist_and_load():
    names = builtin_networks()
    for required in ("alexnet", "vgg16", "resnet18", "resnet50", "convnext-tiny", "wav2vec2"):
        assert required in names
        assert load_network(required)


def test_builtin_shapes_chain():
    # each layer's input matches the architecture: spot checks against the published networks
    resnet50 = {l.name: l.problem for l in load_network("resnet50")}
    assert resnet50["layer2.0.conv2"].stride == (2, 2) and resnet50["layer2.0.conv2"].output_size == (28, 28)
    assert resnet50["layer4.2.conv3"].y_shape == (64, 2048, 7, 7)
    convnext = {l.name: l.problem for l in load_network("convnext-tiny")}
    assert convnext["stage0.0.dwconv"].depthwise and convnext["stage0.0.dwconv"].kernel_size == (7, 7)
    wav = load_network("wav2vec2")
    for a, b in zip(wav, wav[1:]):
        assert a.problem.output_size == b.problem.input_size
    assert wav[0].problem.rank == 1


def test_three_dimensional_builtins_chain():
    r3d = {l.name: l.problem for l in load_network("r3d-18")}
    assert all(p.rank == 3 for p in r3d.values()) and len(r3d) == 20
    stem = r3d["stem"]
    assert stem.kernel_size == (3, 7, 7) and stem.output_size == (16, 56, 56)
    assert r3d["layer1.0.conv1"].input_size == stem.output_size
    for down, conv2 in (("layer2.0.conv1", "layer2.0.conv2"), ("layer3.0.conv1", "layer3.0.conv2"),
                        ("layer4.0.conv1", "layer4.0.conv2")):
        assert r3d[down].output_size == r3d[conv2].input_size  # each stride-2 block halves T, H and W
        assert r3d[down.replace("conv1", "downsample")].output_size == r3d[down].output_size
    assert r3d["layer4.1.conv2"].y_shape == (8, 512, 2, 7, 7)
    unet = load_network("unet3d-encoder", batch=1)
    assert [l.problem.input_size for l in unet[::2]] == [(64,) * 3, (32,) * 3, (16,) * 3, (8,) * 3]
    for a, b in zip(unet, unet[1:]):
        assert b.problem.in_channels == a.problem.out_channels  # within a level and across the pooling
        assert b.problem.input_size in (a.problem.output_size, tuple(n // 2 for n in a.problem.output_size))
    assert {l.problem.batch for l in unet} == {1}
    ux = {l.name: l.problem for l in load_network("uxnet3d-encoder")}
    assert ux["stem"].output_size == ux["stage1.dw"].input_size == (48,) * 3
    depthwise = [p for name, p in ux.items() if name.endswith(".dw")]
    assert [p.input_size for p in depthwise] == [(48,) * 3, (24,) * 3, (12,) * 3, (6,) * 3]
    for p in depthwise:  # 7x7x7 depthwise, same padding
        assert p.kernel_size == (7, 7, 7) and p.groups == p.in_channels == p.out_channels and p.output_size == p.input_size
    for stage in "234":
        assert ux[f"down{stage}"].output_size == ux[f"stage{stage}.dw"].input_size
        assert ux[f"down{stage}"].out_channels == ux[f"stage{stage}.pw2"].out_channels


def test_batch_override_and_dedup():
    layers = load_network("resnet50", batch=32)
    assert {l.problem.batch for l in layers} == {32}
    problems = unique_problems(layers, ("fwd", "dgrad"))
    assert len(problems) == 2 * len({l.problem.key() for l in layers})
    shared = [names for _p, names in problems if len(names) > 1]
    assert shared, "resnet50 repeats shapes; they must be tuned once"


def test_the_benchmark_suite_format(tmp_path):
    text = """
layers:
  - {name: a, batch: 4, in_channels: 8, out_channels: 8, input: [16, 16], kernel: [3, 3], padding: 1, source: x}
  - {name: b, batch: 4, in_channels: 8, out_channels: 8, input: [64], kernel: [9], stride: [2], groups: 8}
"""
    layers = parse_network(text, "t")
    assert [l.name for l in layers] == ["a", "b"] and layers[1].problem.groups == 8
    path = tmp_path / "net.json"
    path.write_text('[{"name": "c", "batch": 1, "in_channels": 2, "out_channels": 2, "input": [5], "kernel": [3]}]')
    assert load_network(str(path))[0].problem.input_size == (5,)


@pytest.mark.parametrize("text, message", [
    ("layers: [", "malformed YAML/JSON at line"),
    ("layers: []", "non-empty list"),
    ("layers: [3]", "layer 1: expected a mapping"),
    ("layers: [{name: a, batch: 1}]", "layer 1 \\(a\\): missing field\\(s\\) in_channels"),
    ("layers: [{name: a, batch: 1, in_channels: 2, out_channels: 2, input: [5], kernel: [3], colour: red}]",
     "unknown field\\(s\\) colour"),
    ("layers: [{name: a, batch: 1, in_channels: 2, out_channels: 2, input: [5], kernel: [9]}]",
     "layer 1 \\(a\\): axis 0: the dilated kernel spans 9"),
    ("layers: [{name: a, batch: 1, in_channels: 3, out_channels: 2, input: [5], kernel: [3], groups: 2}]",
     "divisible by groups"),
    ("layers:\n - {name: a, batch: 1, in_channels: 2, out_channels: 2, input: [5], kernel: [3]}\n"
     " - {name: a, batch: 1, in_channels: 2, out_channels: 2, input: [5], kernel: [3]}", "duplicate layer name"),
])
def test_invalid_descriptions(text, message):
    with pytest.raises(NetworkError, match=message):
        parse_network(text, "t")


def test_unknown_network_lists_builtins():
    with pytest.raises(NetworkError, match="built-in network.*resnet50"):
        load_network("resnet51")


def test_unreadable_file(tmp_path):
    with pytest.raises(NetworkError, match="cannot read network file"):
        load_network(str(tmp_path / "missing.yaml"))

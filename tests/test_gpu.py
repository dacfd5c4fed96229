"""GPU-only checks (run with scripts/gpu-tests.sh on the device machine).

A tuned forward/backward round trip through convtune's runtime, with the real
CUDA-event timer, must match PyTorch's conv and its autograd gradients in float64
on layers of the public benchmark suite (batch reduced to keep the run short).
"""

import math

import numpy as np
import pytest

import convtune
from convtune.backend import get_backend

pytestmark = pytest.mark.gpu

# name: (batch, in, out, input, kernel, stride, padding, groups) from ../shared/bench/layers.yaml
SUITE_LAYERS = {
    "alexnet-conv2": (4, 64, 192, (27, 27), (5, 5), 1, 2, 1),
    "resnet50-res3-3x3s2": (4, 128, 128, (56, 56), (3, 3), 2, 1, 1),
    "resnet50-res2-1x1": (4, 256, 64, (56, 56), (1, 1), 1, 0, 1),
    "convnext-t-dw7": (4, 96, 96, (56, 56), (7, 7), 1, 3, 96),
    "fbfft-L4": (4, 128, 128, (16, 16), (7, 7), 1, 0, 1),
    "temporal-k5": (4, 256, 256, (512,), (5,), 1, 2, 1),
    "wav2vec2-conv0": (2, 1, 512, (16000,), (10,), 5, 0, 1),
}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("name", sorted(SUITE_LAYERS))
def test_tuned_round_trip_matches_torch(torch, name):
    import cupy as cp
    n, cin, cout, size, kernel, stride, padding, groups = SUITE_LAYERS[name]
    rank = len(size)
    rt = convtune.Runtime(planner_options={"time_budget_s": 5.0})
    rng = cp.random.default_rng(7)
    x = rng.standard_normal((n, cin, *size), dtype=cp.float32)
    w = rng.standard_normal((cout, cin // groups, *kernel), dtype=cp.float32)
    y = convtune.conv(x, w, stride, padding, 1, groups, runtime=rt)
    dy = rng.standard_normal(y.shape, dtype=cp.float32)
    dx = convtune.conv_backward_data(dy, w, x.shape, stride, padding, 1, groups, runtime=rt)
    dw = convtune.conv_backward_filter(x, dy, w.shape, stride, padding, 1, groups, runtime=rt)
    assert rt.tuned == 3

    tx = torch.as_tensor(cp.asnumpy(x), dtype=torch.float64, device="cuda").requires_grad_()
    tw = torch.as_tensor(cp.asnumpy(w), dtype=torch.float64, device="cuda").requires_grad_()
    fn = torch.nn.functional.conv1d if rank == 1 else torch.nn.functional.conv2d
    ty = fn(tx, tw, stride=stride, padding=padding, groups=groups)
    ty.backward(torch.as_tensor(cp.asnumpy(dy), dtype=torch.float64, device="cuda"))

    def rel(ours, theirs):
        theirs = theirs.detach().cpu().numpy()
        return float(np.linalg.norm(cp.asnumpy(ours).astype(np.float64) - theirs) / np.linalg.norm(theirs))

    assert rel(y, ty) < 1e-5
    assert rel(dx, tx.grad) < 1e-5
    assert rel(dw, tw.grad) < 1e-5
    # warm calls hit the memo: no tuning, same numbers
    y2 = convtune.conv(x, w, stride, padding, 1, groups, runtime=rt)
    assert rt.tuned == 3 and bool(cp.allclose(y, y2))


def test_cuda_event_timer_measures_real_work():
    import cupy as cp
    backend = get_backend("cupy")
    a = cp.random.default_rng(0).standard_normal((2048, 2048), dtype=cp.float32)
    stats = convtune.CudaEventTimer(repeats=10)(lambda: a @ a, backend)
    flops = 2 * 2048 ** 3
    assert stats.repeats == 10
    assert 1e-6 < stats.median_s < 1.0
    assert flops / stats.median_s < 2e14  # below any fp32 peak: the timer did not skip the work


def test_device_fingerprint_is_complete():
    info = get_backend("cupy").device_info()
    for field in ("model", "compute_capability", "driver", "cuda_runtime", "cufft", "cublas", "cupy"):
        assert getattr(info, field), field
    assert info.sm_count > 0 and info.memory_bytes > 0
    assert info.key().startswith("gpu:")


def test_layer_object_trains_on_cupy():
    import cupy as cp
    rt = convtune.Runtime(planner_options={"time_budget_s": 2.0})
    layer = convtune.Conv2d(8, 16, 3, padding=1, backend="cupy", seed=0, runtime=rt)
    x = cp.random.default_rng(1).standard_normal((4, 8, 20, 20), dtype=cp.float32)
    y = layer(x)
    dx = layer.backward(cp.ones_like(y))
    assert isinstance(dx, cp.ndarray) and dx.shape == x.shape
    assert isinstance(layer.grad_weight, cp.ndarray) and math.isfinite(float(layer.grad_weight.sum()))

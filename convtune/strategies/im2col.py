"""im2col + GEMM: every pass, stride, padding, dilation and groups; batch chunks as candidates.

In ``tf32`` mode the GEMMs run on TF32 tensor cores (``tf32=True`` configs); in ``fp32`` mode they
are strict fp32 whatever the environment says (see :func:`convtune.backend.gemm_precision`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..backend import gemm_precision
from ..direct import cublas_pointwise, im2col
from ..executor import Executor
from ..problem import ConvProblem
from .base import Config, Strategy, check_tf32, register


@dataclass(frozen=True)
class Im2colConfig(Config):
    chunk: int  # samples per GEMM; bounds the column buffer
    tf32: bool = False  # TF32 tensor-core GEMMs (tf32 mode only)


def _chunk_options(batch: int) -> list[int]:
    return sorted({batch, max(1, batch // 4), 1}, reverse=True)


@register
class Im2colStrategy(Strategy):
    name = "im2col"
    version = 4
    # 3: 1x1 layers on the GPU as bare cuBLAS calls (same GEMMs, less host time), their only plan; 4: their forward
    # and backward-data GEMMs through cuBLASLt, launched from CUDA graphs by address
    changes = {3: lambda p: cublas_pointwise.shape_reason(p) is None,
               4: lambda p: cublas_pointwise.shape_reason(p) is None and p.pass_ in ("fwd", "dgrad")}
    config_type = Im2colConfig

    def supports(self, problem: ConvProblem, backend) -> str | None:
        if problem.math not in ("fp32", "tf32"):
            return f"math mode {problem.math!r} is not implemented"
        return None

    def candidates(self, problem, backend):
        tf32 = problem.math == "tf32"
        if cublas_pointwise.unsupported_reason(problem, backend) is None:  # no columns, no chunks: one plan
            return [Im2colConfig(chunk=problem.batch, tf32=tf32)]
        return [Im2colConfig(chunk=c, tf32=tf32) for c in _chunk_options(problem.batch)]

    def pruned(self, problem, config, backend, room=None):
        """The rules fitted on measured searches (``benchmarks/check_rules.py`` replays them):

        * GPU, one input channel per group (depthwise layers, channel multipliers): no im2col. Its GEMMs are one
          row deep per group. H100 and H200, every such problem of six stored searches (ConvNeXt-T exhaustive,
          tests/data/searches/h100-convnext_tiny-exhaustive.db.gz; the public suite's two exhaustive searches; two
          ConvNeXt-T tunes and one of SLaK-T on the H200; 86 problems, 242 candidates): im2col never came within
          10.9x of the best, and on SLaK-T its candidates took 20.3 s of an 80.6 s tune (51x51 backward-data
          passes: 11,500x the winner).
        * GPU, bfloat16 channels_last layers: no im2col (its float32 GEMMs between conversions). H100 and H200, the
          stored searches of ResNet-50 under AMP, SLaK-T, ConvNeXt-T and RepLKNet-31B in bfloat16 channels_last
          (tests/data/searches/h*-amp-search.db.gz, h200-*-bf16-*.db.gz): in 136 such problems (1x1 to 7x7, every
          pass) it never came within 3.3x of the winner, and it cost 0.4 to 1.5 s of each model's normal search.
        """
        if backend.name == "cupy" and problem.groups > 1 and problem.in_per_group == 1:
            return ("one input channel per group on the GPU (depthwise): im2col's GEMMs are one row deep per group, "
                    "and it has never come within 10x of the best there")
        if backend.name == "cupy" and problem.dtype == "bfloat16" and problem.layout == "channels_last":
            return ("a bfloat16 channels_last layer on the GPU: im2col's float32 GEMMs between conversions have "
                    "never come within 3x of the best there")
        return None

    def workspace_bytes(self, problem, config) -> int:
        return im2col.workspace_bytes(problem, config.chunk)

    def build(self, problem, config, backend):
        check_tf32(problem, config)
        xp = backend.xp
        fn = im2col.PASS_FUNCTIONS[problem.pass_]
        chunk = max(1, min(config.chunk, problem.batch))
        shape = problem.result_shape

        fast = cublas_pointwise.build(problem, xp, config.tf32) \
            if cublas_pointwise.unsupported_reason(problem, backend) is None else None

        def run(a, b, out=None):
            if out is None:
                out = xp.empty(shape, dtype=a.dtype)
            if fast is not None and fast(a, b, out) is not None:
                return out
            with gemm_precision(xp, config.tf32):
                return fn(xp, problem, chunk, a, b, out)
        return Executor(run, launch=fast.launch if fast is not None else None)  # (by address: the PyTorch bridge)


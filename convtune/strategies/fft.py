"""FFT convolution (cuFFT on the GPU, pocketfft on the CPU): transform size per axis,
frequency-domain product variant and batch chunk are the search axes."""

from __future__ import annotations

from dataclasses import dataclass

from ..backend import gemm_precision
from ..fft import cost, sizes as fft_sizes
from ..fft.spectral import POINTWISE_MAX_PAIRS, SpectralConv, workspace_bytes
from ..problem import ConvProblem
from .base import Config, Strategy, check_tf32, register

#: The cost model keeps this many size choices for the benchmark to decide among.
KEEP_SIZES = 3


@dataclass(frozen=True)
class FftConfig(Config):
    sizes: tuple[int, ...]
    product: str = "gemm"
    chunk: int = 1 << 30
    tf32: bool = False  # the gemm product on TF32 tensor cores (tf32 mode only)


@register
class FftStrategy(Strategy):
    name = "fft"
    version = 3
    config_type = FftConfig

    def supports(self, problem: ConvProblem, backend) -> str | None:
        return None

    def candidates(self, problem, backend):
        ranked = sorted(fft_sizes.size_candidates(problem), key=lambda s: cost.estimate(problem, s))
        products = ["gemm"]
        if problem.in_per_group * problem.out_per_group <= POINTWISE_MAX_PAIRS:
            products.append("pointwise")
        tf32 = problem.math == "tf32"
        configs = [FftConfig(sizes=s, product=prod, chunk=problem.batch, tf32=tf32 and prod == "gemm")
                   for s in ranked[:KEEP_SIZES] for prod in products]
        # a chunked variant of the cheapest size, for when whole-batch spectra exceed the budget
        if problem.batch >= 8:
            configs.append(FftConfig(sizes=ranked[0], product=products[0], chunk=max(1, problem.batch // 8),
                                     tf32=tf32))
        return configs

    def workspace_bytes(self, problem, config) -> int:
        return workspace_bytes(problem, config.sizes, config.chunk)

    def build(self, problem, config, backend):
        check_tf32(problem, config)
        if config.tf32 and config.product != "gemm":
            raise ValueError(f"{config.label()}: TF32 applies to the gemm product only")
        minimal = fft_sizes.minimal_sizes(problem)
        if len(config.sizes) != problem.rank or any(L < m for L, m in zip(config.sizes, minimal)):
            raise ValueError(f"transform sizes {config.sizes} are below the minimum {minimal} for this problem")
        xp = backend.xp
        spectral = SpectralConv(xp, problem, config.sizes, config.product, config.chunk)
        shape = problem.result_shape

        def run(a, b, out=None):
            if out is None:
                out = xp.empty(shape, dtype=a.dtype)
            with gemm_precision(xp, config.tf32):
                return spectral(a, b, out)
        return run

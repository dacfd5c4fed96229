"""FFT convolution (cuFFT on the GPU, pocketfft on the CPU): transform size per axis,
frequency-domain product variant and batch chunk are the search axes."""

from __future__ import annotations

from dataclasses import dataclass

from ..fft import cost, sizes as fft_sizes
from ..fft.spectral import POINTWISE_MAX_PAIRS, SpectralConv, workspace_bytes
from ..problem import ConvProblem
from .base import Config, Strategy, register

#: The cost model keeps this many size choices for the benchmark to decide among.
KEEP_SIZES = 3


@dataclass(frozen=True)
class FftConfig(Config):
    sizes: tuple[int, ...]
    product: str = "gemm"
    chunk: int = 1 << 30


@register
class FftStrategy(Strategy):
    name = "fft"
    version = 1
    config_type = FftConfig

    def supports(self, problem: ConvProblem, backend) -> str | None:
        return None

    def candidates(self, problem, backend):
        ranked = sorted(fft_sizes.size_candidates(problem), key=lambda s: cost.estimate(problem, s))
        products = ["gemm"]
        if problem.in_per_group * problem.out_per_group <= POINTWISE_MAX_PAIRS:
            products.append("pointwise")
        configs = [FftConfig(sizes=s, product=prod, chunk=problem.batch)
                   for s in ranked[:KEEP_SIZES] for prod in products]
        # a chunked variant of the cheapest size, for when whole-batch spectra exceed the budget
        if problem.batch >= 8:
            configs.append(FftConfig(sizes=ranked[0], product=products[0], chunk=max(1, problem.batch // 8)))
        return configs

    def workspace_bytes(self, problem, config) -> int:
        return workspace_bytes(problem, config.sizes, config.chunk)

    def build(self, problem, config, backend):
        minimal = fft_sizes.minimal_sizes(problem)
        if len(config.sizes) != problem.rank or any(L < m for L, m in zip(config.sizes, minimal)):
            raise ValueError(f"transform sizes {config.sizes} are below the minimum {minimal} for this problem")
        xp = backend.xp
        spectral = SpectralConv(xp, problem, config.sizes, config.product, config.chunk)
        shape = problem.result_shape

        def run(a, b, out=None):
            if out is None:
                out = xp.empty(shape, dtype=a.dtype)
            return spectral(a, b, out)
        return run

"""FFT convolution (cuFFT on the GPU, pocketfft on the CPU): transform size per axis,
frequency-domain product variant and batch chunk are the search axes.

Products: ``gemm`` (batched complex GEMM on the FFT library's layout, with transposed copies),
``fgemm`` (frequency-major spectra and one strided-batched GEMM with no copies, see
:mod:`convtune.fft.freqmajor`; on the GPU also ``fused`` cuFFT callbacks, ``strided`` cuFFT
layouts, ``packed``: no layout change, convtune's own GEMM kernel, ``narrow``: on that layout, a
register-blocked kernel for few channels, and ``own``: convtune's own one-pass 64x64 transforms
instead of cuFFT's), ``pointwise`` (broadcast products, for few channels
per group). Two rewrites of the problem run it through the same executors: ``polyphase`` (a strided
problem as the stride-1 problem of its phases) and ``tiled`` (overlap-save: tiles of ``sizes``
samples as extra batch entries, :mod:`convtune.fft.overlap`).
"""

from __future__ import annotations

import enum

from dataclasses import dataclass, replace

from .. import precision
from ..backend import gemm_precision
from ..fft import callbacks, cost, fft64, freqmajor, narrow, overlap, packedgemm, polyphase, spectral
from ..fft import sizes as fft_sizes
from ..fft.spectral import SpectralConv, pointwise_applies
from ..executor import Executor
from ..problem import ConvProblem
from .base import Config, Strategy, check_tf32, register

#: The cost model keeps this many size choices for the benchmark to decide among.
KEEP_SIZES = 3
#: Tilings are timed when the cost model puts them within this factor of the best untiled size (the
#: model counts flops; small tiles' transforms run in one pass over memory, which it does not see) ...
TILE_SLACK = 2.0
#: ... and at most this many tile lengths, the cheapest.
KEEP_TILES = 2
#: Tiles go through the transforms in batch chunks of whole images that keep a tiled plan's workspace
#: under this (half the planner's default limit) where they can: tiling is for inputs too large to
#: transform whole. Chunks stop at one image and at :data:`MIN_TILE_CHUNK` tiles (fewer would cost
#: launches and save little).
TILE_WORKSPACE = 2 << 30
MIN_TILE_CHUNK = 256
#: Products that are complex GEMMs (and so may run on TF32 tensor cores in tf32 mode).
GEMMS = ("gemm", "fgemm")
PRODUCTS = GEMMS + ("pointwise",)


class Product(enum.Enum):
    """The channel product of an FFT plan."""
    POINTWISE = "pointwise"  # elementwise per channel pair (few channels per group: depthwise, long 1-D kernels)
    BATCHED_GEMM = "gemm"  # batched GEMM on the FFT library's layout, with transposed copies
    CUBLAS_GEMM = "fgemm"  # one strided-batched complex GEMM over frequency-major spectra (cuBLAS)
    PACKED_GEMM = "packed"  # convtune's batched complex GEMM kernel on cuFFT's own layout
    NARROW = "narrow"  # convtune's register-blocked kernel on the packed layout, for few channels


class Transform(enum.Enum):
    """Which transforms an FFT plan runs."""
    LIBRARY = "library"  # cuFFT (NumPy's pocketfft on the CPU)
    CALLBACKS = "callbacks"  # cuFFT with load and store callbacks placing the operand and gathering the result
    OWN = "own"  # convtune's own one-pass 64x64 transforms


class SpectrumLayout(enum.Enum):
    """How an FFT plan lays its spectra out for the product."""
    LIBRARY = "library"  # as the FFT library returns them (the packed product reads this directly)
    TRANSPOSED = "transposed"  # frequency-major, by a transpose of each spectrum
    STRIDED = "strided"  # frequency-major, written so by cuFFT's advanced layout


class Placement(enum.Enum):
    """How a problem meets the transforms: ``(polyphase, tiled)``."""
    WHOLE = (False, False)
    TILED = (False, True)  # overlap-save tiles of the transform size
    POLYPHASE = (True, False)  # a strided problem as the stride-1 problem of its phases
    POLYPHASE_TILED = (True, True)


@dataclass(frozen=True)
class FftConfig(Config):
    sizes: tuple[int, ...]
    product: str = "gemm"
    chunk: int = 1 << 30
    tf32: bool = False  # the gemm/fgemm product (cuBLAS's, or the packed kernel's) on TF32 tensor cores (tf32 mode only)
    strided: bool = False  # fgemm on the GPU: cuFFT writes the frequency-major layout itself, no transposes
    fused: bool = False  # fgemm on the GPU: zero-extension and crop in cuFFT's load/store callbacks
    polyphase: bool = False  # strided problems: run as the stride-1 problem of their phases (sizes are its)
    packed: bool = False  # fgemm on the GPU: spectra stay in cuFFT's layout, convtune's own GEMM kernel reads it
    own: bool = False  # fgemm on the GPU: convtune's own one-pass transforms instead of cuFFT's (64x64 only)
    narrow: bool = False  # packed, few channels: convtune's register-blocked product kernel (convtune.fft.narrow)
    tiled: bool = False  # stride-1 problems: overlap-save tiles of ``sizes`` samples (the transform size too)

    # The fields above are the stored form (plan caches and labels keep them as they are); what they combine into is
    # four choices, each an enumeration below, and a combination that is none of them cannot be built.
    def __post_init__(self):
        if self.product not in PRODUCTS:
            raise ValueError(f"unknown product {self.product!r}; acceptable: {', '.join(PRODUCTS)}")
        if self.tf32 and self.product not in GEMMS:
            raise ValueError(f"{self.label()}: TF32 applies to the {' and '.join(GEMMS)} products only")
        if (self.strided or self.fused or self.packed or self.own) and self.product != "fgemm":
            raise ValueError(f"{self.label()}: the strided, fused, packed and own variants apply to the fgemm "
                             "product only")
        if self.narrow and not self.packed:
            raise ValueError(f"{self.label()}: the narrow product runs on the packed layout (packed=True)")
        if self.own and (self.fused or self.strided):
            raise ValueError(f"{self.label()}: convtune's own transforms replace cuFFT's; the fused and strided "
                             "variants are cuFFT's")
        if self.strided and self.packed:
            raise ValueError(f"{self.label()}: the packed product reads cuFFT's packed layout, not the strided one")
        if self.strided and self.fused:
            raise ValueError(f"{self.label()}: the fused (callback) transforms use cuFFT's packed layout, not the "
                             "strided one")

    @property
    def product_kind(self) -> Product:
        """How the channels are reduced at each frequency."""
        if self.product == "pointwise":
            return Product.POINTWISE
        if self.product == "gemm":
            return Product.BATCHED_GEMM
        return Product.NARROW if self.narrow else Product.PACKED_GEMM if self.packed else Product.CUBLAS_GEMM

    @property
    def transform(self) -> Transform:
        """Which transforms run: cuFFT's (or NumPy's), with load/store callbacks, or convtune's own."""
        return Transform.OWN if self.own else Transform.CALLBACKS if self.fused else Transform.LIBRARY

    @property
    def layout(self) -> SpectrumLayout:
        """How spectra are laid out for the product."""
        if self.product != "fgemm" or self.packed:
            return SpectrumLayout.LIBRARY
        return SpectrumLayout.STRIDED if self.strided else SpectrumLayout.TRANSPOSED

    @property
    def placement(self) -> Placement:
        """How the problem meets the transforms: whole, in overlap-save tiles, as its stride's phases, or both."""
        return Placement((self.polyphase, self.tiled))


#: Depthwise 2-D kernels of at most this many per axis get no FFT on the GPU (:func:`small_depthwise`).
SMALL_DEPTHWISE = 7
#: Dense (one group) half-precision kernels of at most this many per axis get no FFT on the GPU (``pruned``)...
SMALL_HALF_DENSE = 3
#: ... where no FFT candidate came within this many times the winner.
SMALL_HALF_DENSE_CLOSEST = 6


def small_depthwise(problem: ConvProblem, backend) -> str | None:
    """The rule on small depthwise kernels shared by the FFT strategies (``fft`` and ``fft-plane``): on the GPU, a
    2-D depthwise layer (one filter per channel) of at most :data:`SMALL_DEPTHWISE` taps per axis gets no FFT.
    Replayed on the stored GPU searches (``benchmarks/check_rules.py`` on tests/data/searches, H100 and H200:
    ConvNeXt-T, SLaK-T, RepLKNet-31B, the public suite; 3x3 to 7x7, float32 and bfloat16, channels-first and
    channels_last, every pass) it prunes ``fft``'s 642 candidates in 79 problems, the closest 2.30x the winner, and
    ``fft-plane``'s 368 in 61, the closest 1.45x (ConvNeXt-T's stage-1 7x7 backward-data pass in bfloat16); none won.
    Their searches cost 11.3 s of 1,246, their kernels' compiling aside. In ConvNeXt-T's AMP tune on an H100 (2026-12-07) the
    two strategies' 141 candidates cost 2.5 s of 26.3, the process's first cuFFT plans among them, never within
    2.53x of the winner."""
    if getattr(backend, "name", "") != "cupy" or problem.rank != 2 or not problem.depthwise or \
            problem.out_per_group != 1 or any(k > SMALL_DEPTHWISE for k in problem.kernel_size):
        return None
    return (f"depthwise kernel of at most {SMALL_DEPTHWISE} per axis on the GPU: FFT has never come within 1.45x of "
            "the best there")


def own_transform_configs(problem, backend, sizes, products, tf32) -> list[FftConfig]:
    """convtune's own transforms (GPU, the sizes they take): with the packed product where it runs (in tf32 mode
    also its TF32 tensor-core form), and with cuBLAS where the packed kernel is missing or TF32 tensor cores may do
    the product."""
    if "fgemm" not in products or backend.name != "cupy":
        return []
    own = [s for s in sizes if fft64.applies(s) is None]
    packed = packedgemm.packed_available(backend)
    configs = [FftConfig(sizes=s, product="fgemm", chunk=problem.batch, packed=True, own=True) for s in own if packed]
    if tf32 and packed:
        configs += [FftConfig(sizes=s, product="fgemm", chunk=problem.batch, packed=True, own=True, tf32=True)
                    for s in own]
    if tf32 or not packed:
        configs += [FftConfig(sizes=s, product="fgemm", chunk=problem.batch, tf32=tf32, own=True) for s in own]
    return configs


def narrow_variants(problem, configs) -> list:
    """Each packed configuration (an :class:`FftConfig` or a round trip's: both take the whole batch) again with
    the narrow product, where ``problem`` has few enough channels or images for it (:mod:`convtune.fft.narrow`)."""
    if narrow.unsupported_reason(problem.in_per_group, problem.out_per_group, problem.batch) is not None:
        return []
    # (the narrow kernel is float32: a TF32 packed configuration's narrow form has float32 products)
    return list(dict.fromkeys(replace(c, narrow=True, tf32=False) for c in configs if c.packed))


@register
class FftStrategy(Strategy):
    name = "fft"
    transforms = True
    version = 13
    config_type = FftConfig
    #: 9: the gemm and pointwise products' transforms on the GPU through cuFFT plans made once (one
    #: embedding kernel per operand) instead of ``cupy.fft`` (same results, less host and device time). Those
    #: candidates run on kernels wider than 3 on some axis: narrower ones get convtune's own transforms only
    #: (:meth:`pruned`), and on the CPU nothing changed. 10: 3-D problems get the GPU's fused (cuFFT
    #: callbacks of any rank), packed and strided variants too.
    #: 11: convtune's own transforms read and write half-precision and channels_last problems themselves
    #: (no conversions around them). 12: in tf32 mode the own transforms' packed product has a TF32 tensor-core
    #: form too. 13: the narrow product is a candidate at a batch of 16 or less too (many channels on both sides),
    #: and its blocks changed (one warp per block of threads where the columns are few or both sides are wide).
    changes = {9: lambda p: any(k > 3 for k in p.kernel_size), 10: lambda p: p.rank == 3,
               11: lambda p: p.dtype != "float32" or p.layout != "channels_first", 12: lambda p: p.math == "tf32",
               13: freqmajor.narrow_changed}

    def supports(self, problem: ConvProblem, backend) -> str | None:
        return None

    def candidates(self, problem, backend):
        configs = self._configs(problem, backend, keep=KEEP_SIZES) + self._tiled_configs(problem, backend)
        # a strided problem also runs as the stride-1 problem of its phases (no output computed to be
        # dropped); its own sizes, the cheapest two, and its tilings
        if polyphase.applies(problem) is None:
            inner = polyphase.Polyphase(problem).inner
            phased = self._configs(inner, backend, keep=2, variants=False) + self._tiled_configs(inner, backend)
            configs += [replace(c, polyphase=True) for c in phased]
        return configs

    def pruned(self, problem, config, backend, room=None):
        """The rules fitted on measured searches (every candidate timed; ``benchmarks/check_rules.py``
        replays them against any stored search, and reports a pruned candidate within 3% of a winner):

        * kernels no wider than their stride on every axis (windows that do not overlap: 2x2 stride-2
          downsamples, patch embeddings; 1x1 kernels are the case of stride 1): no FFT. 2-core CPU,
          uxnet3d-encoder's 2x2x2 stride-2 192->384 layer:
          its 30 FFT candidates took 1.8 to 12.2 s each on the verification batch (170 s in all, workspaces
          of 2.1 to 2.9 GiB) against 1.2 to 2.3 ms for the winners, and were all skipped.
        * 1x1 kernels: no FFT. H100 (the public suite in fp32, tests/data/searches/explain-h100-fp32-suite.txt.gz,
          3 problems): the best FFT candidate took 2.15x the winner's time at best; 2-core CPU
          (resnet18 at batch 8, tests/data/searches/explain-cpu-resnet18-b8.txt.gz): every FFT
          candidate of its 1x1 problems was over 900x slower than the best on the verification batch.
        * GPU, kernels of at most 3 per axis: only convtune's own transforms. The fp32 suite's 15 such problems:
          FFT won 2, both with its own transforms; the best of the rest took 1.21x the winner's time.
        * GPU, a batch chunk smaller than the batch (not tiled): only where the whole-batch form's workspace
          is over the room the planner has. The fp32 suite: 97 chunked candidates, none faster than its whole-batch
          form, the best 1.94x the winner. (On the CPU the chunks stay: they were up to 24% faster there.)
        * CPU, 2-D kernels of at most 3 per axis, and dense (one group) 2-D kernels of at most 7 per axis:
          no FFT. 2-core CPU sweep (benchmarks/fft_crossover.yaml, tests/data/searches/explain-cpu-fft-crossover.txt.gz)
          and resnet18 at batch 8: the best FFT candidate took at least 5.4x the winner's time on 3x3
          kernels (21 problems), at least 3.8x on dense 5x5 (6), at least 1.9x on dense 7x7 (9, stride 2
          included); FFT first won at depthwise 5x5 (wgrad), dense 9x9 and depthwise 1-D kernels of 9.
        * GPU, strided dense (one group) kernels of at most 7 per axis: no FFT. H100, resnet50 at batch 32
          (2026-11-23): on its 7x7 stride-2 stem the fused-callback variants (a JIT-compiled cuFFT callback
          each, 0.3-0.8 s to build and verify) took 19.9 s of the search's 45.8 s and won nothing, their
          best 1.19x the winner's time (tests/data/searches/h100-resnet50-b32-rules-1.db.gz); without them,
          the other 17 per pass took 3.6 s of the search's 35 s, their best 1.63x
          (h100-resnet50-b32-rules-2.db.gz). Strided layers of an earlier search: best 1.07x; the fp32 suite:
          1.12x. (At stride 1 FFT has won: the suite's dense 7x7 dgrad at 16x16 and a 1-D kernel of 5, tiled.)
        * GPU, depthwise 2-D kernels of at most 7 per axis: no FFT (:func:`small_depthwise`).
        * GPU, dense (one group) half-precision kernels of at most 3 per axis (:data:`SMALL_HALF_DENSE`): no FFT, not
          even convtune's own transforms, against cuDNN's tensor-core engines. On the stored searches
          (``benchmarks/check_rules.py`` on tests/data/searches: ResNet-50 under AMP on an H100, 2026-11-24 and
          2026-12-07) the rule prunes 5 candidates in 3 problems, the closest 8.53x the winner, 2.0 s of the
          searches' cost; on ten ResNet-50 AMP tunes on an H100 and an H200 (2026-12-06 and 07) 30 candidates, 3 a
          tune, the closest 6.09x, 18.9 s of the 168.7 s their candidates cost: about 1.9 s a tune, nearly all of it
          the first run of the process's first FFT candidate (its kernels compiled). Measured in bfloat16; float16
          runs on the same engines.
        * GPU, the ``gemm`` product (batched matmul on the FFT library's layout, with transposed copies) where the
          ``fgemm`` or ``pointwise`` product runs the problem (as the configuration runs it: its phases, its
          tiles): never. In the 672 problems of the stored GPU searches that listed it (H100 and H200,
          tests/data/searches: dense and depthwise, 1-D and 2-D, float32 and bfloat16; fgemm or pointwise beside it
          in every one) it won nothing and came no closer than 1.25x the winner (hyena-long-dw's filter gradient)
          in the 307 where it was timed; the others were skipped as slow or over the budget, after its verification. Replayed
          after the other rules on every committed search and explain log (``benchmarks/check_rules.py``, as
          tests/test_search_cost.py runs it; the small depthwise kernels' rule, above, first): 617 candidates in
          87 problems, the closest 1.32x, 31.7 s of the searches' 1,246 s; of the normal (not exhaustive) searches'
          candidate costs, 2.1 of RepLKNet-31B's 21.0 s and 1.9 of SLaK-T's 19.4 s in float32, 2.0 of SLaK-T's
          91.8 s in bfloat16 (H200).
        * GPU, strided dense kernels of at most twice the stride on every axis (each input read by at most
          two windows): no FFT. H100, the public suite's wav2vec2-conv0 (kernel 10, stride 5, 16000 samples,
          2026-11-23): 99 FFT candidates took 22 s of the search, the best 1.93x the winner (wgrad), 5.4x and
          7.6x on the other passes; the fp32 suite's
          3x3 stride-2 layers and the same day's exhaustive suite search: best 1.40x and 1.30x.
        """
        kernel = problem.kernel_size
        if all(k == 1 for k in kernel):
            return "1x1 kernel: FFT has never come within 2x of the best there"
        if all((k - 1) * d + 1 <= s for k, s, d in zip(kernel, problem.stride, problem.dilation)):
            return ("kernel no wider than its stride (windows that do not overlap): the direct convolution is one "
                    "GEMM with nothing to share, FFT computes every position and drops most")
        small = all(k <= 3 for k in kernel)
        if backend.name == "cupy":
            depthwise = small_depthwise(problem, backend)
            if depthwise is not None:
                return depthwise
            if problem.groups == 1 and problem.dtype != "float32" and all(k <= SMALL_HALF_DENSE for k in kernel):
                return (f"dense half-precision kernel of at most {SMALL_HALF_DENSE} per axis on the GPU: FFT has never "
                        f"come within {SMALL_HALF_DENSE_CLOSEST}x of the best there")
            if small and not config.own:
                return "kernel of at most 3 per axis on the GPU: only convtune's own transforms have won there"
            if config.product == "gemm" and self._other_products(problem, config):
                return ("the gemm product on the GPU where fgemm or pointwise runs the problem: it has never come "
                        "within 1.25x of the best there")
            if problem.groups == 1 and all((k - 1) * d + 1 <= 2 * st for k, st, d in
                                           zip(kernel, problem.stride, problem.dilation)) and max(problem.stride) > 1:
                return ("dense kernel of at most twice its stride on the GPU (each input read by at most two windows): "
                        "FFT has never come within 1.3x of the best there")
            if problem.groups == 1 and all(k <= 7 for k in kernel) and max(problem.stride) > 1:
                return ("strided dense kernel of at most 7 per axis on the GPU: FFT has never come within 1.07x "
                        "of the best there")
            if 1 <= config.chunk < problem.batch and not config.tiled and room is not None:
                whole = replace(config, chunk=problem.batch)
                if self.workspace_bytes(problem, whole) <= room:
                    return ("batch chunks on the GPU: the whole-batch form fits the workspace and has always "
                            "been faster")
            return None
        if problem.rank == 2 and (small or (problem.groups == 1 and all(k <= 7 for k in kernel))):
            return (f"{'x'.join(map(str, kernel))} kernel on the CPU: FFT starts winning at larger kernels "
                    "(depthwise 5x5, dense 9x9)")
        return None

    @staticmethod
    def _products(problem) -> list[str]:
        """The products that run ``problem``: ``gemm`` always, ``fgemm`` and ``pointwise`` where they take it."""
        return ["gemm"] + (["fgemm"] if freqmajor.unsupported_reason(problem) is None else []) + \
            (["pointwise"] if pointwise_applies(problem) else [])

    @classmethod
    def _other_products(cls, problem, config) -> bool:
        """Does the ``fgemm`` or ``pointwise`` product run ``problem`` as ``config`` runs it (its phases where
        polyphase; tiles have the problem's channels and groups)?"""
        q = polyphase.Polyphase(problem).inner if config.polyphase else problem
        return len(cls._products(q)) > 1

    def _tiled_configs(self, problem, backend):
        """Overlap-save tilings of a stride-1 problem: the cheapest :data:`KEEP_TILES` tile lengths within
        :data:`TILE_SLACK` of the best untiled size by the cost model, each with its tiles' products."""
        if overlap.applies(problem) is not None:
            return []
        calibration = cost.calibration_for(backend.device_info().key())
        best = min(cost.estimate(problem, s, calibration) for s in fft_sizes.size_candidates(problem))
        scored = []
        for T in overlap.tile_lengths(problem):
            tiling = overlap.Tiling(problem, (T,) * problem.rank)
            estimate = cost.estimate(tiling.inner, tiling.tile, calibration)
            if estimate <= TILE_SLACK * best:
                scored.append((estimate, T, tiling.inner))
        configs = []
        for _, _, inner in sorted(scored)[:KEEP_TILES]:
            configs += [self._fit_chunk(problem, replace(c, tiled=True))
                        for c in self._configs(inner, backend, keep=1, variants=False)]
        return configs

    def _fit_chunk(self, problem, config):
        """``config`` with its batch chunk (in tiles) halved until the workspace is under
        :data:`TILE_WORKSPACE` or the chunk is down to one image or :data:`MIN_TILE_CHUNK` tiles."""
        floor = max(MIN_TILE_CHUNK, overlap.Tiling(problem, config.sizes).M)
        while config.chunk > floor and self.workspace_bytes(problem, config) > TILE_WORKSPACE:
            config = replace(config, chunk=-(-config.chunk // 2))
        return config

    def _configs(self, problem, backend, keep, variants=True):
        calibration = cost.calibration_for(backend.device_info().key())  # the device's own, if measured
        ranked = sorted(fft_sizes.size_candidates(problem), key=lambda s: cost.estimate(problem, s, calibration))
        products = self._products(problem)
        tf32 = problem.math == "tf32"
        configs = [FftConfig(sizes=s, product=prod, chunk=problem.batch, tf32=tf32 and prod in GEMMS)
                   for s in ranked[:keep] for prod in products]
        gpu = backend.name == "cupy"  # (convtune's own transforms below are 2-D: 64x64)
        # cuFFT's JIT callbacks fold the zero-extension and the crop into the transforms (GPU only)
        fused = "fgemm" in products and gpu and callbacks.callbacks_available()
        if fused:
            configs += [FftConfig(sizes=s, product="fgemm", chunk=problem.batch, tf32=tf32, fused=True)
                        for s in ranked[:keep]]
        # no layout change at all: the product is convtune's GEMM kernel on cuFFT's packed layout (GPU only;
        # the kernel's cp.async copies need compute capability 8.0)
        if "fgemm" in products and gpu and packedgemm.packed_available(backend):
            configs += [FftConfig(sizes=s, product="fgemm", chunk=problem.batch, fused=fused, packed=True)
                        for s in ranked[:keep]]
        configs += own_transform_configs(problem, backend, ranked[:keep], products, tf32)
        configs += narrow_variants(problem, configs)  # few channels on one side
        if not variants:
            return configs
        # cuFFT's strided layouts beat the transposes on small transforms (see freqmajor); GPU only
        if "fgemm" in products and gpu:
            configs.append(FftConfig(sizes=ranked[0], product="fgemm", chunk=problem.batch, tf32=tf32, strided=True))
        # chunked variants of the cheapest size, for when whole-batch spectra exceed the budget
        if problem.batch >= 8:
            configs += [FftConfig(sizes=ranked[0], product=prod, chunk=max(1, problem.batch // 8), tf32=tf32)
                        for prod in products if prod in GEMMS]
        return configs

    def workspace_bytes(self, problem, config) -> int:
        module = freqmajor if config.product == "fgemm" else spectral
        phased = polyphase.Polyphase(problem).inner if config.polyphase else problem
        core = phased
        if config.tiled:  # one chunk of whole images' tiles at a time
            tiling = overlap.Tiling(phased, config.sizes)
            core = tiling.inner.replace(batch=overlap.chunk_images(tiling, config.chunk) * tiling.M)
        ws = module.workspace_bytes(core, config.sizes, config.chunk)
        if config.tiled:
            ws = overlap.workspace_bytes(phased, config.sizes, config.chunk, ws)
        return polyphase.workspace_bytes(problem, ws) if config.polyphase else ws

    @staticmethod
    def reads_as_it_lies(config) -> bool:
        """Does ``config``'s executor read and write a half-precision or channels_last problem itself? convtune's
        own transforms do (their kernels load any dtype and strides and store the result rounded to the dtype,
        in the layout); polyphase and tiled forms rearrange their operands in float32 first, and cuFFT's
        transforms read float32 channels-first, so those run between conversions."""
        return config.own and not config.polyphase and not config.tiled

    def reads(self, problem, config=None) -> bool:
        """float32 channels-first, and with convtune's own transforms (:meth:`reads_as_it_lies`) any dtype and
        layout."""
        return super().reads(problem) or (config is not None and self.reads_as_it_lies(config))

    def kernel_builds(self, problem, configs, backend):
        """convtune's own kernels that ``configs`` run, compiled for the current device: the one-pass 64x64
        transforms (one module, about 2 s of NVRTC) and the packed product (its float32 or TF32 kernel). Compiled in
        the first verification instead, they made ResNet-50's first 64x64 candidate (own transforms, packed product)
        take 3.18 s on the verification batch in an fp32 tune on an H100, which the search read as 5,813x the best
        and did not time; :meth:`build` now compiles them (or finds them compiled ahead), so a first run is a run.
        (cuFFT's plans, its callbacks and the narrow product's kernels, one per block shape, are made in the first
        runs as before.)"""
        if getattr(backend, "name", "") != "cupy":
            return []
        builds = []
        for c in configs:
            if c.own:
                builds.append(fft64.compile_kernels)
            if c.packed:
                builds.append(packedgemm.packed_tf32_kernel if c.tf32 else packedgemm.packed_gemm_kernel)
        return list(dict.fromkeys(builds))

    def recordable(self, problem, config) -> bool:
        # the pointwise product: cuFFT plans and convtune's kernels; the GEMM products call cuBLAS
        return config.product == "pointwise"

    def build(self, problem, config, backend):
        check_tf32(problem, config)  # (the combination itself was checked when the configuration was made)
        if config.packed and backend.name != "cupy":
            raise ValueError(f"{config.label()}: the packed product is a CUDA kernel (GPU only)")
        if config.own and backend.name != "cupy":
            raise ValueError(f"{config.label()}: convtune's own transforms are CUDA kernels (GPU only)")
        xp = backend.xp
        for compile_ in self.kernel_builds(problem, [config], backend):
            compile_()  # (once a process: a hit is a dict lookup)

        def core(q):
            return self._executor(xp, q, config)

        def tiled(q):
            reason = overlap.tile_reason(q, config.sizes)
            if reason is not None:
                raise ValueError(f"{config.label()}: {reason}")
            return overlap.TiledConv(xp, q, config.sizes, core, config.chunk)
        make = tiled if config.tiled else core
        if config.polyphase:
            reason = polyphase.applies(problem)
            if reason is not None:
                raise ValueError(f"{config.label()}: {reason}")
            executor = polyphase.PolyphaseConv(xp, problem, make)
        else:
            executor = make(problem)
        shape, layout = problem.result_shape, problem.layout

        def run(a, b, out=None):
            if out is None:  # (a half-precision or channels_last problem's: in its storage or bits, its layout)
                out = precision.empty_in(xp, shape, str(a.dtype), layout)
            with gemm_precision(xp, config.tf32):
                return executor(a, b, out)
        if problem.dtype == "bfloat16" and backend.name == "cupy":  # (own transforms: see reads_as_it_lies)
            # bfloat16 also as its 16 bits (int16 or uint16 arrays: what the PyTorch layer hands over), and the
            # planner times it so
            return Executor(run, timed=_bits_timed(run, problem, xp), reads_bfloat16_bits=True)
        return run

    @staticmethod
    def _executor(xp, problem, config):
        fft_sizes.check_sizes(problem, config.sizes)
        reason = narrow.unsupported_reason(problem.in_per_group, problem.out_per_group, config.chunk) \
            if config.narrow else None
        if reason is not None:  # the problem the product sees: a polyphase form has more channels
            raise ValueError(f"{config.label()}: {reason}")
        if config.product == "fgemm":
            return freqmajor.FreqMajorConv(xp, problem, config.sizes, config.chunk, config.strided, config.fused,
                                           config.packed, config.own, config.narrow, config.tf32)
        return SpectralConv(xp, problem, config.sizes, config.product, config.chunk)


def _bits_timed(run, problem, xp):
    """``timed(a, b, out)`` of a bfloat16 executor that reads 16-bit memory (see :meth:`FftStrategy.executor`):
    ``run`` on the operands' bits, prepared once, into a result of bits: what the PyTorch layer's calls run."""
    layout = problem.layout

    def timed(a, b, out):
        ma, mb = precision.bits_of(xp, a, layout), precision.bits_of(xp, b, layout)
        res = precision.empty_bits(xp, problem.result_shape, layout)
        return lambda: run(ma, mb, res)
    return timed

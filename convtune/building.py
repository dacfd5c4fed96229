"""Plans from decisions, and the checks the planner and the runtime share: a decision's or a configuration's
executor built (:func:`build_plan`, :func:`build_from_config`), one configuration checked against float64 on a
small batch (:func:`check_config`, for a plan carried over from another shape), the choice without timing
(:func:`heuristic_decision`), and the float64 comparison and random operands every check uses."""

from __future__ import annotations

import json
import logging
import math

from . import compiling, precision
from .backend import Backend, get_backend
from .errors import TuningError
from .plan import Decision, Plan
from .problem import ConvProblem
from .strategies import get_strategy
from .strategies.base import Config

log = logging.getLogger("convtune")


def relative_error(xp, out, ref) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN anywhere gives infinity."""
    out64 = out.astype(xp.float64)
    err = float(xp.linalg.norm((out64 - ref).ravel()))
    norm = float(xp.linalg.norm(ref.ravel()))
    if not math.isfinite(err):
        return math.inf
    return err / norm if norm > 0 else err


def random_operands(backend: Backend, problem: ConvProblem, seed: int):
    """Fresh standard-normal operands for the problem's pass (never zeros), as the problem stores them:
    rounded to its dtype, in its layout (:func:`convtune.precision.stored`)."""
    xp = backend.xp
    rng = xp.random.default_rng(seed)
    return tuple(precision.stored(xp, rng.standard_normal(shape, dtype=xp.float32), problem)
                 for shape in problem.operand_shapes)


def failure_reason(backend: Backend, exc: BaseException) -> str:
    if backend.is_out_of_memory(exc):
        return f"out of memory: {exc}"
    return f"{type(exc).__name__}: {exc}"


def build_plan(decision: Decision, backend: Backend | str, source: str | None = None) -> Plan:
    """Build the executor of a decision's winner."""
    backend = get_backend(backend) if isinstance(backend, str) else backend
    return build_from_config(decision.problem, decision.winner.strategy, decision.winner.config, backend,
                             source or decision.source)


def build_from_config(problem: ConvProblem, strategy_name: str, config: dict | Config, backend: Backend,
                      source: str) -> Plan:
    strategy = get_strategy(strategy_name)
    strategy.check(problem, backend)
    cfg = config if isinstance(config, Config) else strategy.config_type.from_dict(config)
    return Plan(problem, strategy.name, cfg, backend.name, source, strategy.executor(problem, cfg, backend))


def compile_ahead(decisions, backend: Backend) -> int:
    """The kernels that building ``decisions``' winners will compile, compiled now, at once, on several threads
    (their strategies' :meth:`~convtune.strategies.base.Strategy.kernel_builds`,
    :func:`convtune.compiling.build_concurrently`): plans read from a cache on a machine whose kernel cache lacks
    their kernels otherwise compile them one after another as they are built (SLaK-T's tune-ahead under AMP spent
    14.2 s building its routes from an empty kernel cache and 2.9 s from a full one, on an H200). Returns how many
    builds failed: each is left to its plan's own build, which says why."""
    builds, failed = [], 0
    for decision in decisions:
        try:
            strategy = get_strategy(decision.winner.strategy)
            config = strategy.config_type.from_dict(decision.winner.config)
            builds += strategy.kernel_builds(decision.problem, [config], backend)
        except Exception as exc:  # (a plan that does not build here: its own build says so)
            log.debug("convtune: nothing compiled ahead for %s: %s: %s", decision.problem.key(), type(exc).__name__,
                      exc)
            failed += 1
    return failed + compiling.build_concurrently(builds, backend)


def check_config(problem: ConvProblem, strategy_name: str, config: dict | Config, backend: Backend,
                 verify_batch: int = 2, seed: int = 0) -> float:
    """Run one configuration on ``problem`` at a small batch against float64 and return its error;
    ``TuningError`` where it misses the math mode's tolerance (a configuration carried over from
    another shape, say)."""
    strategy = get_strategy(strategy_name)
    strategy.check(problem, backend)
    cfg = config if isinstance(config, Config) else strategy.config_type.from_dict(config)
    small = problem.replace(batch=min(problem.batch, verify_batch))
    xp = backend.xp
    a, b = random_operands(backend, small, seed)
    ref = get_strategy("reference").build(small, None, backend)(a.astype(xp.float64), b.astype(xp.float64))
    out = precision.empty_result(xp, small, fill=xp.nan)
    strategy.executor(small, cfg, backend)(a, b, out)
    err = relative_error(xp, out, ref)
    if not err <= problem.tolerance:
        raise TuningError(f"{strategy.describe(cfg)} has error {err:.3g} on {problem.describe()}, over the "
                          f"{problem.math} tolerance {problem.tolerance:g}")
    return err


def heuristic_decision(problem: ConvProblem, backend: Backend) -> tuple[str, Config]:
    """A fast default without timing: PyTorch's own convolution where PyTorch is installed (what a
    PyTorch user had anyway), else FFT for large kernels at stride 1, else im2col."""
    kernel_volume = math.prod(problem.kernel_size)
    names = ["fft", "im2col"] if kernel_volume >= 25 and all(s == 1 for s in problem.stride) else ["im2col", "fft"]
    names.insert(0, "torch")
    for name in names:
        strategy = get_strategy(name)
        if strategy.supports(problem, backend) is None:
            return name, strategy.heuristic_config(problem, backend)
    raise TuningError(f"no strategy supports {problem.describe()}")


#: Configuration fields that count something (samples, threads, rows): whole numbers of at least 1.
_COUNTS = ("chunk", "threads", "rows")


def check_stored_plan(problem_key: str, strategy_name: str, config_text: str) -> None:
    """A plan as a cache or an import stores it, checked as strictly as the runtime will use it: a problem key that
    parses, a registered strategy, a configuration that is a JSON object its strategy reads, with positive counts
    and sizes (``ValueError`` saying what is wrong)."""
    ConvProblem.from_key(problem_key)
    strategy = get_strategy(strategy_name)
    try:
        data = json.loads(config_text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"its configuration is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"its configuration is not a JSON object: {config_text[:80]!r}")
    config = strategy.config_type.from_dict(data)
    for name in _COUNTS:
        value = getattr(config, name, 1)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{strategy.describe(config)}: {name} must be a whole number of at least 1, not {value!r}")
    sizes = getattr(config, "sizes", ())
    if sizes is not None and any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"{strategy.describe(config)}: sizes must be whole numbers of at least 1, not {sizes!r}")

"""The strategy protocol and the one registry of strategies.

A strategy is a family of code paths for a convolution pass. It says whether it
supports a problem (and why not), lists its candidate configurations, estimates
their workspace, and builds an executor for one configuration. Strategies
register themselves at import; names are unique.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

from .. import compiling, precision
from ..errors import UnsupportedProblem
from ..executor import Executor, as_executor
from ..problem import ConvProblem
from ..versioning import REGISTRY as _REGISTRY
from ..versioning import changed_since



@dataclasses.dataclass(frozen=True)
class Config:
    """Base of the per-strategy configurations: frozen, hashable, JSON-able."""

    def as_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "Config":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {sorted(unknown)}; acceptable: {sorted(names)}")
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items()})

    @classmethod
    def from_label(cls, text: str) -> "Config":
        """The configuration whose :meth:`label` is ``text`` (as ``explain`` and logs print it)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values = {}
        for part in filter(None, text.split(",")):
            name, _, value = part.partition("=")
            if name not in fields:
                raise ValueError(f"{cls.__name__} has no field {name!r} (label {text!r})")
            kind = str(fields[name].type)  # annotations are strings here (postponed evaluation)
            if not value:
                values[name] = True
            elif kind.startswith("tuple"):
                values[name] = tuple(int(v) for v in value.split("x"))
            elif kind in ("int", "int | None"):
                values[name] = int(value)
            else:
                values[name] = value
        return cls(**values)

    def label(self) -> str:
        """Readable ``name=value`` list; a boolean field shows as its name when true, not at all when false."""
        def fmt(k, v):
            if isinstance(v, bool):
                return k if v else None
            return f"{k}=" + ("x".join(map(str, v)) if isinstance(v, tuple) else str(v))
        parts = (fmt(f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return ",".join(p for p in parts if p is not None)


class Strategy:
    """Base class of strategies; subclasses set ``name``, ``version`` and ``config_type``."""

    name: ClassVar[str] = ""
    #: Bump when a change alters results or timings, so cached plans are re-tuned.
    version: ClassVar[int] = 1
    #: Never chosen by the planner (the float64 reference).
    selectable: ClassVar[bool] = True
    config_type: ClassVar[type[Config]] = Config
    #: The dtypes and layouts the strategy's executors read and write themselves; other problems run
    #: through float32 channels-first conversions (:meth:`executor`, :func:`convtune.precision.bounded`).
    native_dtypes: ClassVar[tuple[str, ...]] = ("float32",)
    native_layouts: ClassVar[tuple[str, ...]] = ("channels_first",)
    #: Its executor makes its own result (PyTorch's convolution does): an ``out`` given is filled by a
    #: copy, so the planner times it without ``out``, as the PyTorch layer calls it.
    allocates_result: ClassVar[bool] = False
    #: Timed whenever it is correct: neither a slow run on the verification batch nor a spent time budget
    #: rules it out (PyTorch's own convolution, the reference point a tuned plan must not fall behind); only its own
    #: floor can (:meth:`lower_bound`).
    always_timed: ClassVar[bool] = False
    #: Its :meth:`pruned` rules are learned from earlier searches in the process (:meth:`observe`), so a stored
    #: search cannot replay them (``benchmarks/check_rules.py`` replays only its :meth:`fixed_rule`).
    rules_learned: ClassVar[bool] = False
    #: Its plans transform the operands into spectra (the FFT strategies): where one of a layer's per-pass winners
    #: does, a round trip that keeps spectra between the passes may pay (``keep_spectra='auto'``).
    transforms: ClassVar[bool] = False

    def supports(self, problem: ConvProblem, backend) -> str | None:
        """``None`` when the problem can run here, else the reason it cannot."""
        raise NotImplementedError

    def candidates(self, problem: ConvProblem, backend) -> list[Config]:
        raise NotImplementedError

    def workspace_bytes(self, problem: ConvProblem, config: Config) -> int:
        """Bytes of temporary device memory beyond operands and result."""
        raise NotImplementedError

    def pruned(self, problem: ConvProblem, config: Config, backend, room: int | None = None) -> str | None:
        """Why ``config`` cannot win ``problem`` by this strategy's rules (fitted on stored measurements:
        ``benchmarks/check_rules.py`` checks them against any), so that it is not verified or timed;
        ``None``: it is tried. ``room``: the workspace a candidate may have (``None``: no limit). An
        exhaustive search ignores this."""
        return None

    def fixed_rule(self, problem: ConvProblem, config: Config, backend, room: int | None = None) -> str | None:
        """The part of :meth:`pruned` that does not depend on earlier searches in the process, for a strategy whose
        rules are otherwise learned (:attr:`rules_learned`): what ``benchmarks/check_rules.py`` replays of it on
        stored searches. ``None`` by default."""
        return None

    def second_round(self, problem: ConvProblem, config: Config, rank: int) -> str | None:
        """Why ``config`` (``rank``: its place in this strategy's list of candidates) waits for the search's second
        round, or ``None``: it is in the first. The planner first verifies and times the candidates of the first round
        beside the point of reference (an :attr:`always_timed` strategy: PyTorch's call) and runs the second only where
        one of them beats that reference by :data:`convtune.search.FIRST_ROUND_MARGIN`; otherwise the waiting ones
        are recorded ``skipped`` with the first round's figures. Nothing waits by default, and nothing in an exhaustive
        search. A waiting candidate is not asked its workspace until its round comes (that can cost its build)."""
        return None

    def left_out_of_second_round(self, problem: ConvProblem, config: Config, rank: int) -> str | None:
        """Why a candidate that waits for the second round (:meth:`second_round`) is not tried when that round runs:
        the planner records it ``skipped`` with the reason as a rule's (``pruned: ...``), never asking its workspace;
        ``None``: it is tried. Asked only of waiting candidates, where the second round runs (where no first round
        was, with no point of reference, every candidate is tried in one)."""
        return None

    def verified_as_timed(self, problem: ConvProblem, config: Config) -> bool:
        """Is ``config`` (of an :attr:`always_timed` strategy) verified after its timing, with the executor timed, on
        the verification operands zero-extended to the full batch, rather than before it on the verification batch?
        Where its verification would run something else than its timing does (PyTorch's call: cuDNN's heuristic pick,
        built for the verification batch, where the timing runs its search's pick). Such a candidate is timed first,
        and rejected after its timing where it misses the tolerance. ``False`` by default."""
        return False

    def listing_parts(self) -> dict[str, float]:
        """Where this thread's last listing of this strategy's candidates (:meth:`candidates`) spent its time, by part
        (phase name -> seconds), for the planner's account of a search (:attr:`~convtune.plan.Decision.phases`),
        each told once (a second call returns ``{}``). Nothing by default: the listing is one phase."""
        return {}

    def built_elsewhere_s(self, problem: ConvProblem, config: Config) -> float:
        """Seconds spent building ``config``'s plan for ``problem`` outside :meth:`build`: while listing the candidates
        (:meth:`candidates`) or answering :meth:`workspace_bytes`, each told once (a second call returns 0). The planner
        counts them in the candidate's ``build_s``, so that its stored costs hold its whole build, and leaves them out
        of the phase they were spent in. Nothing by default: strategies build in :meth:`build`."""
        return 0.0

    def kernel_builds(self, problem: ConvProblem, configs: list, backend) -> list[Callable[[], object]]:
        """What building ``configs`` for ``problem`` would compile, as calls of no arguments that compile it and
        allocate nothing on the device (their results are dropped; the kernels stay in their caches, so the builds
        that follow find them compiled). Empty by default: nothing to compile."""
        return []

    def prepare(self, problem: ConvProblem, configs: list, backend) -> None:
        """Before the planner verifies ``configs`` (this strategy's candidates for ``problem`` that it will
        build), do at once what their builds would do one after another. By default their :meth:`kernel_builds`
        compiled on several threads (:func:`convtune.compiling.build_concurrently`). A failure here is left to the
        candidate's own build, which the planner records."""
        builds = self.kernel_builds(problem, configs, backend)
        if builds:
            compiling.build_concurrently(builds, backend)

    def verified_at_full_batch(self, problem: ConvProblem, config: Config) -> bool:
        """Is ``config`` costly to build for ``problem`` (a runtime compilation per shape), so that the planner should
        build it once, at the full batch, verify that executor on the verification operands zero-extended along the
        batch (each sample's result is the small batch's; zero samples add nothing to a filter gradient's sum) and
        time that same executor, instead of building it for the verification batch and again for the full one?
        ``False`` by default."""
        return False

    def lower_bound(self, problem: ConvProblem, config: Config, backend, operands, best_s: float,
                    estimate_s: float | None) -> tuple[float, str] | None:
        """Before the planner times ``config`` on the full problem's ``operands`` ``(a, b)``, where the best median so
        far is ``best_s`` and ``estimate_s`` the candidate's warm run on the verification batch scaled to the full
        batch (``None`` where unknown): ``(seconds, why)``, a floor under its median found for less than timing it
        costs, or ``None``. A candidate whose floor is over the best is not timed (not in an exhaustive search).
        ``None`` by default: timing is the measure."""
        return None

    def verification_config(self, config: Config) -> Config:
        """The configuration whose executor the planner verifies on the verification batch, where that is not
        ``config`` itself: one that computes the same within the bound but costs less to set up at a batch that is
        never timed (PyTorch's call without its algorithm search). ``config`` by default."""
        return config

    def observe(self, problem: ConvProblem, outcomes, winner) -> None:
        """Told every candidate's outcome (:class:`~convtune.plan.CandidateOutcome`) and the winner's once a
        search ends, so that rules learned in this process (:meth:`pruned`) can use it. Nothing by default."""

    def heuristic_config(self, problem: ConvProblem, backend) -> Config:
        """A sensible configuration without timing (the first candidate by default)."""
        return self.candidates(problem, backend)[0]

    def build(self, problem: ConvProblem, config: Config, backend) -> Executor | Callable:
        """The :class:`~convtune.executor.Executor` of ``config`` for ``problem`` (of a dtype and layout the
        strategy reads), or a bare ``run(a, b, out=None)`` where it has nothing more to say.

        A GPU executor whose work is launches on the operands as they lie gives its by-address form
        (``launch``), which the PyTorch bridge calls on tensors' memory instead of making array views
        (:class:`~convtune.torch._dispatch.ArrayPlan`); an executor whose calls on the planner's arrays do
        work that the runtime's calls do not gives ``timed``, which the planner times instead (see
        :class:`~convtune.executor.Executor` for every field)."""
        raise NotImplementedError

    def recordable(self, problem: ConvProblem, config: Config) -> bool:
        """Can a CUDA graph record the executor's GPU work (kernel launches, cuFFT work, PyTorch's
        operations record; CuPy refuses cuBLAS calls on a capturing stream)? ``False`` where not known."""
        return False

    def reads(self, problem: ConvProblem, config: Config | None = None) -> bool:
        """Do this strategy's executors (``config``'s, where given) read ``problem``'s dtype and layout themselves?
        Those of :attr:`native_dtypes` and :attr:`native_layouts`; a strategy some of whose configurations read
        more says so here."""
        return problem.dtype in self.native_dtypes and problem.layout in self.native_layouts

    def executor(self, problem: ConvProblem, config: Config, backend) -> Executor:
        """The executor the planner times and plans run: :meth:`build`'s where ``config`` reads the
        problem's dtype and layout, else its float32 channels-first executor between conversions."""
        if self.reads(problem, config):
            return as_executor(self.build(problem, config, backend))
        return precision.bounded(self.build(problem.in_float32(), config, backend), problem, backend.xp)

    def workspace(self, problem: ConvProblem, config: Config) -> int:
        """:meth:`workspace_bytes`, plus the float32 copies of operands and result that conversions make."""
        extra = 0 if self.reads(problem, config) else problem.in_float32().min_bytes()
        return self.workspace_bytes(problem, config) + extra

    def check(self, problem: ConvProblem, backend) -> None:
        """Raise :class:`UnsupportedProblem` unless the problem is supported."""
        reason = self.supports(problem, backend)
        if reason is not None:
            raise UnsupportedProblem(self.name, reason)

    def describe(self, config: Config) -> str:
        return f"{self.name}[{config.label()}]"

    def version_tag(self) -> str:
        """This strategy's part of the cache keys' version string: name and version (a strategy whose
        timings follow an outside library's version adds that version)."""
        return f"{self.name}{self.version}"

    def serves_shape(self, problem: ConvProblem) -> bool:
        """Could this strategy offer candidates for ``problem``'s shape on some backend? Where it could
        not, its version cannot change that problem's plan: a stored plan survives a new version of it
        (:func:`versions_agree`). Say ``True`` unless sure, and keep it so across versions: a version
        that starts serving a shape must answer ``True`` for it."""
        return True

    #: version -> the shapes that version changed (a predicate of the problem); a version not listed here
    #: changed every shape. List a new version only where sure that it leaves the other shapes' plans alone.
    changes: dict = {}

    def changed_since(self, version: int, problem: ConvProblem) -> bool:
        """Could anything between this strategy's ``version`` and the current one change ``problem``'s plan
        (the candidates it offers, what they compute, how fast they run)? Per :attr:`changes`: where each
        version since changed some shapes only, plans of the other shapes survive them
        (:func:`versions_agree`). Any other version (a later one included) has changed everything."""
        return changed_since(self.changes, version, self.version, problem)

    def __repr__(self):
        return f"<strategy {self.name} v{self.version}>"


def register(strategy_cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: instantiate and register a strategy; duplicate names raise."""
    instance = strategy_cls()
    if not instance.name:
        raise ValueError(f"{strategy_cls.__name__} has no name")
    if instance.name in _REGISTRY:
        raise ValueError(f"a strategy named {instance.name!r} is already registered "
                         f"({type(_REGISTRY[instance.name]).__name__})")
    _REGISTRY[instance.name] = instance
    return strategy_cls


def unregister(name: str) -> None:
    """Remove a strategy (for tests and plug-ins)."""
    get_strategy(name)
    del _REGISTRY[name]


def get_strategy(name: str) -> Strategy:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; registered strategies: "
                         f"{', '.join(sorted(_REGISTRY))}") from None


def all_strategies(selectable_only: bool = False) -> list[Strategy]:
    return [s for s in _REGISTRY.values() if s.selectable or not selectable_only]


def check_tf32(problem: ConvProblem, config: Config) -> None:
    """A configuration with ``tf32=True`` (TF32 tensor cores) is valid only for a ``tf32``-mode problem."""
    if getattr(config, "tf32", False) and problem.math != "tf32":
        raise ValueError(f"{config.label()} uses TF32 tensor cores: only for math mode 'tf32', "
                         f"not {problem.math!r}")

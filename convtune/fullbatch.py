"""The planner's full-batch check of a filter gradient's fastest candidates (:mod:`convtune.planner`, step 5): the
filter gradient sums over the batch, so its error grows with it, and a candidate verified on a smaller batch is
checked again on the full one."""

from __future__ import annotations

import logging
import math
import time

from . import precision
from .building import failure_reason, random_operands, relative_error
from .search import Search, with_
from .strategies import get_strategy

log = logging.getLogger("convtune")


def confirm_full_batch(s: Search, timed, backend, verify_batch: int, seed: int, report) -> list:
    """``s``'s timed outcomes ``timed``, fastest first, from the first one whose full-batch error is within tolerance
    (wgrad only, when verification used a smaller batch than ``verify_batch``); the ones ahead of it become
    ``rejected`` in ``s.outcomes``. ``seed``: the planner's (its timing operands' is ``seed + 1``); ``report``: its
    progress callback."""
    problem, outcomes = s.problem, s.outcomes
    ranked = sorted(timed, key=lambda o: o.timing.median_s if o.timing else 0.0)
    if problem.pass_ != "wgrad" or problem.batch <= verify_batch or not ranked:
        return ranked
    xp = backend.xp
    started = time.perf_counter()
    try:
        a, b = s.full_operands or random_operands(backend, problem, seed + 1)
        ref = get_strategy("reference").build(problem, None, backend)(a.astype(xp.float64),
                                                                            b.astype(xp.float64))
    except Exception as exc:  # e.g. the float64 reference does not fit: keep the verification's word
        log.warning("full-batch check of %s skipped: %s", problem.key(), failure_reason(backend, exc))
        return ranked
    try:
        for i, outcome in enumerate(ranked):
            report(f"check {outcome.label} at the full batch")
            try:
                out = precision.empty_result(xp, problem, fill=xp.nan)
                strategy = get_strategy(outcome.strategy)
                config = strategy.config_type.from_dict(outcome.config)
                strategy.executor(problem, config, backend)(a, b, out)
                err = relative_error(xp, out, ref)
            except Exception as exc:
                err, failure = math.inf, failure_reason(backend, exc)
            else:
                failure = None
            index = next(k for k, o in enumerate(outcomes) if o is outcome)
            if err <= problem.tolerance:
                ranked[i] = outcomes[index] = with_(outcome, error=err)
                return ranked[i:]
            outcomes[index] = with_(outcome, status="failed" if failure else "rejected",
                                    error=None if failure else err, reason=failure or (
                                        f"error {err:.3g} on the full batch of {problem.batch} is over the "
                                        f"{problem.math} tolerance {problem.tolerance:g} (the filter gradient "
                                        "sums over the batch; the verification batch passed)"))
        return []
    finally:
        s.phase("the full-batch check", time.perf_counter() - started)

"""Strategy versions, the part of every plan's cache key that says which code made it.

Each strategy has a version (bumped when a change alters its results or timings) and may say which shapes a
version changed (:attr:`convtune.strategies.Strategy.changes`) and which shapes it serves at all
(:meth:`~convtune.strategies.Strategy.serves_shape`). The registry of strategies lives here, at the bottom of
the package, so that the plan cache can key and match plans by their versions without importing a strategy:
:func:`strategy_versions` is the canonical string stored with each plan, :func:`versions_agree` says whether a
plan stored under another string still holds.
"""

from __future__ import annotations

import re

from .problem import ConvProblem


def _every_shape(problem: ConvProblem) -> bool:
    return True


def no_shape(problem: ConvProblem) -> bool:
    """A version's entry in :attr:`~convtune.strategies.Strategy.changes` where it changed no shape's plan (what
    its kernels compute and how fast they run stayed; the host's work changed, which a duel against PyTorch's call
    weighs: :func:`convtune.torch._duel.duel_conditions` names the version, so those are measured again)."""
    return False


def changed_since(changes: dict, version: int, current: int, problem: ConvProblem) -> bool:
    """Could anything between ``version`` and ``current`` change what is stored for ``problem``? ``changes``:
    version -> the shapes it changed (a predicate); a version not listed changed every shape, and a version
    newer than ``current`` is not this code's (a strategy's :attr:`Strategy.changes`, the round trip's
    :data:`convtune.roundtrip.CHANGES`)."""
    if version >= current:
        return version != current
    return any(changes.get(v, _every_shape)(problem) for v in range(version + 1, current + 1))


#: Every registered strategy by name (:func:`convtune.strategies.register` fills it).
REGISTRY: dict = {}


def strategy_versions() -> str:
    """Canonical string of every selectable strategy's version, for cache keys."""
    return ",".join(s.version_tag() for s in sorted((s for s in REGISTRY.values() if s.selectable), key=lambda s: s.name))


_TAG = re.compile(r"^(.*?)(\d+(?:@.*)?)$")  # name, then version (and an outside library's version)


def _tags_by_name(versions: str) -> dict[str, str]:
    """A versions string's tags by strategy name (``im2col2`` -> ``im2col``, ``torch1@2.11.0`` -> ``torch``)."""
    out = {}
    for tag in filter(None, versions.split(",")):
        match = _TAG.match(tag)
        out[match.group(1) if match else tag] = tag
    return out


def versions_agree(stored: str, problem: ConvProblem, winner: str, current: str | None = None) -> bool:
    """Does a plan stored under the versions string ``stored``, won by strategy ``winner``, hold under the
    ``current`` one (default: this convtune's)? Where they differ only in strategies that cannot serve
    ``problem``'s shape (:meth:`Strategy.serves_shape`; a strategy no longer registered serves nothing)
    and the winner's own version is unchanged, the search would offer the same candidates: yes. So a new
    version of the depthwise kernels does not send every dense layer's plan back to tuning. Likewise where a
    strategy's newer version changed other shapes only (:meth:`Strategy.changed_since`)."""
    current = strategy_versions() if current is None else current
    if stored == current:
        return True
    if winner not in REGISTRY:  # a plan of a strategy this convtune no longer has cannot be built
        return False
    old, new = _tags_by_name(stored), _tags_by_name(current)
    for name in set(old) | set(new):
        if old.get(name) == new.get(name):
            continue
        if not (name == winner or (name in REGISTRY and REGISTRY[name].serves_shape(problem))):
            continue
        if not _changed(name, old.get(name), new.get(name), problem):
            continue
        return False
    return True


def _changed(name: str, old_tag: str | None, new_tag: str | None, problem: ConvProblem) -> bool:
    """Do a strategy's stored and current tags differ in a way that can change ``problem``'s plan? Only a
    registered strategy's versions (with the same outside library's version beside them, if any), the
    current one new, whose changes since the stored one leave this shape alone
    (:meth:`Strategy.changed_since`) do not."""
    strategy = REGISTRY.get(name)
    if strategy is None or old_tag is None or new_tag != strategy.version_tag():
        return True
    old_version, _, old_library = old_tag[len(name):].partition("@")
    new_library = new_tag[len(name):].partition("@")[2]
    if old_library != new_library:
        return True
    return not old_version.isdigit() or strategy.changed_since(int(old_version), problem)

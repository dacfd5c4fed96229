"""The examples in convtune's docstrings run as written (two had drifted from the code before they were run here)."""

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import convtune

ROOT = Path(convtune.__file__).resolve().parent


def _modules_with_examples() -> list[str]:
    names = []
    for info in pkgutil.walk_packages([str(ROOT)], "convtune."):
        path = ROOT.joinpath(*info.name.split(".")[1:])
        source = path / "__init__.py" if info.ispkg else path.with_suffix(".py")
        if source.is_file() and ">>> " in source.read_text(encoding="utf-8"):
            names.append(info.name)
    return sorted(names)


MODULES = _modules_with_examples()


def test_the_examples_are_found():
    assert len(MODULES) >= 20 and "convtune.roundtrip.ledger" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    if name.startswith("convtune.torch"):
        pytest.importorskip("torch")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} example(s) in {name} failed (output above)"

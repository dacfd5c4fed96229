"""The house stays legible: no import circle between convtune's modules (function-level imports included), and no
module whose own code (CUDA sources left aside) runs past 600 lines. The layers themselves are import-linter's
contracts in pyproject.toml, which the test command checks."""

import ast
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")

PACKAGE = Path(__file__).resolve().parent.parent / "convtune"
MOST_LINES = 600


def _cycle(graph, modules):
    """One import circle among ``modules`` (a list of module names), or ``None``."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.find_modules_directly_imported_by(m)):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        state[m] = "done"
        stack.pop()
        return None
    for m in sorted(modules):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_module_imports_another_in_a_circle():
    graph = grimp.build_graph("convtune", cache_dir=None)
    found = _cycle(graph, graph.modules)
    assert found is None, "import circle: " + " -> ".join(found)


def test_the_circle_check_finds_a_circle():
    class Graph:
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}

        def find_modules_directly_imported_by(self, m):
            return self.edges[m]
    assert _cycle(Graph(), ["d", "a"]) == ["a", "b", "c", "a"]
    Graph.edges["c"] = set()
    assert _cycle(Graph(), ["d", "a"]) is None


def _own_lines(path: Path) -> int:
    """Lines of a module that are not CUDA source (string literals holding __global__ or __device__ code)."""
    text = path.read_text()
    cuda = sum(node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(text))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)
               and ("__global__" in node.value or "__device__" in node.value))
    return text.count("\n") - cuda


def test_no_module_runs_past_its_size():
    big = {str(p.relative_to(PACKAGE.parent)): n for p in sorted(PACKAGE.rglob("*.py"))
           if (n := _own_lines(p)) > MOST_LINES}
    assert not big, f"modules over {MOST_LINES} lines of their own code: {big}"

"""The package's layout: no import cycle between trustlens' modules, no module over MAX_LINES lines,
and the root holds only entry points.

Every import statement counts, at module level, inside a function (a lazy import only hides a
cycle) or under `if TYPE_CHECKING:` (a cycle of types is one of design). `from a.b import c` is an
edge to `a.b.c` when that is a module, else to `a.b`. Every module of trustlens/ and app/ is at most
MAX_LINES lines long.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "trustlens"
MAX_LINES = 400  # the longest a module of trustlens/ or app/ may be, in lines
ROOT_MODULES = {"__init__.py", "cli.py", "dashboard.py", "metrics.py", "notebook.py", "paths.py"}


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The trustlens modules that `name` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    # Importing a.b.c first runs the packages a and a.b: an edge to each, unless `name` is inside
    # that package already (then it is initialised before `name` runs).
    for target in list(found):
        parts = target.split(".")
        for n in range(1, len(parts)):
            ancestor = ".".join(parts[:n])
            if not (name == ancestor or name.startswith(ancestor + ".")):
                found.add(ancestor)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    return {name: imports_of(name, path, set(names)) for name, path in names.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_graph_sees_known_edges():
    graph = import_graph()
    assert "trustlens.record.recorder" in graph["trustlens.record.null"]
    assert "trustlens.rules.decision" in graph["trustlens.rules"]
    assert "trustlens.core.torch_import" in graph["trustlens.divergence.measures"]


def test_cycles_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_an_import_under_type_checking_is_an_edge(tmp_path):
    # a cycle whose one edge is an import for types only (engine_defects named Rollout so)
    defects = tmp_path / "engine_defects.py"
    defects.write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.rollout import Rollout\n")
    rollout = tmp_path / "rollout.py"
    rollout.write_text("from pkg.engine_defects import check_defect\n")
    modules = {"pkg.engine_defects", "pkg.rollout"}
    graph = {
        "pkg.engine_defects": imports_of("pkg.engine_defects", defects, modules),
        "pkg.rollout": imports_of("pkg.rollout", rollout, modules),
    }
    assert graph == {"pkg.engine_defects": {"pkg.rollout"}, "pkg.rollout": {"pkg.engine_defects"}}
    assert cycles(graph) == [["pkg.engine_defects", "pkg.rollout"]]


def test_every_module_is_at_most_max_lines():
    paths = [*PACKAGE.rglob("*.py"), *(REPO / "app").rglob("*.py")]
    lengths = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in paths}
    assert len(lengths) > 100
    assert {p: n for p, n in lengths.items() if n > MAX_LINES} == {}


def test_the_root_holds_only_entry_points():
    root = {p.name for p in PACKAGE.glob("*.py")}
    assert root == ROOT_MODULES


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("trustlens.loss", "trustlens.rules.loss"),
        ("trustlens.recorder", "trustlens.record"),
        ("trustlens.render", "trustlens.core.render"),
        ("trustlens.rule_columns", "trustlens.rules.columns"),
        ("trustlens.analysis.alert_config", "trustlens.analysis.collapse.config"),
        ("trustlens.analysis.alert_levels", "trustlens.analysis.collapse.levels"),
        ("trustlens.analysis.alert_steps", "trustlens.analysis.collapse.steps"),
        ("trustlens.analysis.drivers", "trustlens.analysis.collapse.drivers"),
        ("trustlens.analysis.onset", "trustlens.analysis.collapse.onset"),
        ("trustlens.analysis.signals", "trustlens.analysis.collapse.signals"),
        ("trustlens.analysis.timeline", "trustlens.analysis.collapse.timeline"),
    ],
)
def test_documented_old_paths_still_import(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new):
        moved = importlib.import_module(old)
    assert moved is importlib.import_module(new)


def test_every_public_name_resolves():
    import trustlens

    for name in trustlens.__all__:
        assert getattr(trustlens, name) is not None, name

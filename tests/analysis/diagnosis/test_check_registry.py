"""The doctor's check registry (trustlens.analysis.diagnosis.registry) is the only place the checks
are listed: every `@check` in the code is registered, no other module writes a collection of check
names, and docs/doctor.md's table of checks names exactly the registered ones."""

import ast
import re
from pathlib import Path

import pytest

from trustlens.analysis import diagnosis
from trustlens.analysis.diagnosis import registry

ROOT = Path(__file__).resolve().parents[3]
SOURCES = sorted([*(ROOT / "trustlens").rglob("*.py"), *(ROOT / "app").rglob("*.py")])


def _decorated_checks(tree: ast.AST) -> list[str]:
    """The names given to `@check("name", ...)` in a module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                if (
                    isinstance(deco, ast.Call)
                    and getattr(deco.func, "id", getattr(deco.func, "attr", None)) == "check"
                    and deco.args
                    and isinstance(deco.args[0], ast.Constant)
                ):
                    found.append(deco.args[0].value)
    return found


def test_every_decorated_check_is_registered():
    decorated = {}
    for path in SOURCES:
        for name in _decorated_checks(ast.parse(path.read_text())):
            decorated[name] = path.relative_to(ROOT)
    assert decorated, "no @check found"
    assert set(decorated) == set(registry.names()), decorated


def test_no_module_but_the_registry_lists_check_names():
    checks = set(registry.names())
    listing = []
    for path in SOURCES:
        if path.name == "registry.py" and path.parent.name == "diagnosis":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
            if not isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict) or not items:
                continue
            values = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
            if len(values) >= 2 and len(values) == len(items) and set(values) <= checks:
                listing.append(f"{path.relative_to(ROOT)}:{node.lineno} {values}")
    assert listing == []


def test_docs_table_names_the_registered_checks():
    text = (ROOT / "docs" / "doctor.md").read_text()
    table = text.split("## The checks", 1)[1].split("\n## ", 1)[0]
    named = {m.group(1) for m in re.finditer(r"^\| `([a-z_]+)`", table, re.M)}
    assert named == set(registry.names())


def test_views_and_order_follow_the_registry():
    assert registry.names() == diagnosis.CHECKS
    assert registry.names(kind="cause") == diagnosis.CAUSES
    assert registry.names(kind="symptom") == diagnosis.SYMPTOMS
    assert diagnosis.CHECKS[: len(diagnosis.CAUSES)] == diagnosis.CAUSES  # causes first
    assert set(registry.names(cadence="early")) <= set(diagnosis.CAUSES)


def test_a_new_check_is_one_decorated_function(tmp_path):
    from benchmark_scripts import load

    bench = load("doctor_detection")
    path = bench.write_planted(tmp_path / "clean", "clean", 1)

    @registry.check("probe", kind="symptom", cadence="every", order=99)
    def probe(inp):
        return diagnosis.Finding("probe", "warning", f"{inp.name}: a probe")

    try:
        found = {f.check: f.verdict for f in diagnosis.doctor(path)}
        assert found["probe"] == "warning" and "probe" in diagnosis.CHECKS
        assert [f.check for f in diagnosis.doctor(path, ["probe"])] == ["probe"]
        with pytest.raises(ValueError, match="registered already"):
            registry.check("probe", kind="symptom", cadence="every", order=99)(lambda inp: None)
    finally:
        registry._CHECKS.pop("probe")
    with pytest.raises(ValueError, match="kind must be one of cause, symptom"):
        registry.check("x", kind="bad", cadence="every", order=1)
    with pytest.raises(ValueError, match="doctor check must be one of"):
        registry.get("nope")

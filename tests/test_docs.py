"""Every document a message, a --help text, a docstring or a doc points to is in the repo: no
reference to a file that users do not have (the design document lives outside the repo)."""

import re
from pathlib import Path

import pytest

from trustlens.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parent.parent
# what users get: the package, the app, the docs, the examples, the notebooks' sources, benchmarks
SOURCES = sorted(
    [
        *ROOT.glob("trustlens/**/*.py"),
        *ROOT.glob("app/**/*.py"),
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("examples/*.py"),
        *ROOT.glob("notebooks/src/*.py"),
        *ROOT.glob("benchmarks/*.py"),
        ROOT / "README.md",
    ]
)
# a path into the repo's docs, data, examples, notebooks or benchmarks, as prose writes it
REFERENCE = re.compile(r"\b((?:docs|examples|notebooks|benchmarks)/[\w./-]*\w)")


def references(text: str) -> set[str]:
    return {m.rstrip(".") for m in REFERENCE.findall(text)}


def test_references_resolve():
    missing, found = {}, set()
    for source in SOURCES:
        refs = references(source.read_text(encoding="utf-8"))
        found |= refs
        bad = sorted(ref for ref in refs if not (ROOT / ref).exists())
        if bad:
            missing[str(source.relative_to(ROOT))] = bad
    assert missing == {}
    assert {"docs/rules.md", "docs/run-format.md", "docs/dashboard.md", "docs/attach.md"} <= found


def test_nothing_points_to_the_design_document():
    named = [str(s.relative_to(ROOT)) for s in SOURCES if "DESIGN" in s.read_text(encoding="utf-8")]
    assert named == []


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_text_points_only_to_docs_in_the_repo(command):
    parser = build_parser(command)
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    text = sub.format_help()
    assert "DESIGN" not in text
    assert all((ROOT / ref).exists() for ref in references(text)), references(text)

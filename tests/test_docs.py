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


# ---------------------------------------------------------------- the Python blocks of the docs

# `<!-- not run: REASON -->` on the line before a ```python block: the block cannot run here
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\n```python\n")
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# the run folders the blocks read, each a copy of the shipped sample's learning run
RUN_NAMES = ("runs/demo", "runs/exp1", "RUN")


def _blocks() -> list[tuple[str, str, str | None]]:
    """(where, code, reason it is not run or None) of every ```python block of README and docs."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        reasons = {m.end(): m.group(1) for m in NOT_RUN.finditer(text)}
        for m in BLOCK.finditer(text):
            line = text[: m.start()].count("\n") + 1
            found.append((f"{doc.relative_to(ROOT)}:{line}", m.group(1), reasons.get(m.start() + len("```python\n"))))
    return found


BLOCKS = _blocks()


def test_every_not_run_marker_stands_before_a_python_block_and_says_why():
    markers = sum(len(NOT_RUN.findall(doc.read_text(encoding="utf-8"))) for doc in DOCS)
    assert markers == sum(reason is not None for *_, reason in BLOCKS) > 0
    assert all(len(reason) > 20 for *_, reason in BLOCKS if reason is not None)
    assert "<!-- not run" not in "".join(NOT_RUN.sub("", doc.read_text(encoding="utf-8")) for doc in DOCS)


@pytest.fixture(scope="module")
def runs_here(tmp_path_factory):
    """A folder holding RUN_NAMES, each the shipped learning run."""
    import shutil

    here = tmp_path_factory.mktemp("doc_blocks")
    for name in RUN_NAMES:
        shutil.copytree(ROOT / "data" / "sample_run" / "learning", here / name)
    return here


@pytest.mark.parametrize(("where", "code"), [(w, c) for w, c, reason in BLOCKS if reason is None])
def test_python_block_runs(where, code, runs_here, monkeypatch, capsys):
    """Each block the docs do not mark runs as written, in a folder holding the runs it reads."""
    monkeypatch.chdir(runs_here)
    exec(compile(code, where, "exec"), {"__name__": "__doc_block__"})

"""Build the notebooks from their sources, execute them and save them with their outputs.

    python notebooks/build.py            # every notebook
    python notebooks/build.py 02 03      # the ones whose name starts with these prefixes
    python notebooks/build.py --check    # exit 1 if a committed notebook's cells differ from its source

Each notebook's source is `notebooks/src/<name>.py` in the "percent" format: a line starting with
`# %%` opens a code cell, `# %% [markdown]` a text cell whose lines are written as `# ...`
comments. The notebook is executed top to bottom with nbclient on a fresh kernel of this Python,
in the notebooks/ folder, and written to `notebooks/<name>.ipynb` only when every cell ran.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
CELL_MARK = "# %%"
MARKDOWN_MARK = "# %% [markdown]"
# Seconds one cell may run before the build (and tests/test_notebooks.py) gives up.
CELL_TIMEOUT = 300
KERNEL = "python3"


def sources() -> list[Path]:
    """The notebook sources, in name order."""
    return sorted(SOURCES.glob("[0-9]*.py"))


def _markdown(lines: list[str]) -> str:
    out = []
    for line in lines:
        if line.strip() in ("", "#"):
            out.append("")
        elif line.startswith("# "):
            out.append(line[2:])
        else:
            raise ValueError(f"markdown line does not start with '# ': {line!r}")
    return "\n".join(out).strip("\n")


def parse(source: Path) -> nbformat.NotebookNode:
    """The notebook (cells only, no outputs) written in `source`."""
    cells: list[tuple[str, list[str]]] = []
    for line in source.read_text(encoding="utf-8").splitlines():
        if line.startswith(CELL_MARK):
            rest = line[len(CELL_MARK):].strip()
            if rest not in ("", "[markdown]"):
                raise ValueError(f"{source}: unknown cell marker {line!r}")
            cells.append(("markdown" if line.startswith(MARKDOWN_MARK) else "code", []))
        elif cells:
            cells[-1][1].append(line)
        elif line.strip() and not line.startswith("#"):
            raise ValueError(f"{source}: code before the first cell marker: {line!r}")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL, "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for kind, lines in cells:
        if kind == "markdown":
            nb.cells.append(nbformat.v4.new_markdown_cell(_markdown(lines)))
        else:
            nb.cells.append(nbformat.v4.new_code_cell("\n".join(lines).strip("\n")))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nb


def execute(nb: nbformat.NotebookNode, *, timeout: int = CELL_TIMEOUT) -> nbformat.NotebookNode:
    """Run every cell of `nb` on a fresh kernel in notebooks/; raises on the first failing cell."""
    NotebookClient(nb, timeout=timeout, kernel_name=KERNEL, record_timing=False, resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def _cells(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def check() -> int:
    """1 when a committed notebook is missing or its cells differ from its source, else 0."""
    stale = []
    for src in sources():
        target = HERE / f"{src.stem}.ipynb"
        if not target.exists() or _cells(nbformat.read(target, as_version=4)) != _cells(parse(src)):
            stale.append(target.name)
    for name in stale:
        print(f"{name} is out of date: run python notebooks/build.py {name[:2]}")
    return 1 if stale else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("only", nargs="*", help="name prefixes of the notebooks to build (default: all)")
    parser.add_argument("--check", action="store_true", help="only compare the committed notebooks with their sources")
    args = parser.parse_args(argv)
    if args.check:
        return check()
    chosen = [s for s in sources() if not args.only or any(s.stem.startswith(p) for p in args.only)]
    if not chosen:
        print(f"no notebook source matches {args.only} in {SOURCES}")
        return 1
    for src in chosen:
        start = time.perf_counter()
        nb = execute(parse(src))
        target = HERE / f"{src.stem}.ipynb"
        nbformat.write(nb, target)
        print(f"{target.name}: {time.perf_counter() - start:.0f} s, {target.stat().st_size / 1e3:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

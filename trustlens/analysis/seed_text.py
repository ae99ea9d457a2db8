"""The seed table (`trustlens.analysis.seeds.seed_table`) as terminal text: what `trustlens
compare` prints and the claims report holds. Columns are laid out in blocks no wider than
`width` characters (each block repeats the first column), and a legend below says what each
column is, one line each, wrapped to the same width.
"""

from __future__ import annotations

import textwrap

import polars as pl

from trustlens.analysis.seeds import OUTCOMES, format_mean_se

# column -> what it holds (trustlens.analysis.seeds documents how each is measured)
COLUMN_NOTES: dict[str, str] = {
    "n": "runs of the rule (one per seed)",
    "collapsed": "runs that collapsed, of n: accuracy below half the first evaluation, or the trailing mean reward "
    "below half the first steps'",
    "within_noise": "runs whose final accuracy level is within evaluation noise of their best level, of n",
    "acc_start": "held-out accuracy at the first evaluation",
    "acc_final": "held-out accuracy at the last evaluation",
    "acc_best": "the highest evaluation",
    "acc_lowest": "the lowest evaluation",
    "acc_drop": "best accuracy level minus the final level, a level being the mean of w ≥ 3 consecutive "
    "evaluations (10% of them); – for runs of 3 evaluations or fewer, which have one level: compare "
    "acc_final with acc_start there",
    "steps_to_collapse": "steps from the first to the collapse, over the runs that collapsed",
    "block_rate": "share of the A ≠ 0 tokens the run's active rule blocked",
    "block_rate_low_mu": "the same among A ≠ 0 tokens with μ < 0.1",
    "k3_start": "k3 KL of μ vs π_old (nats), mean over the first 10% of the steps",
    "k3_end": "the same over the last 10% of the steps",
    "tv_start": "mean |π_old − μ| (the binary TV), first 10% of the steps",
    "tv_end": "the same over the last 10% of the steps",
}


def format_seed_table(table: pl.DataFrame, by: str = "rule", width: int = 120) -> str:
    """The seed table as aligned text in blocks of columns at most `width` characters wide (a
    column wider than that alone in its block), then a legend of every column: cells are mean ±
    standard error over seeds; counts are `k/n`."""
    head = [by, "n", "collapsed", "within_noise", *OUTCOMES]
    rows = [head]
    for row in table.iter_rows(named=True):
        cells = [str(row[by]), str(row["n"]), f"{row['collapsed']}/{row['n']}", f"{row['within_noise']}/{row['n']}"]
        cells += [format_mean_se(row[f"{n}_mean"], row[f"{n}_se"]) for n in OUTCOMES]
        rows.append(cells)
    widths = [max(len(line[i]) for line in rows) for i in range(len(head))]
    blocks: list[list[int]] = []
    for i in range(1, len(head)):
        used = widths[0] + sum(2 + widths[j] for j in blocks[-1]) if blocks else width
        if used + 2 + widths[i] > width:
            blocks.append([])
        blocks[-1].append(i)
    text = [
        "\n".join("  ".join(line[j].ljust(widths[j]) for j in [0, *block]).rstrip() for line in rows)
        for block in blocks
    ]
    return "\n\n".join([*text, legend(by, width)])


def legend(by: str = "rule", width: int = 120) -> str:
    """One line per column of the seed table (wrapped to `width`), after what a cell holds."""
    name = max(len(c) for c in [by, *COLUMN_NOTES])
    lines = ["cells: mean ± standard error over seeds (– where no run has a value)"]
    first = "the trust-region rule the runs trained under" if by == "rule" else f"the runs' {by}"
    for column, note in {by: first, **COLUMN_NOTES}.items():
        lines += textwrap.wrap(note, width, initial_indent=column.ljust(name + 2), subsequent_indent=" " * (name + 2))
    return "\n".join(lines)


__all__ = ["COLUMN_NOTES", "format_seed_table", "legend"]

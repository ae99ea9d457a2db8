"""The seed table as text: blocks no wider than the terminal width, a legend line per column."""

import polars as pl

from trustlens.analysis.seed_text import COLUMN_NOTES, format_seed_table, legend
from trustlens.analysis.seeds import OUTCOME_SCHEMA, OUTCOMES, seed_table


def _table() -> pl.DataFrame:
    rows = []
    for rule, base in (("dppo_binary_tv_recompute", 0.4), ("pg_is", 0.2)):
        for seed in (0, 1, 2):
            row = dict.fromkeys(OUTCOME_SCHEMA)
            row |= {k: base + 0.01 * seed for k in OUTCOMES}
            row |= {"run": f"{rule}-{seed}", "rule": rule, "seed": seed, "within_noise": True, "acc_drop": None}
            rows.append(row)
    return seed_table(pl.DataFrame(rows, schema=OUTCOME_SCHEMA))


def test_every_line_fits_120_columns_and_every_column_is_shown_once():
    text = format_seed_table(_table())
    assert max(len(line) for line in text.splitlines()) <= 120
    tables = text.split("\ncells: ")[0]
    heads = [block.splitlines()[0].split() for block in tables.strip().split("\n\n")]
    assert len(heads) > 1 and all(head[0] == "rule" for head in heads)  # each block repeats the rule
    shown = [c for head in heads for c in head[1:]]
    assert shown == ["n", "collapsed", "within_noise", *OUTCOMES]
    # each block: the header and one line per rule, the rule first
    for block in tables.strip().split("\n\n"):
        assert [line.split()[0] for line in block.splitlines()[1:]] == ["dppo_binary_tv_recompute", "pg_is"]
    assert "0.410 ± 0.006" in text  # acc_start of dppo_binary_tv_recompute: 0.40, 0.41, 0.42
    assert "3/3" in text


def test_the_legend_explains_every_column_and_acc_drops_dash():
    assert set(COLUMN_NOTES) == {"n", "collapsed", "within_noise", *OUTCOMES}
    text = legend(width=120)
    starts = [line.split()[0] for line in text.splitlines()[1:] if not line.startswith(" ")]
    assert starts == ["rule", "n", "collapsed", "within_noise", *OUTCOMES]
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "– for runs of 3 evaluations or fewer" in " ".join(text.split())
    row = [line for line in format_seed_table(_table()).splitlines() if line.startswith("pg_is") and "–" in line]
    assert row  # acc_drop has no value in any run: shown as –


def test_a_narrow_width_gives_one_column_a_block():
    text = format_seed_table(_table(), width=40)
    tables = text.split("\ncells: ")[0].strip().split("\n\n")
    assert len(tables) == 2 + len(OUTCOMES)  # n with collapsed, within_noise, then one outcome each

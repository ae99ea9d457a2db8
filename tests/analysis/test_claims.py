import polars as pl

from trustlens.analysis.claims import alert_leads, outcome_rows
from trustlens.analysis.seeds import OUTCOME_SCHEMA


def _outcomes() -> pl.DataFrame:
    """Three hand-made runs: pg_is seeds 1 and 0 collapse (warned 12 steps ahead; warned late),
    dppo_binary_tv seed 0 does not but has a critical alert."""
    rows = [
        dict(
            rule="pg_is",
            seed=1,
            acc_final=0.1,
            acc_lowest=0.05,
            collapse_step=100,
            collapse_cause="accuracy",
            first_critical=88,
            lead=12,
        ),
        dict(rule="dppo_binary_tv", seed=0, acc_final=0.4, acc_lowest=0.3, first_critical=90),
        dict(
            rule="pg_is",
            seed=0,
            acc_final=0.2,
            acc_lowest=0.2,
            collapse_step=50,
            collapse_cause="reward",
            first_critical=60,
            lead=-10,
        ),
    ]
    base = {**dict.fromkeys(OUTCOME_SCHEMA), "acc_start": 0.436, "acc_best": 0.45}
    return pl.DataFrame([{**base, **r, "run": f"{r['rule']}-seed{r['seed']}"} for r in rows], schema=OUTCOME_SCHEMA)


def test_alert_leads_counts_warned_collapses_and_false_alarms():
    assert alert_leads(_outcomes()) == (
        "1/2 collapsing runs had a critical alert before the collapse (lead in steps: 12, -10; "
        "mean 1.000 ± 11.000 (n=2)); 1/1 runs that did not collapse had a critical alert"
    )


def test_outcome_rows_one_row_per_run_by_rule_then_seed():
    rows = outcome_rows(_outcomes())
    assert rows[0].startswith("| rule | seed | start | final | lowest | best | collapse at step |")
    assert rows[2:] == [
        "| pg_is | 0 | 0.436 | 0.200 | 0.200 | 0.450 | 50 (reward) | 60 | -10 |",
        "| pg_is | 1 | 0.436 | 0.100 | 0.050 | 0.450 | 100 (accuracy) | 88 | 12 |",
        "| dppo_binary_tv | 0 | 0.436 | 0.400 | 0.300 | 0.450 | – | 90 | – |",
    ]

import polars as pl

from trustlens.analysis.claims_text import alert_leads, outcome_rows
from trustlens.analysis.seeds import OUTCOME_SCHEMA


def _outcomes() -> pl.DataFrame:
    """Three hand-made runs: pg_is seeds 1 and 0 collapse (warned 12 steps ahead; warned late),
    dppo_binary_tv seed 0 does not but has a critical alert."""
    names = ("rule", "seed", "acc_final", "acc_lowest", "collapse_step", "collapse_cause", "first_critical", "lead")
    rows = [
        ("pg_is", 1, 0.1, 0.05, 100, "accuracy", 88, 12),
        ("dppo_binary_tv", 0, 0.4, 0.3, None, None, 90, None),
        ("pg_is", 0, 0.2, 0.2, 50, "reward", 60, -10),
    ]
    kinds = {88: "accuracy_drop", 90: "reward_drop", 60: "reward_drop"}
    drops = {"pg_is": (0.3, 0.04, False), "dppo_binary_tv": (0.02, 0.037, True)}
    base = {**dict.fromkeys(OUTCOME_SCHEMA), "acc_start": 0.436, "acc_best": 0.45}
    runs = [
        {**base, **dict(zip(names, r, strict=True)), "run": f"{r[0]}-seed{r[1]}", "first_critical_kind": kinds[r[6]]}
        | dict(zip(("acc_drop", "acc_drop_noise", "within_noise"), drops[r[0]], strict=True))
        for r in rows
    ]
    return pl.DataFrame(runs, schema=OUTCOME_SCHEMA)


def test_alert_leads_counts_warned_collapses_and_false_alarms():
    assert alert_leads(_outcomes()) == (
        "1/2 collapsing runs had a critical alert before the collapse (lead in steps: 12, -10; "
        "mean 1.000 ± 11.000 (n=2)); 1/1 runs that did not collapse had a critical alert"
    )


def test_alert_leads_counts_again_over_the_runs_decided_away_from_the_line():
    """pg_is seed 1 fell 3 standard errors below the line, dppo_binary_tv's lowest evaluation was
    0.5 above it, pg_is seed 0 collapsed on its reward (no margin): the second count is over
    pg_is seed 1 alone."""
    margins = pl.Series("line_margin", [3.0, 0.5, None], dtype=pl.Float64)
    assert alert_leads(_outcomes().with_columns(margins)) == (
        "1/2 collapsing runs had a critical alert before the collapse (lead in steps: 12, -10; "
        "mean 1.000 ± 11.000 (n=2)); 1/1 runs that did not collapse had a critical alert. 1 of the 3 runs came "
        "within 2 standard errors of the collapse line at their lowest evaluation (another draw of held-out "
        "problems could well turn their outcome); over the 1 others, 1/1 collapsing runs had a critical alert "
        "before the collapse; 0/0 runs that did not collapse had a critical alert"
    )


def test_outcome_rows_one_row_per_run_by_rule_then_seed():
    rows = outcome_rows(_outcomes())
    assert rows[0].startswith("| rule | seed | start | final | lowest | best | best − final level (noise) |")
    assert rows[2:] == [
        "| pg_is | 0 | 0.436 | 0.200 | 0.200 | 0.450 | 0.300 (0.040) | 50 (reward) | 60 (reward_drop) | -10 |",
        "| pg_is | 1 | 0.436 | 0.100 | 0.050 | 0.450 | 0.300 (0.040) | 100 (accuracy) | 88 (accuracy_drop) | 12 |",
        "| dppo_binary_tv | 0 | 0.436 | 0.400 | 0.300 | 0.450 | 0.020 (0.037 ✓) | – | 90 (reward_drop) | – |",
    ]


def test_claims_from_given_outcomes_equal_claims_that_compute_them(tmp_path):
    from trustlens.analysis.claims import measure_claims
    from trustlens.analysis.seeds import run_outcomes
    from trustlens.run import load_run
    from trustlens.synthetic import write_synthetic_run

    runs = []
    for rule in ("ppo", "dppo_binary_tv"):
        for seed in (0, 1):
            path = tmp_path / f"{rule}-seed{seed}"
            collapse = 6 if (rule, seed) == ("ppo", 1) else None
            sizes = dict(steps=12, samples_per_step=16, seq_len=8)
            write_synthetic_run(
                path, **sizes, rules=["ppo", "dppo_binary_tv"], active_rule=rule, seed=seed, collapse_at=collapse
            )
            runs.append(load_run(path))
    given = [c.line() for c in measure_claims(runs, run_outcomes(runs))]
    assert given == [c.line() for c in measure_claims(runs)]
    assert given[0].startswith("C1 ") and len(given) == 6


def test_claims_refuse_a_rule_and_seed_twice(tmp_path):
    """A copied run is not a second seed: measure_claims names both runs instead of keeping one."""
    import shutil

    import pytest

    from trustlens.analysis.claims import measure_claims
    from trustlens.run import load_run
    from trustlens.synthetic import write_synthetic_run

    write_synthetic_run(tmp_path / "ppo", steps=4, samples_per_step=16, seq_len=8, active_rule="ppo", seed=1)
    shutil.copytree(tmp_path / "ppo", tmp_path / "ppo-again")
    runs = [load_run(tmp_path / "ppo"), load_run(tmp_path / "ppo-again")]
    with pytest.raises(ValueError, match=r"^runs ppo and ppo-again are both rule ppo on seed 1: "):
        measure_claims(runs)


def test_c3_holds_unless_dppo_ends_outside_noise_on_more_seeds_than_chance_explains(tmp_path):
    from trustlens.analysis.claims import measure_claims
    from trustlens.analysis.seeds import run_outcomes
    from trustlens.run import load_run
    from trustlens.synthetic import write_synthetic_run

    runs = []
    for rule in ("pg_is", "dppo_binary_tv"):
        for seed in (0, 1):
            path = tmp_path / f"{rule}-seed{seed}"
            sizes = dict(steps=12, samples_per_step=16, seq_len=8)
            write_synthetic_run(path, **sizes, rules=["pg_is", "dppo_binary_tv"], active_rule=rule, seed=seed)
            runs.append(load_run(path))
    free = pl.col("rule") == "pg_is"
    outcomes = run_outcomes(runs).with_columns(
        collapse_step=pl.when(free).then(6),
        k3_start=pl.lit(0.01),
        k3_end=pl.when(free).then(0.05).otherwise(0.01),
        acc_drop=pl.when(free).then(0.3).otherwise(pl.Series([None, None, 0.01, 0.08])),
        within_noise=pl.when(free).then(False).otherwise(pl.Series([None, None, True, False])),
    )
    # 1 of 2 seeds outside noise: runs whose accuracy never changes do that with probability
    # 1 − 0.95² = 0.0975, not below 5%: the claim holds
    c3 = measure_claims(runs, outcomes)[2]
    assert c3.verdict == "holds"
    assert (
        "dppo_binary_tv ended within noise of its best on 1/2, as runs whose accuracy never changes would "
        "with probability 0.098 (best − final accuracy level 0.045"
    ) in c3.line()
    # both outside (chance 0.05² = 0.0025), or one unknown and one outside: it does not hold
    for dppo in ([False, False], [None, False]):
        fell = outcomes.with_columns(within_noise=pl.when(free).then(False).otherwise(pl.Series([None, None, *dppo])))
        assert measure_claims(runs, fell)[2].verdict == "does not hold at this scale"

"""The corrections of issue 37 at toy scale: which keep a run from collapsing, how fast each learns,
and how their blocked sets overlap DPPO binary TV's on the same tokens (docs/claims.md).

    python benchmarks/corrections.py train OUT [--rules R,...] [--default-rules R,...] [--seeds 0,1,2]
                                             [--collapse-steps 250] [--default-steps 20] [--eval-size 200]
                                             [--eval-every 10] [--jobs 2]
    python benchmarks/corrections.py report OUT

`train` trains the `--default-rules` on every seed under the `default` preset for
`--default-steps` steps (OUT/default: how fast each learns), then every rule (`--rules`) under the
`collapse` preset for its full 250 steps (OUT/collapse), `--jobs` runs at a time (`trustlens
compare` with the overrides given; the held-out set is smaller than the presets' 500 problems).
`report` prints, per preset and rule, the final held-out accuracy (mean ± standard error over the
seeds), the collapses out of the seeds (trustlens.analysis.seeds: accuracy below half its start,
or the reward collapse) and the gain over the run (final − start); then, on the tokens of the
collapse preset's dppo_binary_tv runs (every rule is decided on each of them), the Jaccard overlap
|B_rule ∩ B_dppo| / |B_rule ∪ B_dppo| of each rule's blocked set with DPPO binary TV's, A ≠ 0
tokens, pooled over the seeds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl

from trustlens.rules import CORRECTIONS as CORRECTION_RULES

# the corrections of docs/rules.md beyond PPO and DPPO, each against DPPO binary TV (and, on the
# collapse preset, pg_is: the same IS-weighted loss with no trust region)
CORRECTIONS = tuple(rule.name for rule in CORRECTION_RULES)
DEFAULT_RULES = ("dppo_binary_tv", "pg_is", *CORRECTIONS)
LEARNING_RULES = ("dppo_binary_tv", *CORRECTIONS)
PRESETS = ("default", "collapse")  # the short default-preset runs first


def train(
    out: Path,
    rules: dict[str, list[str]],
    seeds: list[int],
    steps: dict[str, int],
    eval_size: int,
    eval_every: int,
    jobs: int,
) -> None:
    """Each preset's rules × seeds, into OUT/<preset>/<rule>-seed<seed>, `jobs` runs at a time;
    finished runs kept."""
    from trustlens.train.config import config_from_preset
    from trustlens.train.runsets import compare

    for preset in PRESETS:
        base = config_from_preset(preset, steps=steps[preset], eval_size=eval_size, eval_every=eval_every)
        compare(rules[preset], seeds, out / preset, base, reuse=True, quiet=True, jobs=jobs)


def _runs(folder: Path) -> list:
    """The finished runs under `folder` (a run still training is left out)."""
    import trustlens

    runs = [trustlens.load_run(p) for p in sorted(folder.iterdir()) if (p / "run.json").exists()]
    return [run for run in runs if run.manifest.get("status") == "finished"]


def outcome_table(folder: Path) -> pl.DataFrame:
    """Per rule, the seed table of `trustlens compare` (trustlens.analysis.seeds: n, collapsed,
    within_noise, acc_final and acc_lowest mean ± SE over the seeds), with the collapses' steps
    and causes by seed, and the gain acc_final − acc_start mean ± SE."""
    from trustlens.analysis.seeds import mean_se, run_outcomes, seed_table

    outcomes = run_outcomes(_runs(folder))
    table = seed_table(outcomes).select(
        "rule", "n", "collapsed", "within_noise", "acc_final_mean", "acc_final_se", "acc_lowest_mean", "acc_lowest_se"
    )
    rows = []
    for rule in table["rule"].to_list():
        part = outcomes.filter(pl.col("rule") == rule).sort("seed")
        steps = part.select("collapse_step", "collapse_cause").rows()
        gain, gain_se, _ = mean_se((part["acc_final"] - part["acc_start"]).to_list())
        collapses = ", ".join(f"{step} ({cause})" for step, cause in steps if step is not None)
        rows.append((rule, collapses, gain, gain_se))
    extra = pl.DataFrame(
        rows,
        schema={"rule": pl.String, "collapse_steps": pl.String, "gain": pl.Float64, "gain_se": pl.Float64},
        orient="row",
    )
    return table.join(extra, on="rule", how="left", maintain_order="left")


def jaccard_table(folder: Path, reference: str = "dppo_binary_tv") -> pl.DataFrame:
    """Per rule recorded in the `reference` runs of `folder`: blocked tokens, their share of the
    A ≠ 0 tokens of those runs, and the Jaccard overlap of its blocked set with `reference`'s."""
    from trustlens.run import blocked_column

    runs = [r for r in _runs(folder) if r.active_rule == reference]
    if not runs:
        raise ValueError(f"no {reference} run under {folder}")
    rules = [r for r in runs[0].rules if blocked_column(r) in runs[0].tokens.collect_schema().names()]
    ref = pl.col(blocked_column(reference)).fill_null(False)
    sums = []
    for run in runs:
        tokens = run.tokens.filter(pl.col("advantage") != 0)
        aggs = [pl.len().alias("tokens")]
        for rule in rules:
            col = pl.col(blocked_column(rule)).fill_null(False)
            aggs += [
                (col & ref).sum().alias(f"i_{rule}"),
                (col | ref).sum().alias(f"u_{rule}"),
                col.sum().alias(f"b_{rule}"),
            ]
        sums.append(tokens.select(aggs).collect())
    total = pl.concat(sums).sum()
    rows = []
    n = int(total["tokens"][0])
    for rule in rules:
        inter, union, blocked = (int(total[f"{k}_{rule}"][0]) for k in ("i", "u", "b"))
        rows.append((rule, blocked, blocked / n if n else None, inter / union if union else None))
    return pl.DataFrame(rows, schema=["rule", "blocked", "blocked_frac", "jaccard"], orient="row")


def report(out: Path) -> None:
    with pl.Config(
        tbl_rows=50,
        tbl_cols=-1,
        tbl_width_chars=300,
        fmt_str_lengths=120,
        float_precision=3,
        tbl_hide_dataframe_shape=True,
    ):
        for preset in PRESETS:
            if (out / preset).is_dir():
                print(f"\n{preset} preset: final held-out accuracy, collapses, gain (mean ± SE over seeds)")
                print(outcome_table(out / preset))
        print("\nJaccard overlap with dppo_binary_tv's blocked set (collapse preset, dppo_binary_tv runs, A ≠ 0)")
        print(jaccard_table(out / "collapse"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("out", type=Path)
    t.add_argument("--rules", default=",".join(DEFAULT_RULES), help="the collapse preset's rules")
    t.add_argument("--default-rules", default=",".join(LEARNING_RULES), help="the default preset's rules")
    t.add_argument("--seeds", default="0,1,2")
    t.add_argument("--collapse-steps", type=int, default=250, help="the collapse preset's steps [250]")
    t.add_argument("--default-steps", type=int, default=20, help="steps of the default-preset runs [20]")
    t.add_argument("--eval-size", type=int, default=200, help="held-out problems per evaluation [200]")
    t.add_argument("--eval-every", type=int, default=10, help="evaluate every this many steps [10]")
    t.add_argument("--jobs", type=int, default=2, help="runs trained at a time [2]")
    r = sub.add_parser("report")
    r.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "train":
        steps = {"collapse": args.collapse_steps, "default": args.default_steps}
        seeds = [int(s) for s in args.seeds.split(",")]
        rules = {"collapse": args.rules.split(","), "default": args.default_rules.split(",")}
        train(args.out, rules, seeds, steps, args.eval_size, args.eval_every, args.jobs)
    else:
        report(args.out)


if __name__ == "__main__":
    main()

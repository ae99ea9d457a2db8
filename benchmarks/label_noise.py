"""Is a run's collapse a property of the run, or of the held-out problems it was measured on?

    python benchmarks/label_noise.py train RULE SEED OUT [--sets 4] [--every 5] [--steps N] [--eval-size N]
    python benchmarks/label_noise.py report FOLDER [--every 10]

`train` trains one run of the `collapse` preset, as `trustlens claims` does (deterministic for a
seed on one machine; the evaluation draws nothing from the training's generator, so its rewards equal those of
the claims run of the same rule and seed), but evaluates greedily every `--every` steps on the
run's own 500 held-out problems (set A, logged as eval/accuracy as usual) and on `--sets` other
disjoint sets of 500 (`eval_set(500 · sets, seed=1)` cut in pieces: B0, B1, ...), logged as
label_noise/acc_<set>. The weights at each evaluation are the same for every set.

`report` reads every such run under FOLDER and prints, per run and set, at the claims' cadence
(`--every`, a multiple of the training's), the collapse step (`collapse_onset`: the first
evaluation below half the first one's, or the reward collapse) and the first critical alert of
`detect_collapse` fed with that set's accuracy; then how many sets call each run collapsed. A run
whose outcome changes with the set is decided by the draw of problems, not by the training.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl
import torch

PREFIX = "label_noise/acc_"


def train(rule: str, seed: int, out: Path, sets: int, every: int, **overrides) -> None:
    """The run (module docstring); `overrides`: TrainConfig fields (None: the preset's)."""
    import trustlens.train.trainer as trainer
    from trustlens.train.config import config_from_preset
    from trustlens.train.evaluate import decode_responses

    named: dict[str, list] = {}

    @torch.no_grad()
    def evaluate(engine, tokenizer, task, problems, world) -> dict[str, float]:
        """Greedy accuracy on set A (`problems`) and on each other set; single process only."""
        if not named:
            named["A"] = problems
            others = task.eval_set(len(problems) * sets, seed=1)
            named.update({f"B{i}": others[i * len(problems) : (i + 1) * len(problems)] for i in range(sets)})
        out = {}
        for name, ps in named.items():
            batch = engine.generate([tokenizer(p.prompt).input_ids for p in ps], greedy=True)
            right = sum(task.reward(p, r) == 1.0 for p, r in zip(ps, decode_responses(tokenizer, batch), strict=True))
            out[f"{PREFIX}{name}"] = right / len(ps)
        return {**out, "eval/accuracy": out[f"{PREFIX}A"], "eval/accuracy_sampled": float("nan")}

    cfg = config_from_preset("collapse", rule=rule, seed=seed, eval_every=every, **overrides)
    usual = trainer.evaluate_accuracy
    trainer.evaluate_accuracy = evaluate
    try:
        trainer.train(cfg, out, progress=False)
    finally:
        trainer.evaluate_accuracy = usual


def outcomes(path: Path, every: int) -> pl.DataFrame:
    """One row per set of the run at `path`: set, collapse step, cause, first critical alert."""
    from trustlens import load_run
    from trustlens.analysis.collapse import CollapseConfig, detect_collapse
    from trustlens.analysis.collapse.onset import collapse_onset, collapse_window
    from trustlens.analysis.collapse.signals import step_signals
    from trustlens.analysis.seeds import reward_per_step

    run = load_run(path)
    long = run.metrics.filter(pl.col("name").str.starts_with(PREFIX)).collect()
    wide = long.group_by("step", "name").agg(pl.col("value").mean()).pivot(on="name", index="step", values="value")
    last = int(wide["step"].max())
    wide = wide.filter((pl.col("step") % every == 0) | (pl.col("step") == last)).sort("step")
    reward = reward_per_step(run)
    signals = step_signals(run).drop("accuracy")
    rows = []
    for column in sorted(c for c in wide.columns if c.startswith(PREFIX)):
        acc = wide.select("step", pl.col(column).alias("accuracy"))
        onset, cause = collapse_onset(list(acc.iter_rows()), reward, collapse_window(len(reward)))
        with_acc = signals.join(acc, on="step", how="left")
        alerts = detect_collapse(run, CollapseConfig(), signals=with_acc).filter(pl.col("critical_step").is_not_null())
        first = alerts["critical_step"].min() if alerts.height else None
        rows.append(dict(run=run.name, set=column.removeprefix(PREFIX), collapse=onset, cause=cause, first=first))
    return pl.DataFrame(
        rows, schema={"run": pl.String, "set": pl.String, "collapse": pl.Int64, "cause": pl.String, "first": pl.Int64}
    )


def report(folder: Path, every: int) -> None:
    paths = sorted(p.parent for p in folder.glob("*/run.json"))
    if not paths:
        raise SystemExit(f"label_noise: no runs in {folder}")
    table = pl.concat([outcomes(p, every) for p in paths])
    cell = pl.col("collapse").cast(pl.String).fill_null("–") + " / " + pl.col("first").cast(pl.String).fill_null("–")
    per_run = table.with_columns(cell.alias("collapse / first critical")).pivot(
        on="set", index="run", values="collapse / first critical"
    )
    called = table.group_by("run").agg(
        pl.col("collapse").is_not_null().sum().alias("sets calling it a collapse"), pl.len().alias("sets")
    )
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200, tbl_hide_dataframe_shape=True):
        print(f"evaluations every {every} steps; per set: the collapse step / the first critical alert")
        print(per_run.join(called, on="run").sort("run"))
    split = called.filter(
        (pl.col("sets calling it a collapse") > 0) & (pl.col("sets calling it a collapse") < pl.col("sets"))
    )
    print(f"{split.height} of {called.height} runs collapse on some sets and not on others")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("rule")
    t.add_argument("seed", type=int)
    t.add_argument("out", type=Path)
    t.add_argument("--sets", type=int, default=4, help="other sets of held-out problems [4]")
    t.add_argument("--every", type=int, default=5, help="steps between evaluations [5]")
    t.add_argument("--steps", type=int, default=None, help="training steps [the preset's]")
    t.add_argument("--eval-size", type=int, default=None, help="problems per set [the preset's: 500]")
    r = sub.add_parser("report")
    r.add_argument("folder", type=Path)
    r.add_argument("--every", type=int, default=10, help="the cadence to judge at: the claims' [10]")
    args = parser.parse_args(argv)
    if args.command == "train":
        train(args.rule, args.seed, args.out, args.sets, args.every, steps=args.steps, eval_size=args.eval_size)
    else:
        report(args.folder, args.every)


if __name__ == "__main__":
    main(sys.argv[1:])

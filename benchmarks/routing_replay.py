"""Routing replay (R3) on the built-in mixture of experts: the same runs with the trainer's own
routing (live) and with the engine's routing replayed (`--routing-replay`), on an fp8 engine.

    nice -n 10 python benchmarks/routing_replay.py --out runs/replay --jobs 2

trains (or, with --reuse, keeps) for each setting, seed and mode one `trustlens train --model moe`
run with the shadow forward on (`--routing-split-every`), then prints one markdown row per run:

- k3: mean over steps of `k3_kl`, the K3 estimate of π_old vs μ as the trainer computes π_old (live
  routing, or μ's under replay);
- k3 routing share: 1 − Σ k3 under μ's routing / Σ k3 under the trainer's own (the share of the live
  K3 that forcing μ's routing removes) and |Δ log p| share: Σ|live − replayed| / (Σ|live − replayed| +
  Σ|replayed − μ|), both over the tokens of the steps the shadow forward ran
  (trustlens.routing.measured_split: its per-step means weighted by the step's tokens);
- recorded share: the share of Σ|Δ log p| on the tokens with a flipped layer over the same tokens, as
  the record and the doctor's `routing` check see it (trustlens.routing.routing_share): issue 49's
  check is that it is within 0.05 of the |Δ log p| share ("–" under replay, where π uses μ's experts
  and nothing flips);
- doctor: the verdict of `trustlens doctor`'s `routing` check on the run;
- flipped: mean `routing/flipped_tokens` (tokens with a layer whose expert sets differ);
- held-out greedy accuracy at the start, the end and its best; collapse: the first evaluation below
  half the start (docs/train.md's definition), "–" if none.

Settings: ``fp8`` = the fp8 preset (τ = 1) under dppo_binary_tv; ``collapse`` = the collapse preset
(fp8 engine 16 steps stale) under pg_is, the rule that collapses there. --fp8-steps and
--collapse-steps shorten them (the presets' own are 160 and 250).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl

import trustlens
from trustlens.analysis.diagnosis import doctor
from trustlens.routing import measured_split, routing_share

SETTINGS = {"fp8": ("fp8", "dppo_binary_tv"), "collapse": ("collapse", "pg_is")}  # name -> (preset, rule)
MODES = {"live": [], "replay": ["--routing-replay"]}


def command(out: Path, setting: str, mode: str, seed: int, steps: int, args: argparse.Namespace) -> list[str]:
    preset, rule = SETTINGS[setting]
    return [
        sys.executable, "-m", "trustlens.cli", "train", "--model", "moe", "--preset", preset, "--rule", rule,
        "--seed", str(seed), "--steps", str(steps), "--eval-every", str(args.eval_every),
        "--eval-size", str(args.eval_size), "--routing-split-every", str(args.split_every),
        *MODES[mode], "--out", str(out), "--overwrite", "--quiet",
    ]  # fmt: skip


def finished(path: Path) -> bool:
    manifest = path / "run.json"
    return manifest.is_file() and json.loads(manifest.read_text()).get("status") == "finished"


def summary(path: Path) -> dict[str, float | int | None]:
    """The row's numbers of one finished run (module docstring)."""
    run = trustlens.load_run(path)
    metrics = run.metrics.collect()

    def series(name: str) -> list[float]:
        rows = metrics.filter(metrics["name"] == name).sort("step")
        return [float(v) for v in rows["value"] if v == v]

    split = measured_split(run)
    if split is None:
        raise SystemExit(f"{path}: no shadow forward logged (routing/* metrics): train it with --routing-split-every")
    split_steps = metrics.filter(metrics["name"] == "routing/k3_live")["step"].to_list()
    recorded = routing_share(run.tokens.filter(pl.col("update") == 0, pl.col("step").is_in(split_steps)))
    acc = metrics.filter(metrics["name"] == "eval/accuracy").sort("step")
    steps, values = acc["step"].to_list(), acc["value"].to_list()
    fell = [s for s, v in zip(steps, values, strict=True) if v < values[0] / 2]
    return {
        "k3": statistics.mean(series("k3_kl")),
        "k3_share": split.k3_share,
        "abs_share": split.dlogp_share,
        "recorded_share": None
        if recorded is None or run.manifest["config"]["routing_replay"]
        else recorded.dlogp_share,
        "doctor": doctor(run, checks=["routing"])[0].verdict,
        "flipped": statistics.mean(series("routing/flipped_tokens")),
        "start": values[0],
        "final": values[-1],
        "best": max(values),
        "collapse": fell[0] if fell else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/replay"))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated: fp8, collapse")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--fp8-steps", type=int, default=160)
    parser.add_argument("--collapse-steps", type=int, default=250)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=500)
    parser.add_argument("--split-every", type=int, default=5)
    parser.add_argument("--reuse", action="store_true", help="keep finished runs already in --out")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    steps = {"fp8": args.fp8_steps, "collapse": args.collapse_steps}
    runs = {
        (setting, mode, seed): args.out / f"{setting}-{mode}-seed{seed}"
        for setting in args.settings.split(",")
        for mode in MODES
        for seed in seeds
    }
    todo = [
        command(path, setting, mode, seed, steps[setting], args)
        for (setting, mode, seed), path in runs.items()
        if not (args.reuse and finished(path))
    ]
    with ThreadPoolExecutor(args.jobs) as pool:
        for code in pool.map(lambda cmd: subprocess.run(cmd, check=False).returncode, todo):
            if code:
                print(f"a run failed with exit code {code}", file=sys.stderr)
    columns = "setting routing seed k3 k3_routing_share abs_dlogp_share recorded_share doctor flipped_tokens"
    columns += " start final best collapse"
    print("| " + " | ".join(columns.split()) + " |")
    print("|---" * len(columns.split()) + "|")
    for (setting, mode, seed), path in runs.items():
        row = summary(path)
        collapse = "–" if row["collapse"] is None else str(row["collapse"])
        print(
            f"| {setting} | {mode} | {seed} | {row['k3']:.2e} | {row['k3_share']:.2f} | {row['abs_share']:.3f} | "
            f"{'–' if row['recorded_share'] is None else format(row['recorded_share'], '.3f')} | {row['doctor']} | "
            f"{row['flipped']:.3f} | {row['start']:.3f} | {row['final']:.3f} | {row['best']:.3f} | {collapse} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

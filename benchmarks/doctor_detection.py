"""How often `trustlens doctor` names a planted log-probability bug, and how often it finds
something on clean runs (issue 30, point 5; the table of docs/doctor.md).

    python benchmarks/doctor_detection.py [--seeds 20] [--trained-seeds 20] [--jobs 2]
        [--defects frozen_policy,resume] [--no-clean]

Planted runs (synthetic, `--seeds` seeds per defect): responses of `SEQ_LEN` tokens over a
vocabulary of `VOCAB` ids, each position's logits drawn so that π's entropy ranges from near 0
(one dominant token) to ~2 nats, sampled at τ = 0.5 by an engine whose logits carry Gaussian
noise (k3 ≈ 1e-4, a bf16 engine's level). The trainer's log π_old is the exact log-softmax of
the noise-free logits / τ. Each defect is the bug's math applied while sampling or when the
rollout reaches the trainer, at the magnitudes issue 30 quotes:

    raw_logprobs   μ reported from log softmax(logits), sampled at τ = 0.5     -> temperature
    top_p          sampled with top-p 0.8, μ renormalised over the kept tokens -> truncation
    shifted        log μ of position t − 1 at position t                      -> shift
    sentinel       log μ written as 0 at 10% of the tokens                    -> sentinel
    token_ids      the trainer scores one fixed id wherever the engine sampled
                   its most frequent token (~2% of the tokens)                -> token_ids
    first_token    π_old/μ = 2 on the first token (TRL #4159)                  -> where
    level          an engine 10× noisier (k3 ≈ 1e-2, dense model)             -> level
    engine_drift   lr = 0 and the engine's noise grows so that mean |Δ log p|
                   goes 0.011 → 0.036 over the run (vime #64)                -> engine_drift
    frozen_policy  lr = 0 and the engine's weights move away from the trainer's
                   at every sync: a fixed logit offset per token id, growing
                   with the step (an adapter merged again at each sync, a stale
                   weight sync; open-instruct #1473)                          -> frozen_policy
    resume         the run is resumed after step 3 (run.json `resumed_after`)
                   and the engine serves other weights from then on: a fixed
                   logit offset per token id (slime #1695)                    -> resume
    sequence_sum   the recorded sequence weight is exp(Σ log(π_old/μ)) over the
                   response instead of exp(mean) (trl #5814)                  -> sequence_sum
    truncation_bias  top-p 0.8 with μ renormalised over the kept tokens, the
                   sampling masks recorded (`pi_support_mass`), π not masked
                   (trl #6789)                                                -> truncation_bias

Every planted run records the per-response statistics and a sequence weight (the mean's, but for
sequence_sum) and trains with `ppo` as its active rule; the clean and resume runs record a resume
point after step RESUME_AT − 1 (for the clean run, a resume that went well).

A defect counts as detected when its check's verdict is "problem" and it is the first finding.
Each synthetic run is written twice: with the columns `record` derives from π's logits and μ's
top-K (`TOPK` ids; pi_logp_raw, mu_topk_mass, pi_topk_mass), where the temperature and
truncation checks take their logits form, and without them (their token-level form).

Trained runs: each defect `trustlens train --engine DEFECT` plants (raw_logprobs, top_p, shifted,
sentinel, token_ids, frozen_policy, top_p_mask, resume, sequence_sum; docs/train.md) on
`--trained-seeds` seeds of the default preset, `--trained-steps` steps each (or the defect's
TRAINED_SETTINGS), no evaluation. The built-in trainer passes `record` π's logits and
μ's top-K, so its runs hold the logit columns (logits form); each is also read with them dropped
(token-level form). Clean runs: the generator without a defect, every
built-in preset's clean run (`trustlens train --preset P --steps N --eval-size 0`, N =
`--train-steps`; quick its own 3) and the shipped sample runs (data/sample_run). The training
runs are the trainer's own `train` called in `--jobs` worker processes (what `trustlens train`
runs, without a process start per run).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 48  # vocabulary of the planted runs
SEQ_LEN = 24  # response length
SAMPLES = 64  # responses per step
STEPS = 8  # steps per planted run
TAU = 0.5  # sampling temperature
TOPK = 8  # μ's top-K ids per position the engine reports (logits form)
FORMS = ("logits", "token-level")  # with the logit columns / without them
NOISE = 0.04  # std of the clean engine's logit noise (on logits / τ): k3 ≈ 1e-4
TOP_P = 0.8
SENTINEL_SHARE = 0.1
FIRST_RATIO = 2.0
LEVEL_NOISE = 10 * NOISE
DRIFT_FROM, DRIFT_TO = 0.011, 0.036  # mean |Δ log p| at the first and last step of engine_drift
ABS_PER_NOISE = 0.207  # this generator's mean |Δ log p| per unit of logit-noise std (measured: 0.0083 at 0.04)
WEIGHT_OFFSET = 0.5  # std of the per-id logit offset of frozen_policy's engine at the last step, and of resume's
RESUME_AT = 4  # first step after the resume (run.json resumed_after = [RESUME_AT − 1])
# defect -> the check that should name it
DEFECTS = {
    "raw_logprobs": "temperature",
    "top_p": "truncation",
    "shifted": "shift",
    "sentinel": "sentinel",
    "token_ids": "token_ids",
    "first_token": "where",
    "level": "level",
    "engine_drift": "engine_drift",
    "frozen_policy": "frozen_policy",
    "resume": "resume",
    "sequence_sum": "sequence_sum",
    "truncation_bias": "truncation_bias",
}
# the defects `trustlens train --engine` plants (issue 30, point 4; frozen_policy, top_p_mask, resume,
# sequence_sum: issue 50)
TRAINED = {
    "raw_logprobs": "temperature",
    "top_p": "truncation",
    "shifted": "shift",
    "sentinel": "sentinel",
    "token_ids": "token_ids",
    "frozen_policy": "frozen_policy",
    "top_p_mask": "truncation_bias",
    "resume": "resume",
    "sequence_sum": "sequence_sum",
}
# a trained defect's own settings: frozen_policy needs the steps a drift shows over (its check
# reads ≥ 6) and a learning rate too small to move π (the trainer refuses lr 0); resume needs 3
# steps before its restart (after step 3 of 8) and 3 after it (its check's window)
TRAINED_SETTINGS: dict[str, dict] = {"frozen_policy": {"steps": 8, "lr": 1e-9}, "resume": {"steps": 8}}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _sample(rng: np.random.Generator, logp: np.ndarray) -> np.ndarray:
    """One id per row of log-probabilities (..., V)."""
    p = np.exp(logp)
    u = rng.random((*p.shape[:-1], 1))
    return np.minimum((p.cumsum(axis=-1) < u * p.sum(axis=-1, keepdims=True)).sum(axis=-1), p.shape[-1] - 1)


def _top_p(logp: np.ndarray, p: float) -> np.ndarray:
    """log-probs renormalised over the smallest set of ids holding mass ≥ p (−inf elsewhere)."""
    order = np.argsort(-logp, axis=-1)
    sorted_p = np.exp(np.take_along_axis(logp, order, axis=-1))
    before = sorted_p.cumsum(axis=-1) - sorted_p  # mass of the ids ahead of each
    keep_sorted = before < p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    kept = np.where(keep, logp, -np.inf)
    return kept - np.log(np.exp(kept).sum(axis=-1, keepdims=True))


def _topk_masses(reported: np.ndarray, old: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_S μ, Σ_S π_old) over μ's top-TOPK ids S of the reported log μ (..., V), the sampled
    id forced in in place of the TOPK-th where S lacks it, as `record` forces it."""
    top = np.argsort(-reported, axis=-1)[..., :TOPK]
    lacks = ~(top == ids[..., None]).any(axis=-1)
    top[..., -1] = np.where(lacks, ids, top[..., -1])
    mass = [np.exp(np.take_along_axis(logp, top, axis=-1)).sum(axis=-1) for logp in (reported, old)]
    return np.minimum(mass[0], 1.0), np.minimum(mass[1], 1.0)


def planted_tokens(defect: str, seed: int, logit_columns: bool = False) -> tuple[dict[str, list], dict]:
    """The token columns of one planted run (`defect` "clean" for none) and its config; with
    `logit_columns`, also those `record` derives from π's logits and μ's top-K."""
    rng = np.random.default_rng(seed)
    n = STEPS * SAMPLES
    shape = (STEPS, SAMPLES, SEQ_LEN)
    # logits / τ as the trainer computes them: one dominant id with a margin of 0-12 nats
    scaled = rng.normal(0.0, 1.5, (*shape, VOCAB))
    top = rng.integers(0, VOCAB, shape)
    np.put_along_axis(scaled, top[..., None], rng.uniform(0.0, 12.0, shape)[..., None] + 3.0, axis=-1)
    noise = np.full(STEPS, LEVEL_NOISE if defect == "level" else NOISE)
    if defect == "engine_drift":
        # mean |Δ log p| grows about linearly with the noise's std: DRIFT_FROM → DRIFT_TO
        noise = np.linspace(DRIFT_FROM, DRIFT_TO, STEPS) / ABS_PER_NOISE
    engine = scaled + rng.normal(0.0, 1.0, scaled.shape) * noise[:, None, None, None]
    engine = engine + _weight_offset(defect, seed)  # other weights than the trainer's (frozen_policy, resume)
    old = _log_softmax(scaled)  # (S, B, T, V)
    engine_logp = _log_softmax(engine)
    truncated = defect in ("top_p", "truncation_bias")
    sampling = _top_p(engine_logp, TOP_P) if truncated else engine_logp
    ids = _sample(rng, sampling)  # (S, B, T)
    reported = _log_softmax(engine * TAU) if defect == "raw_logprobs" else sampling
    mu = np.take_along_axis(reported, ids[..., None], axis=-1)[..., 0]
    trainer_ids = ids.copy()
    if defect == "token_ids":
        frequent = np.bincount(ids.ravel(), minlength=VOCAB).argmax()
        trainer_ids = np.where(ids == frequent, (frequent + 1) % VOCAB, ids)
    old_logp = np.take_along_axis(old, trainer_ids[..., None], axis=-1)[..., 0]
    if defect == "shifted":
        mu = np.concatenate([mu[..., :1], mu[..., :-1]], axis=-1)
    elif defect == "sentinel":
        mu = np.where(rng.random(shape) < SENTINEL_SHARE, 0.0, mu)
    elif defect == "first_token":
        mu[..., 0] = old_logp[..., 0] - np.log(FIRST_RATIO)
    p_old = np.exp(old)
    entropy = -(p_old * old).sum(axis=-1)
    # two updates per step (minibatches): samples of update 1 see a policy that moved (lr > 0)
    update = np.broadcast_to((np.arange(SAMPLES) % 2)[None, :, None], shape)
    lr = 0.0 if defect in ("engine_drift", "frozen_policy") else 3e-5
    move = 0.0 if lr == 0 else 0.01
    pi_logp = np.minimum(old_logp + update * rng.normal(0.0, move, shape), 0.0)
    step = np.broadcast_to(np.arange(STEPS)[:, None, None], shape)
    sample = step * 10_000 + np.broadcast_to(np.arange(SAMPLES)[None, :, None], shape)
    pos = np.broadcast_to(np.arange(SEQ_LEN)[None, None, :], shape)
    cols = {
        "step": step,
        "update": update,
        "sample": sample,
        "pos": pos,
        "token_id": trainer_ids,
        "mu_logp": np.minimum(mu, 0.0),
        "old_logp": old_logp,
        "pi_logp": pi_logp,
        "entropy": entropy,
        "advantage": np.broadcast_to(rng.normal(0.0, 1.0, (STEPS, SAMPLES, 1)), shape),
    }
    cols |= _sequence_columns(defect, np.minimum(mu, 0.0), old_logp, pi_logp)
    if defect == "truncation_bias":  # Σ π_old over the kept ids: the engine's sampling mask
        kept = np.isfinite(np.take_along_axis(sampling, ids[..., None], axis=-1)[..., 0])
        assert kept.all()
        cols["pi_support_mass"] = np.minimum(np.where(np.isfinite(sampling), p_old, 0.0).sum(axis=-1), 1.0)
    if logit_columns:  # π's raw logits are scaled·τ; π moves at update 1 as pi_logp does
        raw = np.take_along_axis(_log_softmax(scaled * TAU), trainer_ids[..., None], axis=-1)[..., 0]
        cols["pi_logp_raw"] = np.minimum(raw + (pi_logp - old_logp), 0.0)
        cols["mu_topk_mass"], cols["pi_topk_mass"] = _topk_masses(reported, old, ids)
    out = {k: np.asarray(v).reshape(n * SEQ_LEN).tolist() for k, v in cols.items()}
    config = {"temperature": TAU, "lr": lr, "planted": defect, "seed": seed}
    return out, config


def _weight_offset(defect: str, seed: int) -> np.ndarray | float:
    """The engine's logit offset (STEPS, 1, 1, VOCAB) when it serves other weights than the
    trainer's: a fixed offset per token id (from its own generator, so that the other defects'
    draws stay as they were) growing linearly to WEIGHT_OFFSET at the last step (frozen_policy),
    or WEIGHT_OFFSET from step RESUME_AT on (resume); 0 otherwise."""
    if defect not in ("frozen_policy", "resume"):
        return 0.0
    offset = np.random.default_rng([seed, 1]).normal(0.0, WEIGHT_OFFSET, VOCAB)
    steps = np.arange(STEPS)
    size = (steps + 1) / STEPS if defect == "frozen_policy" else (steps >= RESUME_AT).astype(float)
    return size[:, None, None, None] * offset[None, None, None, :]


def _sequence_columns(defect: str, mu: np.ndarray, old: np.ndarray, pi: np.ndarray) -> dict[str, np.ndarray]:
    """The per-response statistics of (S, B, T) log-probs, as `record` stores them, and the
    sequence weight the trainer applied: exp(mean log(π_old/μ)) over the response, exp(Σ) for
    sequence_sum."""
    s_mu, s_old = (np.broadcast_to(x.sum(-1, keepdims=True), x.shape) for x in (pi - mu, pi - old))
    log_w = (old - mu).sum(-1, keepdims=True) / (1 if defect == "sequence_sum" else mu.shape[-1])
    return {
        "seq_logratio_mu": s_mu,
        "seq_logratio_old": s_old,
        "seq_tokens": np.full(mu.shape, mu.shape[-1]),
        "seq_weight": np.broadcast_to(np.exp(log_w), mu.shape),
    }


def write_planted(path: Path, defect: str, seed: int, logit_columns: bool = False) -> Path:
    """A planted run at `path` (run.json with the sampling the engine claims: τ, processed)."""
    from trustlens.run.tables import write_run

    tokens, config = planted_tokens(defect, seed, logit_columns)
    write_run(path, tokens=tokens, rules=["ppo"], config=config)
    manifest = json.loads((path / "run.json").read_text())
    manifest["sampling"] = {"temperature": TAU, "top_p": None, "top_k": None, "min_p": None, "logprobs": None}
    manifest["model_kind"] = "dense"
    manifest["active_rule"] = "ppo"
    if defect in ("clean", "resume"):
        manifest["resumed_after"] = [RESUME_AT - 1]
    (path / "run.json").write_text(json.dumps(manifest))
    return path


LOGIT_COLUMNS = ("pi_logp_raw", "mu_topk_mass", "pi_topk_mass")  # what `record` derives from π's logits


def verdicts(run_path: Path) -> list[tuple[str, str]]:
    """(check, verdict) of every finding, most severe first."""
    from trustlens.analysis import doctor

    return [(f.check, f.verdict) for f in doctor(run_path)]


def without_logit_columns(run_path: Path) -> Path:
    """A copy of the run beside it (`NAME-token-level`) whose token files lack LOGIT_COLUMNS:
    the run as `record` writes it without π's logits, where the checks take their token-level form."""
    import shutil

    import polars as pl

    out = run_path.with_name(run_path.name + "-token-level")
    shutil.copytree(run_path, out)
    for part in (out / "tokens").rglob("*.parquet"):
        frame = pl.read_parquet(part)
        frame.drop([c for c in LOGIT_COLUMNS if c in frame.columns]).write_parquet(part)
    return out


def planted_table(seeds: int, folder: Path, clean: bool = True) -> tuple[list[str], list[dict]]:
    """Per defect and form (with the logit columns, without) over `seeds` seeds: problem (its
    check's verdict is problem), first (its check is the first finding) and detected (both), and
    the defect's measured size; and the clean synthetic runs' findings (with `clean`)."""
    import polars as pl

    from trustlens import load_run

    lines, clean_runs = [], []
    planted: dict[str, str | None] = {"clean": None} if clean else {}
    for defect, check in (planted | DEFECTS).items():
        for form in FORMS:
            problem = first = detected = 0
            sizes = []
            for seed in range(seeds):
                path = write_planted(folder / f"{defect}-{form}-{seed}", defect, seed, form == "logits")
                found = verdicts(path)
                if check is None:
                    clean_runs.append({"run": f"synthetic clean seed {seed} ({form})", "findings": found})
                    continue
                mine = dict(found)[check]
                problem += mine == "problem"
                first += found[0][0] == check
                detected += mine == "problem" and found[0][0] == check
                if defect == "engine_drift":
                    per_step = (
                        load_run(path)
                        .tokens.group_by("step")
                        .agg((pl.col("mu_logp") - pl.col("old_logp")).abs().mean().alias("a"))
                        .sort("step")
                        .collect()["a"]
                    )
                    sizes.append((per_step[0], per_step[-1]))
            if check is not None and seeds:
                size = (
                    f"; mean \\|Δ log p\\| {np.mean([a for a, _ in sizes]):.3f} → {np.mean([b for _, b in sizes]):.3f}"
                    if sizes
                    else ""
                )
                row = f"| {problem}/{seeds} | {first}/{seeds} | {detected}/{seeds}{size} |"
                lines.append(f"| {defect} | {check} | synthetic, {form} {row}")
    return lines, clean_runs


def _train(job: tuple) -> Path:
    """One built-in training run (no evaluation), in this process: job = (label, check, out,
    preset, steps, overrides of the preset)."""
    from trustlens.train.config import config_from_preset
    from trustlens.train.trainer import train

    _, _, out, preset, steps, overrides = job
    train(config_from_preset(preset, steps=steps, eval_size=0, **overrides), out, progress=False)
    return out


def training_jobs(
    folder: Path, *, train_steps: int, trained_seeds: int, trained_steps: int, clean: bool = True
) -> list[tuple]:
    """(label, check or None, out, preset, steps, overrides) of every training run: with `clean`,
    each preset's clean run (`train_steps` steps; quick its own 3) and, with `trained_seeds`,
    each `--engine` defect on that many seeds of the default preset (`trained_steps` steps, or
    the defect's TRAINED_SETTINGS)."""
    from trustlens.train.config import PRESETS

    jobs: list[tuple] = [
        (f"preset {p}", None, folder / f"preset-{p}", p, None if p == "quick" else train_steps, {})
        for p in PRESETS
        if clean
    ]
    for defect, check in TRAINED.items() if trained_seeds else ():
        settings = dict(TRAINED_SETTINGS.get(defect, {}))
        steps = settings.pop("steps", trained_steps)
        for seed in range(trained_seeds):
            out = folder / f"engine-{defect}-{seed}"
            jobs.append((defect, check, out, "default", steps, {"engine": defect, "seed": seed, **settings}))
    return jobs


def run_training(jobs: list[tuple], workers: int) -> list[tuple[str, str | None, dict[str, list[tuple[str, str]]]]]:
    """Train every job (`workers` processes, each importing torch once) and run the doctor on
    it: (label, check, {form: findings}). The built-in trainer records π's logits and μ's top-K
    (the logits form); a defect's run is also read without the logit columns (token-level)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        paths = list(pool.map(_train, jobs))
    results = []
    for (label, check, *_), path in zip(jobs, paths, strict=True):
        found = {"logits": verdicts(path)}
        if check is not None:
            found["token-level"] = verdicts(without_logit_columns(path))
        results.append((label, check, found))
    return results


def trained_table(results: list[tuple[str, str | None, dict[str, list[tuple[str, str]]]]]) -> list[str]:
    """Per `--engine` defect and form: problem, first and detected over its seeds."""
    lines = []
    for defect, check in TRAINED.items():
        for form in FORMS:
            runs = [found[form] for label, c, found in results if c is not None and label == defect]
            if not runs:
                continue
            n = len(runs)
            problem = sum(dict(found)[check] == "problem" for found in runs)
            first = sum(found[0][0] == check for found in runs)
            detected = sum(dict(found)[check] == "problem" and found[0][0] == check for found in runs)
            lines.append(f"| {defect} | {check} | trained, {form} | {problem}/{n} | {first}/{n} | {detected}/{n} |")
    return lines


def sample_runs() -> list[dict]:
    """Findings on the shipped sample runs (data/sample_run)."""
    return [
        {"run": f"data/sample_run/{path.name}", "findings": verdicts(path)}
        for path in sorted((ROOT / "data" / "sample_run").iterdir())
        if (path / "run.json").exists()
    ]


def engine_flag() -> bool:
    """Whether `trustlens train` has --engine (issue 30, point 4)."""
    from trustlens.train.config import TrainConfig

    return "engine" in TrainConfig.__dataclass_fields__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds per planted defect [20]")
    parser.add_argument("--train-steps", type=int, default=20, help="steps of each preset's clean run [20]")
    parser.add_argument("--trained-seeds", type=int, default=20, help="seeds per `train --engine` defect [20]")
    parser.add_argument("--trained-steps", type=int, default=2, help="steps of each `train --engine` run [2]")
    parser.add_argument("--jobs", type=int, default=2, help="training runs at a time [2]")
    parser.add_argument("--no-train", action="store_true", help="no training runs (planted and sample runs only)")
    parser.add_argument("--defects", help="comma-separated defects to plant and train (default: all)")
    parser.add_argument("--no-clean", action="store_true", help="no clean runs (synthetic, presets, sample runs)")
    args = parser.parse_args()
    if args.defects:
        wanted = args.defects.split(",")
        unknown = sorted(set(wanted) - set(DEFECTS) - set(TRAINED))
        if unknown:
            parser.error(
                f"--defects: unknown {', '.join(unknown)}; the defects are {', '.join({**DEFECTS, **TRAINED})}"
            )
        for table in (DEFECTS, TRAINED):
            for name in [d for d in table if d not in wanted]:
                del table[name]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="doctor-") as tmp:
        folder = Path(tmp)
        lines, clean = planted_table(args.seeds, folder, clean=not args.no_clean)
        print("| planted defect | check | kind, form | problem | first | detected |")
        print("|---|---|---|---|---|---|")
        print("\n".join(lines), flush=True)
        if not args.no_train:
            trained_seeds = args.trained_seeds if engine_flag() else 0
            if args.trained_seeds and not trained_seeds:
                print("(trustlens train has no --engine here: trained defects skipped)")
            jobs = training_jobs(
                folder,
                train_steps=args.train_steps,
                trained_seeds=trained_seeds,
                trained_steps=args.trained_steps,
                clean=not args.no_clean,
            )
            results = run_training(jobs, args.jobs)
            print("\n".join(trained_table(results)))
            clean += [{"run": label, "findings": found["logits"]} for label, check, found in results if check is None]
        clean += [] if args.no_clean else sample_runs()
    pairs = [v for run in clean for _, v in run["findings"]]
    problems = [f"{r['run']}: {c}" for r in clean for c, v in r["findings"] if v == "problem"]
    warnings = [f"{r['run']}: {c}" for r in clean for c, v in r["findings"] if v == "warning"]
    print(
        f"\nclean runs: {len(clean)}, findings {len(pairs)}: {len(problems)} problem, {len(warnings)} warning "
        f"({len(warnings) / max(len(pairs), 1):.1%})"
    )
    for line in problems + warnings:
        print("  " + line)
    print(f"wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

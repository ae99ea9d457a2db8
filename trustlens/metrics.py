"""The one registry of metric names: every per-step number trustlens logs or computes.

A metric has one name, used verbatim as the trainer's logged name (`metrics/` of a run), as the
column of the analysis frames (`trustlens.analysis`), and as the dashboard's label. Its entry
states the unit and the definition, and the name verl logs for the same quantity where verl has
one (verl's `rollout_corr/*` metrics of `verl/trainer/ppo/rollout_corr_helper.py`, and the
`training/rollout_*` debug metrics of `verl/utils/debug/metrics.py`).

Notation: per generated token a_t, μ = μ(a_t) the rollout engine's probability, π_old =
π_old(a_t) the trainer's recomputation before the step's first update, ρ = π_old/μ. Means are
over the response tokens of a step (token mean) unless the entry says "over sequences".

Names with a `<rule>` or `<sign>` part are templates: `blocked_rate(rule, sign)` fills them in.
Signs are `pos` (A > 0) and `neg` (A < 0); a token with A = 0 is never blocked, so block rates
are over A ≠ 0 tokens and the A = 0 share is its own metric (`zero_adv_frac`).

This module imports neither torch nor polars.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One metric: its name, unit, definition and verl's name for the same quantity."""

    name: str  # the one name: logged name, analysis column, dashboard label
    unit: str  # "nats", "probability", "fraction", "ratio", "seconds", ...
    doc: str  # one line: the definition
    verl: str | None = None  # verl's logged name for the same quantity, None when verl has none


_ALL = (
    # training-inference mismatch, μ vs π_old on the sampled tokens (trustlens.analysis.mismatch)
    Metric(
        "mismatch_kl",
        "nats",
        "mean(log μ − log π_old): K1 estimate of KL(μ ‖ π_old); can be negative on a finite sample",
        "rollout_corr/kl",
    ),
    Metric("k3_kl", "nats", "mean(ρ − 1 − log ρ): K3 estimate of KL(μ ‖ π_old), never negative", "rollout_corr/k3_kl"),
    Metric(
        "log_ppl_diff",
        "nats",
        "mean over sequences of mean_t(log μ − log π_old) = log PPL(π_old) − log PPL(μ)",
        "rollout_corr/log_ppl_diff",
    ),
    Metric(
        "log_ppl_abs_diff",
        "nats",
        "mean over sequences of |mean_t(log μ − log π_old)|",
        "rollout_corr/log_ppl_abs_diff",
    ),
    Metric(
        "chi2_token",
        "ratio",
        "mean(ρ²) − 1, log ρ clamped to ±20 before exp: token-level χ²(π_old ‖ μ)",
        "rollout_corr/chi2_token",
    ),
    Metric(
        "chi2_seq",
        "ratio",
        "mean over sequences of (Π_t ρ_t)² − 1, Σ_t log ρ_t clamped to ±20 before exp",
        "rollout_corr/chi2_seq",
    ),
    Metric(
        "prob_diff_mean",
        "probability",
        "mean |π_old − μ| (the binary TV of μ and π_old)",
        "training/rollout_probs_diff_mean",
    ),
    Metric("prob_diff_max", "probability", "max |π_old − μ|", "training/rollout_probs_diff_max"),
    Metric(
        "prob_pearson",
        "correlation",
        "Pearson correlation of μ and π_old over the step's tokens",
        "training/rollout_actor_probs_pearson_corr",
    ),
    # mismatch over μ's top-K set, needs the trainer's logits (built-in trainer only)
    Metric(
        "topk_tv_mean", "probability", "mean of the per-token top-K TV between μ and π_old (topk_tv, docs/rules.md)"
    ),
    Metric("topk_tv_max", "probability", "max of the per-token top-K TV between μ and π_old"),
    Metric("topk_kl_mean", "nats", "mean of the per-token top-K KL(μ ‖ π_old) (topk_kl); +inf when π_old gives 0"),
    # trust-region rules
    Metric(
        "blocked/<rule>/<sign>",
        "fraction",
        "share of the step's tokens with advantage sign <sign> (pos: A > 0, neg: A < 0) that <rule> blocks",
    ),
    Metric("blocked/active", "fraction", "share of A ≠ 0 tokens the run's active rule blocked, mean over updates"),
    Metric("blocked_frac", "fraction", "blocked / count over A ≠ 0 tokens where the rule was evaluated (analysis)"),
    Metric("zero_adv_frac", "fraction", "share of tokens with A = 0: no gradient, never blocked, not in block rates"),
    Metric("blocked_frac/<rule>", "fraction", "share of the step's A ≠ 0 tokens that <rule> blocks (both signs)"),
    Metric(
        "clip_frac",
        "fraction",
        "share of the step's response tokens where the trainer's ratio clip binds, as a framework logs it "
        "(A = 0 tokens counted in the denominator)",
    ),
    # mismatch as other frameworks log it (docs/import.md)
    Metric("logp_abs_diff_mean", "nats", "mean |log π_old − log μ| over the step's tokens"),
    Metric("logp_abs_diff_max", "nats", "max |log π_old − log μ| over the step's tokens"),
    Metric("is_ratio_mean", "ratio", "mean of the importance weight ρ = π_old/μ the trainer applies"),
    Metric("is_ratio_min", "ratio", "min of the importance weight ρ = π_old/μ the trainer applies"),
    Metric("is_ratio_max", "ratio", "max of the importance weight ρ = π_old/μ the trainer applies"),
    # policy and training
    Metric("entropy", "nats", "mean entropy of π over the step's recorded tokens (analysis)"),
    Metric("entropy/mean", "nats", "mean entropy of π_old over the step's response tokens (trainer)", "actor/entropy"),
    Metric("reward/mean", "reward", "mean reward of the step's responses", "critic/score/mean"),
    Metric("reward/std", "reward", "standard deviation of the step's rewards"),
    Metric("response_length/mean", "tokens", "mean response length", "response_length/mean"),
    Metric("grad_norm", "norm", "gradient norm before clipping, mean over the step's updates", "actor/grad_norm"),
    Metric("eval/accuracy", "fraction", "held-out accuracy, greedy decoding"),
    Metric("eval/accuracy_sampled", "fraction", "held-out accuracy, one sample per problem at τ"),
    Metric("time/step", "seconds", "wall time of the step"),
    Metric("time/rollout", "seconds", "wall time of the step's rollout"),
    Metric("time/eval", "seconds", "wall time of the evaluation"),
)

METRICS: dict[str, Metric] = {m.name: m for m in _ALL}

# The per-step mismatch metrics of `trustlens.analysis.mismatch_per_step`, in column order.
MISMATCH_METRICS: tuple[str, ...] = (
    "mismatch_kl",
    "k3_kl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "chi2_token",
    "chi2_seq",
    "prob_diff_mean",
    "prob_diff_max",
    "prob_pearson",
)

SIGNS = ("pos", "neg")


def _template(name: str) -> str:
    """The registry name of `name`: a filled-in template maps back to it."""
    name = re.sub(r"^blocked_frac/[^/]+$", "blocked_frac/<rule>", name)
    return re.sub(r"^blocked/(?!active$)[^/]+/(pos|neg)$", "blocked/<rule>/<sign>", name)


def blocked_frac(rule: str) -> str:
    """The logged name of `rule`'s block rate among all A ≠ 0 tokens (the signal blocked_<rule>)."""
    if not rule or "/" in rule:
        raise ValueError(f"rule must be a non-empty name without '/', got {rule!r}")
    return f"blocked_frac/{rule}"


def blocked_rate(rule: str, sign: str) -> str:
    """The logged name of `rule`'s block rate among tokens of advantage sign `sign` (pos or neg)."""
    if sign not in SIGNS:
        raise ValueError(f"sign must be one of {SIGNS} (A = 0 tokens are never blocked), got {sign!r}")
    if not rule or "/" in rule:
        raise ValueError(f"rule must be a non-empty name without '/', got {rule!r}")
    return f"blocked/{rule}/{sign}"


def metric(name: str) -> Metric:
    """The registry entry of `name` (a template such as blocked/<rule>/<sign> is resolved)."""
    try:
        return METRICS[_template(name)]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in the registry trustlens.metrics.METRICS") from None


def describe(name: str) -> str:
    """One line for tooltips and docs: definition, unit and verl's name."""
    m = metric(name)
    verl = f"; verl: {m.verl}" if m.verl else ""
    return f"{m.doc} ({m.unit}{verl})"


# ---- other frameworks' names (trustlens import, docs/metrics.md "Other frameworks' names") ----


@dataclass(frozen=True)
class FrameworkName:
    """A name a framework logs, the trustlens metric it is, and how the framework aggregates it
    where that differs from the trustlens definition (a max or sum under a name that reads as a
    mean, another denominator, another step axis)."""

    framework: str  # one of FRAMEWORKS
    logged: str  # the name as logged; `*` stands for any text (a data source, an environment)
    name: str  # the trustlens name (METRICS)
    note: str = ""  # how it differs from `name`'s definition; "" where it does not
    unless: str = ""  # a regex: names `logged` matches that also match this one are other metrics


# framework -> the release (or commit) whose source each of its names was read from
FRAMEWORKS: dict[str, str] = {
    "verl": "v0.7.0",
    "trl": "v1.16.0",
    "prime-rl": "559b447",
    "nemo-rl": "7ea279a",
    "openrlhf": "v0.11.0",
    "slime": "v0.3.1",
}

# prefixes a framework's loggers put before the names it logs: HF Trainer's TensorBoard and W&B
# callbacks write TRL's `reward` as `train/reward`
FRAMEWORK_PREFIXES: dict[str, tuple[str, ...]] = {"trl": ("train/",)}

_MEAN_OF_MICRO = "mean over the step's micro-batches of their token means"
FRAMEWORK_NAMES: tuple[FrameworkName, ...] = (
    FrameworkName("verl", "rollout_corr/kl", "mismatch_kl"),
    FrameworkName("verl", "rollout_corr/k3_kl", "k3_kl"),
    FrameworkName("verl", "rollout_corr/log_ppl_diff", "log_ppl_diff"),
    FrameworkName("verl", "rollout_corr/log_ppl_abs_diff", "log_ppl_abs_diff"),
    FrameworkName("verl", "rollout_corr/chi2_token", "chi2_token"),
    FrameworkName("verl", "rollout_corr/chi2_seq", "chi2_seq"),
    FrameworkName("verl", "training/rollout_probs_diff_mean", "prob_diff_mean"),
    FrameworkName("verl", "training/rollout_probs_diff_max", "prob_diff_max"),
    FrameworkName("verl", "training/rollout_actor_probs_pearson_corr", "prob_pearson"),
    FrameworkName("verl", "actor/entropy", "entropy/mean", _MEAN_OF_MICRO),
    FrameworkName("verl", "actor/pg_clipfrac", "clip_frac", _MEAN_OF_MICRO),
    FrameworkName("verl", "actor/grad_norm", "grad_norm"),
    FrameworkName("verl", "critic/score/mean", "reward/mean"),
    FrameworkName("verl", "response_length/mean", "response_length/mean"),
    FrameworkName("verl", "val-core/*/acc/mean@1", "eval/accuracy", "one name per data source: their mean is taken"),
    FrameworkName("trl", "reward", "reward/mean"),
    FrameworkName("trl", "reward_std", "reward/std"),
    FrameworkName("trl", "entropy", "entropy/mean", "mean over the logging interval's gradient-accumulation steps"),
    FrameworkName("trl", "grad_norm", "grad_norm", "HF Trainer's: the last optimizer step of the logging interval"),
    FrameworkName("trl", "clip_ratio/region_mean", "clip_frac"),
    FrameworkName("trl", "completions/mean_length", "response_length/mean"),
    FrameworkName(
        "trl", "sampling/sampling_logp_difference/mean", "logp_abs_diff_mean", "mean over ranks of each rank's mean"
    ),
    FrameworkName("trl", "sampling/sampling_logp_difference/max", "logp_abs_diff_max"),
    FrameworkName(
        "trl",
        "sampling/importance_sampling_ratio/mean",
        "is_ratio_mean",
        "mean over ranks of each rank's mean, after TRL's truncation or masking of the ratio",
    ),
    FrameworkName("trl", "sampling/importance_sampling_ratio/min", "is_ratio_min"),
    FrameworkName("trl", "sampling/importance_sampling_ratio/max", "is_ratio_max"),
    FrameworkName(
        "prime-rl",
        "mismatch_kl/all/mean",
        "k3_kl",
        "prime-rl's `mismatch_kl` is the K3 estimate ρ − 1 − log ρ (trustlens' mismatch_kl is K1), ρ from the "
        "trainer's current log-probabilities",
    ),
    FrameworkName("prime-rl", "entropy/all/mean", "entropy/mean"),
    FrameworkName("prime-rl", "optim/grad_norm", "grad_norm"),
    FrameworkName(
        "prime-rl",
        "eval/*/effective/*/avg@*",
        "eval/accuracy",
        "mean reward (the accuracy where rewards are 0/1) of the eval's k samples per problem at its sampling "
        "settings, over the traces without an error; one name per environment and agent: their mean is taken",
    ),
    FrameworkName(
        "nemo-rl",
        "train/gen_kl_error",
        "k3_kl",
        "the estimator is `reference_policy_kl_type` (k3 by default); micro-batch values normalised by the "
        "step's token count and summed",
    ),
    FrameworkName("nemo-rl", "train/reward", "reward/mean"),
    FrameworkName("nemo-rl", "train/grad_norm", "grad_norm", "a sum over the step's optimizer updates, not their mean"),
    FrameworkName("nemo-rl", "validation/accuracy", "eval/accuracy"),
    FrameworkName("openrlhf", "train/vllm_kl", "mismatch_kl"),
    FrameworkName("openrlhf", "train/ppo_clip_ratio", "clip_frac"),
    FrameworkName(
        "openrlhf", "train/actor_grad_norm", "grad_norm", "the last update's value in the step, not the mean"
    ),
    FrameworkName("openrlhf", "train/reward", "reward/mean"),
    FrameworkName("openrlhf", "train/entropy_loss", "entropy/mean", "logged only when an entropy coefficient is set"),
    FrameworkName(
        "openrlhf",
        "eval/eval_*_pass1",
        "eval/accuracy",
        "mean reward (the accuracy where rewards are 0/1) of `--eval.n_samples_per_prompt` samples per prompt "
        "at `--eval.temperature` (4 at 0.6 by default: not greedy); one name per data source: their mean is taken",
    ),
    FrameworkName(
        "slime",
        "train/train_rollout_logprob_abs_diff",
        "logp_abs_diff_mean",
        "mean over responses of each response's token mean, per optimizer step (slime's train/step)",
    ),
    FrameworkName("slime", "train/entropy_loss", "entropy/mean", "per optimizer step (slime's train/step)"),
    FrameworkName("slime", "train/pg_clipfrac", "clip_frac", "per optimizer step (slime's train/step)"),
    FrameworkName("slime", "train/grad_norm", "grad_norm", "per optimizer step (slime's train/step)"),
    FrameworkName(
        "slime",
        "eval/*",
        "eval/accuracy",
        "mean reward (the accuracy where rewards are 0/1) of `--n-samples-per-eval-prompt` samples per prompt at "
        "`--eval-temperature` (by default the rollout's, 1.0: not greedy); per rollout (slime's eval/step); "
        "one name per eval dataset: their mean is taken; `eval/step` and the names slime logs beside it "
        "(`eval/<dataset>/…`, `eval/<dataset>-truncated_ratio`, `eval/<dataset>-pass@<k>`) are not it",
        r"eval/(step|.*/.*|.*-truncated_ratio|.*-pass@\d+)",
    ),
)


def _pattern(logged: str) -> re.Pattern[str]:
    return re.compile("^" + ".+".join(re.escape(part) for part in logged.split("*")) + "$")


_PATTERNS = {(e.framework, e.logged): _pattern(e.logged) for e in FRAMEWORK_NAMES if "*" in e.logged}


def _matches(entry: FrameworkName, name: str) -> bool:
    """Whether `name` (its logger's prefix removed) is `entry`'s logged name or fills in its `*`s
    without being one of the other metrics `entry.unless` names."""
    if name == entry.logged:
        return True
    pattern = _PATTERNS.get((entry.framework, entry.logged))
    if pattern is None or pattern.match(name) is None:
        return False
    return not (entry.unless and re.fullmatch(entry.unless, name))


def framework_entry(framework: str, logged: str) -> FrameworkName | None:
    """The FRAMEWORK_NAMES entry of a name `framework` logged (its logger's prefix, if any,
    removed first), None when the table has none."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    candidates = [logged, *(logged[len(p) :] for p in FRAMEWORK_PREFIXES.get(framework, ()) if logged.startswith(p))]
    for entry in FRAMEWORK_NAMES:
        if entry.framework == framework and any(_matches(entry, c) for c in candidates):
            return entry
    return None


def trustlens_name(framework: str | None, logged: str) -> str:
    """The trustlens name of a name `framework` logged; a name the table does not know is kept
    as it is (so is every name of framework None or "trustlens")."""
    if framework in (None, "trustlens"):
        return logged
    entry = framework_entry(framework, logged)
    return logged if entry is None else entry.name


def detect_framework(names) -> str | None:
    """The framework with the most table entries among `names` ("trustlens" when the registry's
    own entries are the most); None when none has any, or two have as many. Entries, not names,
    are counted: one template (slime's `eval/*`) that takes many names counts once."""
    names = list(dict.fromkeys(names))
    counts = {f: len({framework_entry(f, n) for n in names} - {None}) for f in FRAMEWORKS}
    counts["trustlens"] = len({_template(n) for n in names} & METRICS.keys())
    best = max(counts.values())
    top = [f for f, n in counts.items() if n == best]
    return top[0] if best > 0 and len(top) == 1 else None


def framework_table() -> str:
    """The Markdown table of FRAMEWORK_NAMES (docs/metrics.md holds it as written here)."""
    lines = [
        "| framework | logged name | trustlens name | how it is aggregated, where it differs |",
        "|---|---|---|---|",
    ]
    for e in FRAMEWORK_NAMES:
        note = e.note.replace("|", "\\|") or "–"
        lines.append(f"| {e.framework} {FRAMEWORKS[e.framework]} | `{e.logged}` | `{e.name}` | {note} |")
    return "\n".join(lines) + "\n"


__all__ = [
    "FRAMEWORKS",
    "FRAMEWORK_NAMES",
    "FRAMEWORK_PREFIXES",
    "METRICS",
    "MISMATCH_METRICS",
    "SIGNS",
    "FrameworkName",
    "Metric",
    "blocked_frac",
    "blocked_rate",
    "describe",
    "detect_framework",
    "framework_entry",
    "framework_table",
    "metric",
    "trustlens_name",
]

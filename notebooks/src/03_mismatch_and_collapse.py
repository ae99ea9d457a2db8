# %% [markdown]
# # 3 · Training-inference mismatch and collapse, run against run
#
# The rollout engine that samples (μ) and the trainer that computes π_old never agree exactly
# (different precision, kernels, batching). The DPPO paper finds that runs without a trust region
# anchored on μ (PG-IS, CISPO, or one anchored on the recomputed π_old as in MiniRL) let this
# mismatch grow until they collapse, that DPPO keeps it flat, and that collapse is driven mostly
# by over-updates on negative-advantage samples. This notebook puts several runs of the same
# task, one per rule, side by side.

# %%
import polars as pl

import trustlens.analysis as A
from trustlens import plots
from trustlens.analysis.paper_findings import over_updates_per_step
from trustlens.analysis.tokens import alert_tokens
from trustlens.notebook import sample_runs, setup

setup()

# One run per rule, same task, seed and settings: the `sample` preset (the `collapse` preset on
# seed 1, recorded with sampling), where rollouts come from
# an fp8 engine whose weights are 16 steps old (`trustlens make-sample`, or `trustlens compare
# --preset collapse --rules ppo,dppo_binary_tv,pg_is` for your own). The sample's `learning` run
# has other settings and is left out.
runs = sample_runs()
runs.pop("learning", None)
POINTS = 80  # each curve drawn as at most this many step bins (means), so the saved notebook stays small
for name, run in runs.items():
    print(f"{name}: trained with {run.active_rule}, status {run.status}")

# %% [markdown]
# ## Reward and entropy
#
# The per-step signals of each run (mean reward of the step's samples, mean entropy of π).
# A run that collapses loses reward and, typically, entropy.

# %%
signals = {name: A.step_signals(run) for name, run in runs.items()}
plots.overlay_runs(signals, ["reward", "entropy"], max_points=POINTS, title="Reward and entropy per run").show()

# %% [markdown]
# ## Mismatch over steps
#
# Training-inference mismatch between μ and π_old per step (K3 estimate of KL(μ ‖ π_old) and the
# mean |π_old − μ| over sampled tokens, named as verl names them). The paper finds the run
# without a trust region drifting upward while the DPPO run stays flat. In the shipped sample the
# pg_is run's k3 rises from 0.077 to 0.245 nats (means over its first and last 25 steps) as its
# reward falls (above), while the DPPO run's goes from 0.044 to 0.057 and PPO's from 0.028 to
# 0.045 (`trustlens.analysis.run_outcomes`: k3_start, k3_end); compare trends, not single steps.
# The sample runs are recorded with sampling: the token-level means come exact from their
# aggregates (`exact_aggregates`; None for a run that recorded every token). Sequence-level
# metrics such as `log_ppl_abs_diff` need whole responses: on your own full runs, add them.

# %%
mismatch = {name: A.mismatch_per_step(run.tokens, aggregates=A.exact_aggregates(run)) for name, run in runs.items()}
plots.overlay_runs(mismatch, ["k3_kl", "prob_diff_mean"], max_points=POINTS,
                   title="Training-inference mismatch per run").show()

# %% [markdown]
# Where in μ the mismatch lives, for the run without a trust region. Per token, rare tokens
# carry far more of it, since the same logit error is a larger relative error in a small
# probability: a mean k3 of 0.49 to 15.4 nats in every bucket below μ = 0.1 (3.0 in [0.01, 0.1),
# 11.0 and 15.4 in the two below it), against 0.16 for μ ≥ 0.1. In total it is the other way round:
# the tokens with μ ≥ 0.1 are 99% of all tokens and hold 79% of the k3 summed over tokens
# (`k3_share`). These by-bucket figures have no exact form: on the sampled run they are estimates
# from the kept rows (Σ weight).

# %%
unconstrained = runs["pg_is"]
mismatch_buckets = A.mismatch_by_bucket(unconstrained.tokens)
plots.mismatch_by_bucket_bar(mismatch_buckets, "k3_kl", reason=A.mismatch_unavailable(unconstrained.tokens),
                             title=f"Mismatch by μ bucket ({unconstrained.name})").show()
k3_mass = pl.col("tokens") * pl.col("k3_kl")
mismatch_buckets.filter(pl.col("tokens") > 0).select(
    "label", "tokens", "k3_kl", (pl.col("tokens") / pl.col("tokens").sum()).alias("token_share"),
    (k3_mass / k3_mass.sum()).alias("k3_share"))

# %% [markdown]
# ## Over-updates, by the sign of the advantage
#
# An over-update is a token whose update pushed π beyond DPPO's binary-TV bound in the direction
# its advantage asks for — exactly the tokens `dppo_binary_tv` blocks. In the DPPO run they were
# blocked; in the others they were trained on. Per step, the share of A < 0 and of A > 0 tokens
# that were over-updated: the paper finds the negative side drives collapse.

# %%
over = {name: over_updates_per_step(run.tokens, "dppo_binary_tv") for name, run in runs.items()}
plots.overlay_runs(over, ["over_frac_neg", "over_frac_pos", "tv_mean_neg", "tv_mean_pos"], max_points=POINTS,
                   title="Over-updates beyond the binary-TV bound, A < 0 vs A > 0").show()

# %% [markdown]
# The same over each whole run, by advantage sign (`pos` A > 0, `neg` A < 0, `zero` A = 0). Neither
# this table nor the curves above take exact aggregates: on these sampled runs the over-updated
# (blocked) tokens are exact, since a sampled run keeps every token a recorded rule blocks, but
# the token counts they are divided by, and so the fractions, are estimates from the kept rows
# (Σ weight).

# %%
pl.concat([
    A.blocked_by_advantage_sign(run.tokens, ["dppo_binary_tv"]).select(pl.lit(name).alias("run"), pl.all())
    for name, run in runs.items()
])

# %% [markdown]
# ## Collapse alerts and the tokens behind them
#
# `detect_collapse` compares every step (a median of 3 steps) with a trailing robust baseline of
# the run itself (the median and MAD of the last 100 steps it judged healthy, warm-up steps left
# out), with no absolute thresholds, and raises a warning when entropy collapses or surges,
# mismatch grows, the gradient norm spikes, the reward drops or the block rate of the rule the run
# trains with drifts (the other rules' columns are counterfactual: context, not alerts). Only a
# confirmed fall of the outcome is critical: the reward's window mean, or held-out accuracy below
# its line (3 binomial standard errors and 10 % under the highest level of its last 10
# evaluations) at two evaluations in a row, or at one once its CUSUM has added the falls up
# (docs/alerts.md). An alert is one episode: it lasts while its condition holds. Each alert names the
# samples and tokens that drove it, strongest first. How many alerts of each kind every run raised:

# %%
alerts = {name: A.detect_collapse(run, signals=signals[name]) for name, run in runs.items()}
pl.concat([a.select(pl.lit(name).alias("run"), "kind", "severity") for name, a in alerts.items()]).pivot(
    "severity", index=["run", "kind"], values="kind", aggregate_function="len").sort("run", "kind")

# %% [markdown]
# The signals of the run with the most critical alerts, each alert marked on the panel of the
# signal it watched (hover a marker for its message), and its alerts in full.

# %%
worst = max(alerts, key=lambda name: (alerts[name]["severity"] == "critical").sum())
plots.collapse_timeline(signals[worst], alerts[worst], max_points=POINTS, title=f"Collapse signals of {worst}").show()
alerts[worst].select("step", "end_step", "kind", "severity", "message")

# %% [markdown]
# The tokens behind that run's first critical alert (its first alert when none is critical): the
# rows the detector ranked as the most extreme at the alert's first step, ready to be looked up
# in the dashboard's token inspector.

# %%
ranked = alerts[worst].sort(pl.col("severity") != "critical", "step")
if ranked.is_empty():
    print(f"{worst} raised no alert")
else:
    alert = ranked.row(0, named=True)
    print(alert["message"])
    display(alert_tokens(runs[worst].tokens, alert).select(
        "sample", "pos", "token", pl.col("mu_logp").exp().alias("mu"), pl.col("old_logp").exp().alias("pi_old"),
        pl.col("pi_logp").exp().alias("pi"), "advantage", "entropy", "blocked_dppo_binary_tv"))

# %% [markdown]
# **What to take away.** Read the runs together: the mismatch curves say whether the rollout
# engine and the trainer are drifting apart, the over-update curves say which side of the
# advantage is moving the policy too far, and each alert points at the exact tokens to inspect
# (in the dashboard's token inspector, or with `trustlens.analysis.tokens`).

# %% [markdown]
# # 2 · PPO's clip and DPPO's masks on the same tokens
#
# A recorded run holds every rule's decision for every token, so the rules can be compared
# without training once per rule: which tokens each blocks, where they disagree and on which
# tokens, whether the cheap binary divergence agrees with the top-K one, and how the masks move
# when the thresholds ε (PPO) and δ (DPPO) change.

# %%
import polars as pl

import trustlens.analysis as A
from trustlens import RULES, plots
from trustlens.analysis.paper_findings import blocked_token_anchor
from trustlens.analysis.sweep import threshold_sweep
from trustlens.analysis.tokens import TokenQuery, filter_tokens
from trustlens.notebook import sample_runs, setup

setup()

# The run trained with DPPO's binary-TV mask; every other rule was evaluated on its tokens.
runs = sample_runs()
run = runs["dppo_binary_tv"]
tokens = run.tokens
# recorded with sampling (Keep): counts over all tokens, exact, for the queries that take them
# (None for a run that recorded every token)
exact = A.exact_aggregates(run)
# the rules that can block a token (cispo and pg_is never do)
blocking = [r for r in run.rules if RULES[r].blocks]
print(f"run {run.name!r}, trained with {run.active_rule}; comparing {', '.join(blocking)}")

# %% [markdown]
# ## How much each rule blocks, step by step
#
# The share of the A ≠ 0 tokens each rule blocks, per step and (table) over the whole run, exact
# from the run's aggregates. Anchored on μ, the divergence rules are not uniformly stricter than
# PPO's ratio clip (0.0455 over the run): the binary ones block fewer tokens (TV 0.0414, KL
# 0.0387), the top-K ones more (TV 0.0551, KL 0.0561) — a top-K divergence measures the move
# over μ's top-K tokens, a finer split than the binary one's {a_t, the rest}, so it is never the
# smaller of the two. The rules anchored on the recomputed π_old block far fewer: `minirl` and
# `grpo_tis` (the same clip, so the same tokens) 0.0097, the `*_recompute` divergences 0.0047
# and 0.0026. No rate is constant: PPO's ranges from 0.0217 to 0.0750 from one step to the next.

# %%
per_step = A.blocked_per_step(tokens, blocking, aggregates=exact)
plots.blocked_per_step_lines(per_step).show()
per_step.group_by("rule", maintain_order=True).agg(
    pl.col("count").sum(), pl.col("blocked").sum(),
    pl.col("blocked_frac").min().alias("step_min"), pl.col("blocked_frac").max().alias("step_max"),
).select("rule", "count", "blocked", (pl.col("blocked") / pl.col("count")).alias("blocked_frac"), "step_min", "step_max")

# %% [markdown]
# ## Where the masks disagree
#
# Cell (row a, column b) is the fraction of the A ≠ 0 tokens (where both rules were evaluated)
# that rule a blocks and rule b lets through. The PPO rows against the DPPO columns are the
# updates PPO suppresses and DPPO keeps; the DPPO rows against the PPO columns are moves PPO
# leaves unchecked. The binary and top-K versions of one divergence disagree in one direction
# only: the top-K one blocks every token the binary one blocks (a 0 cell), and some more. The
# matrix takes no exact aggregates: on this sampled run the blocked tokens are exact (a sampled
# run keeps every token a recorded rule blocks) but the A ≠ 0 tokens they are divided by are
# estimated from the kept rows (Σ weight); the per-step lines after it are exact.

# %%
plots.confusion_heatmap(A.confusion_matrix(tokens, blocking)).show()

# %%
plots.confusion_lines(A.rule_confusion(tokens, "ppo", "dppo_binary_tv", aggregates=exact), "ppo",
                      "dppo_binary_tv").show()

# %% [markdown]
# ## On which tokens they disagree
#
# The tokens only PPO blocks, with where they sit in μ — expect rare ones (small `mu_median`) —
# and the tokens only DPPO blocks, likely ones whose probability moved a lot while the ratio
# stayed within 1 ± ε. On a short run the second list can be short or empty: a likely token must
# fall by more than δ yet keep π/μ above 1 − ε, which needs μ > δ/ε (0.5 here: δ = 0.1, ε = 0.2).

# %%
only_ppo = filter_tokens(tokens, TokenQuery(decisions=(("ppo", True), ("dppo_binary_tv", False))))
blocked_token_anchor(only_ppo, "ppo", top=10)

# %%
only_dppo = filter_tokens(tokens, TokenQuery(decisions=(("ppo", False), ("dppo_binary_tv", True))))
blocked_token_anchor(only_dppo, "dppo_binary_tv", top=10)

# %% [markdown]
# ## Binary vs top-K
#
# Agreement of each binary rule with its top-K counterpart over the whole run: the share of the
# A ≠ 0 tokens both block or both let through, exact from the run's aggregates. Values close to
# 1 mean the binary divergence, which needs only μ(a_t) and π(a_t), makes the same decisions as
# the top-K one, which needs μ's top-K distribution at every position. Here `only_a` is 0 and
# `only_b` is not: where they differ, the top-K rule blocks and the binary one does not.

# %%
pairs = [("dppo_binary_tv", "dppo_topk_tv"), ("dppo_binary_kl", "dppo_topk_kl")]
pl.concat([
    A.rule_confusion(tokens, a, b, per_step=False, aggregates=exact).select(pl.lit(a).alias("binary"), pl.lit(b).alias("top_k"), pl.all())
    for a, b in pairs
])

# %% [markdown]
# ## Moving the thresholds
#
# Every rule re-evaluated with its thresholds scaled from ¼ to 4 times the run's (ε = 0.2 for
# PPO, δ = 0.1 for the TV rules — the collapse preset's bound — and 0.05 nats for binary KL at
# scale 1), for tokens with A > 0 (the `high` side) and A < 0 (the `low` side); the A = 0 tokens,
# which no rule blocks, are counted apart (`count_zero`). Scale 1 reproduces the recorded
# decisions. Every mask shrinks as its thresholds grow; what the next figures show is *where*
# each one shrinks. The sweep re-decides the kept rows and has no exact form: on this sampled run
# its counts and fractions are estimates from the kept rows (Σ weight) — at scale 1, PPO's
# blocked_frac of 0.0449 against the exact 0.0455 of the table above.

# %%
sweep = threshold_sweep(tokens, ["ppo", "dppo_binary_tv", "dppo_binary_kl", "dppo_topk_tv"], base=run.rules)
sweep.select("rule", "scale", "low", "high", "blocked_frac", "blocked_frac_pos", "blocked_frac_neg", "count_zero")

# %%
fig = plots.overlay_runs({rule: part for (rule,), part in sweep.group_by("rule", maintain_order=True)},
                         ["blocked_frac_pos", "blocked_frac_neg"], x="scale",
                         title="Blocked fraction as the thresholds scale")
fig.update_xaxes(type="log", tickvals=sweep["scale"].unique().sort().to_list()).show()

# %% [markdown]
# Where in μ each threshold bites: PPO at ε/2, ε and 2ε (left), DPPO's binary TV at δ/2, δ and 2δ
# (right). Changing ε moves PPO's mask up and down but it stays on the rare tokens; changing δ
# changes how far down in μ the TV mask reaches, from the likely tokens down.

# %%
by_bucket = threshold_sweep(tokens, ["ppo", "dppo_binary_tv"], scales=(0.5, 1.0, 2.0), base=run.rules,
                            by_bucket=True)
for rule, symbol in (("ppo", "ε"), ("dppo_binary_tv", "δ")):
    part = by_bucket.filter(pl.col("rule") == rule).with_columns(
        pl.format("{} at {}×{}", "rule", "scale", pl.lit(symbol)).alias("rule"))
    plots.blocked_by_bucket_bar(part, title=f"{rule}: blocked fraction by μ bucket as {symbol} scales").show()

# %% [markdown]
# **What to take away.** The ratio clip and the divergence masks are not stricter or looser
# versions of each other: they block different tokens, and no choice of ε makes PPO's mask look
# like DPPO's. Notebook 3 follows what that does to a run over time.

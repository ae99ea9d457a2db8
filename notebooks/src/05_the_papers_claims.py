# %% [markdown]
# # 5 · The DPPO paper's six claims, measured
#
# `trustlens claims` trains several rules over several seeds and measures the six claims of the
# DPPO paper on them (C1 PPO's blocked tokens are low-μ, C2 DPPO learns at least as fast as PPO,
# C3 no trust region → mismatch grows, then collapse, C4 a π_old anchor is worse than a μ anchor,
# C5 Binary ≈ Top-K, C6 collapse is driven by negative-advantage updates), each with a verdict,
# the numbers behind it and a figure. The measured report of this repository is `docs/claims.md`.
#
# Here the same measurement runs on the small shipped sample runs (the `collapse` preset on one
# seed, recorded with sampling): one seed per rule, so every standard error is missing and the
# verdicts only show how the measurement works. For verdicts you can trust, run `trustlens claims
# --jobs 2` (three seeds; 36 minutes on 2 cores, measured).

# %%
import polars as pl

from trustlens.analysis.claims import alert_leads, measure_claims
from trustlens.analysis.seed_text import format_seed_table
from trustlens.analysis.seeds import run_outcomes, seed_table
from trustlens.notebook import sample_runs, setup

setup()
named = sample_runs()
learning = named.pop("learning", None)  # the default preset's run: other settings, not a seed of these
runs = list(named.values())
outcomes = run_outcomes(runs)
outcomes.select(
    "run", "acc_start", "acc_final", "collapse_step", "collapse_cause", "first_critical", "first_critical_kind", "lead"
)

# %% [markdown]
# Beside them the sample holds `learning`, the run `trustlens demo` trains (the default preset,
# a fresh engine): its held-out accuracy from the start to the end of the run.

# %%
if learning is not None:
    display(run_outcomes([learning]).select("run", "acc_start", "acc_final", "acc_best"))

# %% [markdown]
# ## Per rule: the `trustlens compare` table
#
# Mean ± standard error over seeds of the held-out accuracy, the steps to collapse, the block rate
# of the run's own rule (over A ≠ 0 tokens, and among tokens with μ < 0.1) and the k3 / TV
# mismatch at the start and the end of the run.

# %%
print(format_seed_table(seed_table(outcomes)))

# %% [markdown]
# ## The claims
#
# One line each: the verdict ("holds", "does not hold at this scale" or "untestable") and the
# numbers. Claims that need runs the sample does not have (Top-K, the recomputed anchor) are
# untestable here.

# %%
claims = measure_claims(runs)
for claim in claims:
    print(claim.line())

# %% [markdown]
# ## C1: where PPO's clip bites
#
# The block rate of PPO's ratio clip among low-μ tokens against the rest, beside DPPO's
# divergence bound on the same tokens.

# %%
claims[0].figure.show()

# %% [markdown]
# ## C3: mismatch over the run, per rule

# %%
claims[2].figure.show()

# %% [markdown]
# ## Did the collapse alerts come in time?
#
# For each collapsing run, the first critical alert of `trustlens.analysis.detect_collapse` and
# how many steps before the collapse it came; runs that did not collapse should have none. A run
# whose lowest evaluation lies within two standard errors of the collapse line (`line_margin`)
# could well have gone the other way on another draw of held-out problems, so the counts are
# given again over the other runs.

# %%
print(alert_leads(outcomes))
pl.DataFrame({"claim": [c.key for c in claims], "verdict": [c.verdict for c in claims]})

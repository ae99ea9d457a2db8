# %% [markdown]
# # 1 · Which tokens does PPO clip?
#
# PPO (and GRPO) block a token's update when its ratio π/μ leaves [1 − ε, 1 + ε]. For a token
# the rollout engine sampled with a small probability μ, a tiny move in probability is a large
# ratio, so the clip falls mostly on rare tokens — in the DPPO paper, numbers and reasoning words
# such as "Wait" and "Thus". DPPO bounds the move in probability itself (|π − μ| ≤ δ, or a KL).
# This notebook finds both effects among the tokens of a recorded run.
#
# Every rule was evaluated on every token while the run was recorded (`blocked_<rule>` columns),
# whichever rule it trained with, so PPO and DPPO are compared on exactly the same tokens.

# %%
import polars as pl
from IPython.display import HTML

import trustlens.analysis as A
from trustlens import plots
from trustlens.analysis.paper_findings import blocked_anchor_quantiles, blocked_token_anchor, motivating_examples
from trustlens.analysis.tokens import sample_tokens
from trustlens.notebook import sample_runs, setup
from trustlens.core.render import colored_tokens_html, legend_html

setup()

# The shipped sample holds one run per rule (and `learning`, a run of the default settings);
# this notebook reads the one trained with PPO.
# To analyse your own run: run = trustlens.load_run("path/to/run")
runs = sample_runs()
run = runs["ppo"]
tokens = run.tokens
# a sampled run keeps only some token rows: its exact counts come from its aggregates
summary = A.step_summary(tokens, aggregates=A.exact_aggregates(run))
rows = tokens.select(pl.len()).collect().item()
print(f"run {run.name!r}: trained with {run.active_rule}, {summary['tokens'].sum():,} tokens over "
      f"{summary.height} steps ({rows:,} token rows kept); rules evaluated: {', '.join(run.rules)}")

# %% [markdown]
# ## Where in μ the clip bites
#
# The fraction of tokens each rule blocks, by the probability μ the rollout engine gave the
# sampled token. Expect PPO's blocked fraction to be many times higher in the tail (μ below 0.1)
# than among likely tokens — a small μ turns any move into a large ratio — while the divergence
# rules block almost nothing in the tail and act, if at all, on likely tokens, where a change of
# probability is a large move of the distribution.

# %%
compared = ["ppo", "ppo_clip_higher", "dppo_binary_tv", "dppo_binary_kl"]
by_bucket = A.blocked_by_bucket(tokens, compared)
plots.blocked_by_bucket_bar(by_bucket).show()

# %% [markdown]
# The same in one table: the μ of the tokens each rule blocks, against all tokens (quantiles of
# the probability). PPO's blocked tokens should sit far below the typical token.

# %%
blocked_anchor_quantiles(tokens, compared)

# %% [markdown]
# ## The tokens PPO blocks most
#
# The token texts with the most PPO-blocked updates, with the median μ of all their occurrences
# and of the blocked ones. In the paper's math reasoning runs these are numbers and words such
# as "Wait" and "Thus"; in the arithmetic task of the built-in run they are the numbers of the
# intermediate results. Either way they are the tokens where the model chooses its path, the
# ones RL most needs to move. Compare the two medians: even for a token that is near-certain in
# most of its occurrences, the occurrences PPO blocks are the ones where μ was low. (Token text
# is the model's: tables show it as plain text.)

# %%
blocked_token_anchor(tokens, "ppo", top=15)

# %%
plots.blocked_tokens_bar(A.blocked_by_token(tokens, ["ppo", "dppo_binary_tv"], top=15), top=15).show()

# %% [markdown]
# ## The paper's Figure 1 on this run
#
# Each token placed by its μ (x) and by how far the update moved it: the ratio π/μ (left) and
# the binary TV |π − μ| (right). The lines are where each rule starts to block (solid for A > 0,
# dashed for A ≤ 0). PPO's bounds are flat in the ratio plane but, read as a move in probability
# (right), they shrink to nothing as μ → 0; the TV rule's bound is flat on the right and allows
# ever larger ratios for rare tokens on the left.

# %%
ratio_density = A.figure1_density(tokens, "ratio", rules=["ppo"], n_x=40, n_y=30)
tv_density = A.figure1_density(tokens, "binary_tv", rules=["ppo"], n_x=40, n_y=30)
boundaries = A.rule_boundaries({r: run.rules[r] for r in ("ppo", "dppo_binary_tv", "dppo_binary_kl")}, n=80)
plots.figure1(ratio_density, tv_density, boundaries, rule="ppo").show()

# %% [markdown]
# ## The two motivating examples, among real tokens
#
# The paper motivates DPPO with two cases; here are the run's own tokens closest to them:
#
# * **a rare token pushed up** (A > 0): the ratio is large because μ is tiny, so PPO blocks the
#   update although the probability moved by almost nothing (small `binary_tv`); the TV bound
#   lets it learn.
# * **a near-certain token pushed down** (A < 0): the probability fell by a lot, yet the ratio
#   stays above 1 − ε, so PPO lets the update through; this is the unconstrained move the paper
#   links to instability.

# %%
examples = motivating_examples(tokens, "ppo", "dppo_binary_tv", n=3)
examples

# %% [markdown]
# The responses the first example of each case comes from, each token coloured by its ratio π/μ
# (blue above 1, red below) and outlined where a rule blocks it; hover a token for its numbers.
# The text is the model's and is shown escaped.

# %%
shown = ["ppo", "dppo_binary_tv"]
display(HTML(legend_html(shown, quantity="ratio")))
for example in examples.unique("case", keep="first", maintain_order=True).iter_rows(named=True):
    response = sample_tokens(tokens, example["sample"], step=example["step"], update=example["update"])
    print(f"{example['case']}: position {example['pos']} of sample {example['sample']}, step {example['step']}")
    display(HTML(colored_tokens_html(
        response["token"].to_list(), response["ratio"].to_list(), quantity="ratio",
        blocked={r: response[f"blocked_{r}"].to_list() for r in shown},
        hover={"μ": response["mu_logp"].exp().to_list(), "π": response["pi_logp"].exp().to_list(),
               "advantage": response["advantage"].to_list()},
        positions=response["pos"].to_list(),  # … marks positions a sampled run did not keep
    )))
if examples.is_empty():
    print("no token of this run matches either case")

# %% [markdown]
# **What to take away.** On this run PPO spends its clipping on the long tail of μ, exactly where
# the ratio is a noisy measure of how far the policy moved, and lets large moves of likely tokens
# through. Notebook 2 compares the masks of all rules and sweeps their thresholds.

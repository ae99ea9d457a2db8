"""benchmarks/corrections.py's Jaccard table on a recorded run: each rule's blocked set against DPPO
binary TV's over the A ≠ 0 tokens, counted by hand here."""

import polars as pl
import torch
from benchmark_scripts import load

from trustlens import TokenRecorder, load_run


def test_jaccard_table_counts_the_overlap_with_dppo(tmp_path, gen):
    b, t = 8, 12
    mu = torch.log_softmax(torch.randn(b, t, 5, generator=gen) * 2, -1)[..., 0]
    old = (mu + 0.2 * torch.randn(b, t, generator=gen)).clamp(max=-1e-3)
    pi = (old + 0.3 * torch.randn(b, t, generator=gen)).clamp(max=-1e-3)
    folder = tmp_path / "collapse"
    with TokenRecorder(folder / "dppo", rules=["dppo_binary_tv", "ppo", "gspo"], active_rule="dppo_binary_tv") as rec:
        rec.record(
            0,
            token_ids=torch.zeros(b, t, dtype=torch.long),
            response_mask=torch.ones(b, t, dtype=torch.bool),
            pi_logp=pi,
            mu_logp=mu,
            old_logp=old,
            advantages=torch.randn(b, generator=gen),
        )
    got = load("corrections").jaccard_table(folder)
    tokens = load_run(folder / "dppo").tokens.collect().filter(pl.col("advantage") != 0)
    ref = tokens["blocked_dppo_binary_tv"]
    for row in got.iter_rows(named=True):
        col = tokens[f"blocked_{row['rule']}"]
        assert row["blocked"] == col.sum() and row["blocked_frac"] == col.sum() / tokens.height
        assert row["jaccard"] == (col & ref).sum() / (col | ref).sum(), row["rule"]
    assert got.filter(pl.col("rule") == "dppo_binary_tv")["jaccard"].item() == 1.0

"""The per-response statistics of a recorded run: exact sums over every token of a response, kept
on the rows a sampled run (`Keep`) stores, so that the sequence rules are decided again from the
stored columns (with_rules, threshold_sweep) exactly as the recorder decided them."""

import numpy as np
import polars as pl
import pytest
import torch

from trustlens import Keep, TokenRecorder, load_run
from trustlens.analysis import threshold_sweep, with_rules
from trustlens.record.sequence_stats import sequence_statistics
from trustlens.rules import RULES, evaluate_all
from trustlens.run import blocked_column

SEQUENCE_RULES = [n for n, r in RULES.items() if r.level == "sequence"]


def _batch(gen, b=12, t=30):
    mu = torch.log_softmax(torch.randn(b, t, 6, generator=gen) * 2, -1)[..., 0]
    old = (mu + 0.05 * torch.randn(b, t, generator=gen)).clamp(max=-1e-3)
    pi = (old + 0.05 * torch.randn(b, t, generator=gen)).clamp(max=-1e-3)
    lengths = torch.randint(5, t + 1, (b, 1), generator=gen)
    return dict(
        token_ids=torch.randint(0, 50, (b, t), generator=gen),
        response_mask=torch.arange(t) < lengths,
        pi_logp=pi,
        mu_logp=mu,
        old_logp=old,
        advantages=torch.randn(b, generator=gen),
    )


def test_statistics_are_float64_sums_of_the_stored_values():
    sample = np.array([7, 7, 3, 7, 3])
    pi = np.array([-0.1, -0.2, -0.3, -0.4, -np.inf], np.float32)
    mu = np.array([-0.2, -0.2, -0.1, -0.5, -np.inf], np.float32)
    old = np.array([-0.1, -0.3, -0.3, -0.4, -1.0], np.float32)
    got = sequence_statistics(sample, pi, mu, old)
    p, m = pi.astype(np.float64), mu.astype(np.float64)
    s7 = (p[0] - m[0]) + (p[1] - m[1]) + (p[3] - m[3])
    assert got["seq_logratio_mu"][[0, 1, 3]].tolist() == pytest.approx([s7] * 3, rel=1e-15)
    assert np.isnan(got["seq_logratio_mu"][[2, 4]]).all()  # −inf − (−inf): a response no policy can produce
    assert got["seq_logratio_old"][2] == -np.inf and got["seq_tokens"].tolist() == [3, 3, 2, 3, 2]
    assert sequence_statistics(sample, pi, mu, None)["seq_logratio_old"] is None


def test_sampled_run_decides_sequence_rules_exactly(tmp_path, gen):
    batch = _batch(gen)
    # a sampled run keeps every row a recorded rule blocks: record few rules, decide the rest again
    with TokenRecorder(tmp_path / "run", rules=["ppo", "rs_seq"], keep=Keep(rate=0.05, low_mu=1e-3)) as rec:
        rec.record(0, **batch)
    run = load_run(tmp_path / "run")
    tokens = run.tokens.collect().sort("sample", "pos")
    mask = batch["response_mask"]
    assert tokens.height < int(mask.sum()) // 2  # a sample of the rows
    # each kept row carries its whole response's sums, not those of the kept rows
    rows = (torch.from_numpy(tokens["sample"].to_numpy().copy()), torch.from_numpy(tokens["pos"].to_numpy().copy()))
    full = torch.where(mask, batch["pi_logp"].double() - batch["mu_logp"].double(), 0.0).sum(1)
    np.testing.assert_allclose(tokens["seq_logratio_mu"].to_numpy(), full[rows[0]].numpy(), rtol=1e-6)
    assert tokens["seq_tokens"].to_list() == mask.sum(1)[rows[0]].tolist()
    # the recorder's decision and with_rules' decisions from the stored columns alone equal
    # evaluate_all on every token of the full tensors
    want = evaluate_all(SEQUENCE_RULES, **{k: v for k, v in batch.items() if k != "token_ids"})
    assert tokens[blocked_column("rs_seq")].to_list() == want["rs_seq"][rows].tolist()
    again = with_rules(run, ["gspo", "rs_geo"]).collect().sort("sample", "pos")
    for name in ("gspo", "rs_geo"):
        assert again[blocked_column(name)].to_list() == want[name][rows].tolist(), name
        assert 0 < int(want[name][mask].sum()) < int(mask.sum()), name  # both decisions met
    # threshold_sweep at scale 1 counts the weighted rows those decisions block
    swept = threshold_sweep(run, ["gspo", "rs_geo"], scales=[1.0])
    weight = again["weight"].to_numpy()
    for name in ("gspo", "rs_geo"):
        blocked = again[blocked_column(name)].to_numpy() & (again["advantage"].to_numpy() != 0)
        assert swept.filter(pl.col("rule") == name)["blocked"].item() == round(float(weight[blocked].sum())), name


def test_with_rules_on_a_table_without_statistics_says_what_to_record():
    tokens = pl.LazyFrame({"pi_logp": [-0.1], "mu_logp": [-0.2], "old_logp": [-0.2], "advantage": [1.0]})
    with pytest.raises(ValueError, match=r"'gspo' decides per response .*seq_logratio_old.* record the run with"):
        with_rules(tokens, ["gspo"])
    with pytest.raises(ValueError, match=r"'rs_seq' decides per response"):
        threshold_sweep(tokens, ["rs_seq"])

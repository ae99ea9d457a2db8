"""A (step, update, sample) keys the token rows once per rank: a caller's id given again is refused,
unless its sample writes no row (a re-run micro-batch whose rows are masked out)."""

import polars as pl
import pytest
import torch

from trustlens import TokenRecorder


def _args(mask):
    return dict(
        token_ids=torch.tensor([[3, 4], [5, 6]]),
        response_mask=mask,
        pi_logp=torch.full((2, 2), -1.0),
        mu_logp=torch.full((2, 2), -1.1),
        advantages=torch.tensor([1.0, -1.0]),
    )


def test_a_masked_out_sample_may_repeat_its_id(tmp_path):
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        assert rec.record(0, sample_ids=[10, 11], **_args(torch.ones(2, 2, dtype=torch.bool))) == 4
        # the same micro-batch again with every row masked out: nothing written, nothing refused
        assert rec.record(0, sample_ids=[10, 11], **_args(torch.zeros(2, 2, dtype=torch.bool))) == 0
        # one sample masked out, one new: only the new one writes rows
        mask = torch.tensor([[False, False], [True, True]])
        assert rec.record(0, sample_ids=[10, 12], **_args(mask)) == 2
        with pytest.raises(ValueError, match=r"sample_ids 12 were recorded before at step 0, update 0"):
            rec.record(0, sample_ids=[13, 12], **_args(torch.ones(2, 2, dtype=torch.bool)))
    tokens = pl.read_parquet(tmp_path / "run" / "tokens")
    keys = tokens.select("step", "update", "sample", "pos")
    assert keys.unique().height == keys.height == 6

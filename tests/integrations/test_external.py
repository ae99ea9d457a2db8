"""trustlens.integrations._external: content sample ids, the rule set an external trainer feeds,
and a worker's step / update / dedup bookkeeping (no verl or OpenRLHF needed)."""

import math

import numpy as np
import polars as pl
import torch

from trustlens.integrations._external import (
    WorkerRecording,
    content_id,
    external_rules,
    numeric_metrics,
    padded_sequences,
    sample_ids,
)


def test_sample_ids_are_content_hashes_and_number_repeats():
    a, b = torch.tensor([5, 6, 7, 8]), torch.tensor([5, 6, 9])
    samples, groups = sample_ids([a, b, a.clone()], [2, 2, 2])
    assert samples[0] == content_id(a) != samples[2] and samples[1] == content_id(b)
    assert groups == [content_id(a[:2])] * 3  # one prompt, one group
    assert sample_ids([a], [2])[0] == [samples[0]]  # the same on another call (another process)
    assert all(0 <= s < 2**62 for s in samples)


def test_padded_sequences_drop_padding_on_both_sides():
    ids = torch.tensor([[0, 3, 4, 7, 8, 0], [1, 2, 3, 9, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    seqs, prompt_lengths = padded_sequences(ids, mask, response_len=3)
    assert [s.tolist() for s in seqs] == [[3, 4, 7, 8], [1, 2, 3, 9]]
    assert prompt_lengths == [2, 3]


def test_external_rules_leave_out_top_k_and_take_the_trainer_thresholds():
    rules = {r.name: r for r in external_rules("minirl", 0.1, 0.3)}
    assert "dppo_topk_tv" not in rules and "dppo_topk_kl" not in rules
    assert (rules["minirl"].low, rules["minirl"].high) == (0.1, 0.3)
    assert rules["ppo"].high == 0.2
    assert len(external_rules(None, None, None)) == len(rules)


def test_numeric_metrics_keep_finite_numbers_only():
    got = numeric_metrics(
        {"a": 1, "b": torch.tensor(2.5), "c": "text", "d": math.inf, "e": True, "f": np.float32(3)}, "x/"
    )
    assert got == {"x/a": 1.0, "x/b": 2.5, "x/f": 3.0}


def test_worker_records_each_sample_once_per_update(tmp_path):
    worker = WorkerRecording(1, 2, external_rules("minirl", 0.2, 0.2), "minirl")
    seqs = [torch.tensor([1, 2, 3, 4]), torch.tensor([1, 5, 6])]
    tensors = dict(
        token_ids=torch.tensor([[3, 4], [5, 6]]),
        pi_logp=torch.full((2, 2), -1.0),
        old_logp=torch.full((2, 2), -1.1),
        advantages=torch.tensor([1.0, -1.0]),
    )
    worker.begin_step(7)
    assert worker.record(str(tmp_path), seqs, [2, 1], response_mask=torch.ones(2, 2), **tensors) == 4
    assert worker.record(str(tmp_path), seqs, [2, 1], response_mask=torch.ones(2, 2), **tensors) == 0  # re-run
    worker.next_update()
    assert worker.record(str(tmp_path), seqs, [2, 1], response_mask=torch.ones(2, 2), **tensors) == 4
    worker.begin_step(None)  # no step from the driver: the next one
    assert worker.step == 8 and worker.update == 0
    worker.close()
    tokens = pl.read_parquet(tmp_path / "tokens" / "rank=1")
    assert sorted(tokens.select("step", "update").unique().rows()) == [(7, 0), (7, 1)]
    assert tokens["sample"].unique().sort().to_list() == sorted(sample_ids(seqs, [2, 1])[0])


def test_closing_run_marks_the_run_finished_or_failed(tmp_path):
    import pytest

    from trustlens import TokenRecorder, load_run
    from trustlens.integrations._external import closing_run

    class Trainer:
        def fit(self, fail):
            if fail:
                raise RuntimeError("worker died")
            return "done"

    for fail, status in ((False, "finished"), (True, "failed")):
        state = {"driver": TokenRecorder(tmp_path / status, rank=0, world_size=1)}
        state["driver"].log_metrics(1, {"x": 1.0})
        fit = closing_run(Trainer.fit, state)
        if fail:
            with pytest.raises(RuntimeError, match="worker died"):
                fit(Trainer(), fail)
        else:
            assert fit(Trainer(), fail) == "done"
        assert state["driver"] is None
        assert load_run(tmp_path / status).manifest["status"] == status

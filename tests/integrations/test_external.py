"""trustlens.integrations._ray_hooks: content sample ids, the rule set an external trainer feeds,
and a worker's step / update / dedup bookkeeping (no verl or OpenRLHF needed)."""

import math

import numpy as np
import polars as pl
import pytest
import torch

from trustlens import TokenRecorder, load_run
from trustlens.integrations import ActiveRule
from trustlens.integrations._ray_hooks import (
    WorkerRecording,
    content_id,
    external_rules,
    id_list,
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
    rules = {r.name: r for r in external_rules(ActiveRule("minirl", 0.1, 0.3))}
    assert "dppo_topk_tv" not in rules and "dppo_topk_kl" not in rules
    assert (rules["minirl"].low, rules["minirl"].high) == (0.1, 0.3)
    assert rules["ppo"].high == 0.2
    assert len(external_rules(ActiveRule(None))) == len(rules)


def test_numeric_metrics_keep_finite_numbers_only():
    got = numeric_metrics(
        {"a": 1, "b": torch.tensor(2.5), "c": "text", "d": math.inf, "e": True, "f": np.float32(3)}, "x/"
    )
    assert got == {"x/a": 1.0, "x/b": 2.5, "x/f": 3.0}


def test_worker_records_each_sample_once_per_update(tmp_path):
    worker = WorkerRecording(1, 2, external_rules(ActiveRule("minirl", 0.2, 0.2)), "minirl")
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


def _two_copies_on_two_workers(run_dir, send_ids: bool) -> pl.DataFrame:
    """One prompt answered twice with the same response: the driver numbers both copies of the
    step, verl / OpenRLHF hand one to each of two workers. Returns the tokens joined to the
    driver's samples."""
    prompt, response = torch.tensor([5, 6, 7]), torch.tensor([9, 9, 2])
    seq = torch.cat([prompt, response])
    rules = external_rules(ActiveRule("minirl"))
    driver = TokenRecorder(run_dir, rank=0, world_size=3, rules=rules, active_rule="minirl")
    ids, groups = sample_ids([seq, seq], [3, 3])
    driver.log_samples(
        1,
        prompts=["p", "p"],
        responses=["r", "r"],
        rewards=[1.0, 1.0],
        advantages=[0.5, 0.5],
        lengths=[3, 3],
        sample_ids=ids,
        group_ids=groups,
    )
    for rank, sent in ((1, ids[:1]), (2, ids[1:])):
        worker = WorkerRecording(rank, 3, rules, "minirl")
        worker.begin_step(1)
        logp = torch.full((1, 3), -0.5)
        worker.record(
            str(run_dir),
            [seq],
            [3],
            ids=sent if send_ids else None,
            token_ids=response[None],
            response_mask=torch.ones(1, 3, dtype=torch.bool),
            pi_logp=logp,
            old_logp=logp,
            mu_logp=logp,
            advantages=torch.full((1, 3), 0.5),
        )
        worker.close()
    driver.close()
    run = load_run(run_dir)
    return run.tokens.collect().join(run.samples.collect(), on=["step", "sample"], how="full", coalesce=True)


def test_identical_samples_on_two_workers_keep_the_driver_s_ids(tmp_path):
    """Ids sent with the batch: each copy's rows under its own id, once."""
    rows = _two_copies_on_two_workers(tmp_path / "sent", send_ids=True)
    assert rows["pos"].null_count() == 0 and rows["length"].null_count() == 0  # every token and sample joined
    assert rows.select("step", "update", "sample", "pos").is_duplicated().sum() == 0
    per_sample = rows.group_by("sample").agg(pl.len(), pl.col("length").first(), pl.col("rank").n_unique())
    assert (per_sample["len"] == per_sample["length"]).all() and (per_sample["rank"] == 1).all()
    # the fallback (no ids sent: content ids) cannot tell the copies apart: its documented limit
    fallback = _two_copies_on_two_workers(tmp_path / "fallback", send_ids=False)
    assert fallback.select("step", "update", "sample", "pos").drop_nulls().is_duplicated().sum() == 6
    assert fallback["pos"].null_count() == 1  # the second copy's samples row has no tokens


def test_worker_records_rows_under_the_ids_they_came_with(tmp_path):
    worker = WorkerRecording(1, 2, external_rules(ActiveRule("minirl", 0.2, 0.2)), "minirl")
    seqs = [torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 3, 4])]  # identical rows, distinct ids
    tensors = dict(
        token_ids=torch.tensor([[3, 4], [3, 4]]),
        pi_logp=torch.full((2, 2), -1.0),
        old_logp=torch.full((2, 2), -1.1),
        advantages=torch.tensor([1.0, 1.0]),
    )
    worker.begin_step(3)
    assert worker.record(str(tmp_path), seqs, [2, 2], ids=[11, 12], response_mask=torch.ones(2, 2), **tensors) == 4
    assert worker.record(str(tmp_path), seqs, [2, 2], ids=[11, 12], response_mask=torch.ones(2, 2), **tensors) == 0
    with pytest.raises(ValueError, match="1 sample ids came with a micro-batch of 2 rows"):
        worker.record(str(tmp_path), seqs, [2, 2], ids=[13], response_mask=torch.ones(2, 2), **tensors)
    worker.close()
    tokens = pl.read_parquet(tmp_path / "tokens" / "rank=1")
    assert sorted(tokens["sample"].unique().to_list()) == [11, 12]
    assert tokens["group"].unique().to_list() == [content_id(seqs[0][:2])]


def test_id_list_reads_ids_as_trainers_carry_them():
    assert id_list(None) is None
    assert id_list(torch.tensor([3, 2**61])) == [3, 2**61]
    assert id_list([torch.tensor(4), torch.tensor(5)]) == [4, 5]  # OpenRLHF's info after its collate
    assert id_list(np.array([6])) == [6]


def test_closing_run_marks_the_run_finished_or_failed(tmp_path):
    from trustlens.integrations._ray_hooks import closing_run

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

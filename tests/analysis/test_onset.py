import polars as pl
import pytest

from trustlens.analysis.collapse.onset import collapse_onset, collapse_window, evaluations


def test_collapse_onset_by_hand():
    assert collapse_window(12) == 5 and collapse_window(100) == 10 and collapse_window(64) == 6
    acc = [(0, 0.4), (10, 0.25), (20, 0.19), (30, 0.1)]
    assert collapse_onset(acc, []) == (20, "accuracy")  # 0.19 < 0.2, the first below half of 0.4
    # reward windows of 2: first mean 1.0; trailing means 1, 0.75, 0.5, 0.25 → step 5 (0.25 < 0.5)
    reward = [(0, 1.0), (1, 1.0), (2, 1.0), (3, 0.5), (4, 0.5), (5, 0.0)]
    assert collapse_onset([], reward, window=2) == (5, "reward")
    assert collapse_onset(acc, reward, window=2) == (5, "reward")
    assert collapse_onset([(0, 0.4), (10, 0.21)], [(s, 1.0) for s in range(20)]) == (None, None)
    with pytest.raises(ValueError, match="window"):
        collapse_onset([], reward, window=0)


def test_evaluations_are_the_accuracy_metric_averaged_over_ranks():
    metrics = pl.LazyFrame(
        {
            "step": [10, 10, 0, 0, 0, 10],
            "rank": [0, 1, 0, 1, 0, 0],
            "name": ["eval/accuracy"] * 4 + ["eval/accuracy_sampled", "val/eval/accuracy"],
            "value": [0.3, 0.5, 0.4, 0.4, 0.9, 0.9],
        }
    )
    # only the metric named eval/accuracy (not _sampled, not a longer name), in step order
    assert evaluations(metrics).collect().rows() == [(0, 0.4), (10, 0.4)]

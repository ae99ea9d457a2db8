import polars as pl

from trustlens.analysis import responses_blocked


def test_a_response_counts_once_however_many_of_its_rows_are_blocked():
    tokens = pl.LazyFrame(
        {
            "step": [0, 0, 0, 0, 0, 1, 1],
            "update": [0, 0, 0, 0, 1, 0, 0],
            "sample": [1, 1, 2, 2, 1, 3, 3],
            "advantage": [1.0, 1.0, -1.0, -1.0, 1.0, 0.0, 0.0],
            "blocked_gspo": [True, True, False, False, True, False, False],
            "blocked_ppo": [True, False, None, None, False, True, True],
        }
    )
    got = responses_blocked(tokens, ["gspo", "ppo"]).rows()
    # (step, update, sample) = (0, 0, 1) and (0, 1, 1) are two responses; sample 3 has A = 0
    assert got == [("gspo", 3, 2, 2 / 3), ("ppo", 2, 1, 0.5)]

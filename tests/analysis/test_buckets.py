import polars as pl
import pytest
from polars.testing import assert_frame_equal

from trustlens.analysis import buckets
from trustlens.analysis.buckets import collect, in_memory, reused


def _query() -> pl.LazyFrame:
    rows = pl.DataFrame({"step": [0, 0, 1, 1, 1], "x": [1.0, 3.0, 2.0, 4.0, 6.0]})
    return rows.lazy().group_by("step").agg(pl.col("x").mean()).sort("step")


def test_in_memory_gives_the_streaming_engines_result():
    with in_memory():
        small = collect(_query())
    assert_frame_equal(small, collect(_query()))
    assert small["x"].to_list() == [2.0, 4.0]


def test_in_memory_ends_with_its_block_even_on_an_error():
    with pytest.raises(RuntimeError), in_memory():
        assert buckets._ENGINE.get() == "in-memory"
        raise RuntimeError("boom")
    assert buckets._ENGINE.get() == "streaming"


def test_reused_is_computed_once_in_memory_and_left_lazy_otherwise():
    query = _query()
    assert reused(query) is query  # a whole run: each reader streams it
    with in_memory():
        once = reused(query)
    assert once is not query
    assert once.explain().strip().startswith("DF [")  # a frame already computed, no group_by left
    assert_frame_equal(once.collect(), query.collect())

"""Every Parquet tool reads every table of a world-size-2 run with correct `rank` values."""

import duckdb
import pandas as pd
import polars as pl
import pyarrow.dataset as ds
import pytest
import torch

from trustlens import Keep, TokenRecorder, load_run
from trustlens.record import SAMPLE_RANK, SAMPLE_STEP
from trustlens.run import TABLES

B, T = 3, 5
# the tables the fixture writes rows to (two steps raise no live alert: tests/live reads that table)
WRITTEN = [t for t in TABLES if t != "alerts"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Ranks 0 and 1 (both in this process), 2 steps each; rank 1 logs one more sample per step.
    Recorded with Keep(rate=1): every token kept, and the aggregates table written too; with routed
    experts: the routing table too."""
    path = tmp_path_factory.mktemp("tools") / "run"
    recorders = [TokenRecorder(path, rules=["ppo"], rank=r, world_size=2, keep=Keep(rate=1.0)) for r in (0, 1)]
    g = torch.Generator().manual_seed(0)
    for step in range(2):
        for rank, rec in enumerate(recorders):
            mu = -torch.rand(B, T, generator=g) - 0.1
            rec.record(
                step,
                token_ids=torch.randint(0, 9, (B, T), generator=g),
                response_mask=torch.ones(B, T),
                pi_logp=mu,
                mu_logp=mu,
                advantages=torch.ones(B),
                mu_routed_experts=torch.randint(0, 4, (B, T, 2, 1), generator=g),  # 2 MoE layers, top-1
                pi_routed_experts=torch.randint(0, 4, (B, T, 2, 1), generator=g),
            )
            rec.log_samples(step, rewards=[1.0] * (B + rank))
            rec.log_metrics(step, {"loss": float(rank)})
    for rec in recorders:
        rec.close()
    return path


# rows per rank of each table
EXPECTED = {
    "tokens": [2 * B * T, 2 * B * T],
    "samples": [2 * B, 2 * (B + 1)],
    "metrics": [2, 2],
    "aggregates": [2, 2],
    "routing": [4, 4],
}


def _check(frame: pd.DataFrame, table: str) -> None:
    frame = frame.astype({"rank": "int64"})
    assert frame.groupby("rank").size().to_dict() == dict(enumerate(EXPECTED[table]))
    if table in ("tokens", "samples"):  # default sample ids carry the rank: step·10⁹ + rank·10⁶ + index
        assert ((frame["sample"] % SAMPLE_STEP) // SAMPLE_RANK == frame["rank"]).all()
    elif table == "metrics":
        assert (frame["value"] == frame["rank"]).all()
    else:  # one aggregate row per record call (a routing row per call and layer): B·T tokens each
        assert (frame["tokens"] == B * T).all()


@pytest.mark.parametrize("table", WRITTEN)
def test_pandas(run, table):
    _check(pd.read_parquet(run / table), table)


@pytest.mark.parametrize("table", WRITTEN)
def test_pyarrow_dataset(run, table):
    _check(ds.dataset(run / table, partitioning="hive").to_table().to_pandas(), table)


@pytest.mark.parametrize("table", WRITTEN)
def test_duckdb(run, table):
    pattern = str(run / table / "**" / "*.parquet")
    frame = duckdb.sql(f"select * from read_parquet('{pattern}', hive_partitioning=true)").df()
    _check(frame, table)


@pytest.mark.parametrize("table", WRITTEN)
def test_polars(run, table):
    _check(pl.read_parquet(run / table, hive_partitioning=True).to_pandas(), table)
    _check(getattr(load_run(run), table).collect().to_pandas(), table)

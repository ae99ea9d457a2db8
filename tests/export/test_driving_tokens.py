"""The driving-token table of the W&B export and the report (trustlens.export.driving_tokens):
one alert's tokens after another, in the alerts' order, each alert's strongest first."""

import math

import polars as pl
import pytest

from trustlens.analysis.collapse import ALERT_SCHEMA
from trustlens.export import driving_tokens
from trustlens.export.exporters import DRIVER_COLUMNS
from trustlens.run import load_run
from trustlens.run.tables import write_run

# 2 steps × 3 samples × 2 updates × 3 positions; row i has μ = e^(−0.2 i), π_old = e^(−0.15 i),
# π = e^(−0.1 i) and advantage i, so that every token's values say which row it is
KEYS = [(s, smp, u, p) for s in (0, 1) for smp in range(3 * s, 3 * s + 3) for u in (0, 1) for p in range(3)]


@pytest.fixture
def run(tmp_path):
    index = range(len(KEYS))
    tokens = dict(zip(("step", "sample", "update", "pos"), zip(*KEYS, strict=True), strict=True)) | {
        "token": [f"t{i}" for i in index],
        "mu_logp": [-0.2 * i for i in index],
        "old_logp": [-0.15 * i for i in index],
        "pi_logp": [-0.1 * i for i in index],
        "advantage": [float(i) for i in index],
    }
    return load_run(write_run(tmp_path / "run", tokens=tokens))


def _alert(step: int, kind: str, tokens: list[tuple[int, int, int]]) -> dict:
    listed = [{"sample": s, "update": u, "pos": p} for s, u, p in tokens]
    return {"step": step, "end_step": step, "kind": kind, "signal": "x", "severity": "warning", "tokens": listed}


# alerts at steps 1, 0 and 1 again (as detect_collapse orders alerts of one step: by kind), each
# listing its tokens strongest first, in no order of the rows; two alerts share a token
ALERTS = pl.DataFrame(
    [
        _alert(1, "blocked_drift", [(5, 0, 2), (3, 1, 0), (5, 0, 0), (4, 1, 1)]),
        _alert(0, "grad_norm_spike", [(2, 1, 2), (0, 0, 0), (1, 0, 1)]),
        _alert(1, "mismatch_growth", [(4, 1, 1), (5, 0, 2)]),
    ],
    schema={k: v for k, v in ALERT_SCHEMA.items() if k in ("step", "end_step", "kind", "signal", "severity", "tokens")},
)


def test_grouped_by_alert_in_the_alerts_order_each_strongest_first(run):
    table = driving_tokens(run, ALERTS)
    assert table.columns == list(DRIVER_COLUMNS)
    expected = [
        (a["step"], a["kind"], t["sample"], t["update"], t["pos"])
        for a in ALERTS.iter_rows(named=True)
        for t in a["tokens"]
    ]
    assert table.select("alert_step", "kind", "sample", "update", "pos").rows() == expected
    assert table["kind"].to_list() == ["blocked_drift"] * 4 + ["grad_norm_spike"] * 3 + ["mismatch_growth"] * 2
    # each row's values are its token's: (step 1, sample 5, update 0, pos 2) is row 32
    i = KEYS.index((1, 5, 0, 2))
    first = table.row(0, named=True)
    assert i == 32 and first["token"] == "t32" and first["advantage"] == 32.0
    assert (first["mu"], first["pi_old"], first["pi"]) == pytest.approx(
        (math.exp(-6.4), math.exp(-4.8), math.exp(-3.2)), rel=1e-6
    )
    assert table.row(8, named=True)["token"] == "t32"  # the same token, listed again by the last alert


def test_the_order_is_the_same_every_time(run):
    first = driving_tokens(run, ALERTS)
    for _ in range(5):
        assert driving_tokens(run, ALERTS).equals(first)


def test_no_listed_token_gives_an_empty_table(run):
    empty = ALERTS.with_columns(pl.lit([], dtype=ALERT_SCHEMA["tokens"]).alias("tokens"))
    table = driving_tokens(run, empty)
    assert table.is_empty() and table.columns == list(DRIVER_COLUMNS)

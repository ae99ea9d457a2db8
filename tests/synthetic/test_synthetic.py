import json

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import torch

from trustlens.divergence import binary_kl, binary_tv
from trustlens.rules import evaluate_all
from trustlens.run import META_SCHEMA_VERSION, SCHEMA_VERSION, load_run, token_columns
from trustlens.synthetic import HOSTILE_VOCAB, expected_token_rows, write_synthetic_run

RULES = ["ppo", "dppo_binary_tv", "dppo_topk_tv"]


def _tokens(path) -> pl.DataFrame:
    return load_run(path).tokens.collect()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("syn") / "run"
    return write_synthetic_run(
        path,
        steps=6,
        samples_per_step=16,
        seq_len=20,
        rules=RULES,
        world_size=2,
        updates=2,
        collapse_at=4,
        rows_per_part=400,
    )


def test_layout_manifest_and_metadata(run):
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["status"] == "finished"
    assert manifest["schema_version"] == SCHEMA_VERSION
    assert list(manifest["rules"]) == RULES
    assert manifest["rules"]["ppo"]["high"] == pytest.approx(0.2)
    assert manifest["world_size"] == 2
    for kind in ("tokens", "samples", "metrics"):
        for rank in (0, 1):
            parts = sorted((run / kind / f"rank={rank}").glob("part-*.parquet"))
            assert parts, (kind, rank)
    part = sorted((run / "tokens" / "rank=0").glob("part-*.parquet"))[0]
    meta = pq.read_schema(part).metadata
    assert meta[META_SCHEMA_VERSION] == str(SCHEMA_VERSION).encode()
    assert pq.read_schema(part).names == [c.name for c in token_columns(RULES)]
    assert len(list((run / "tokens" / "rank=0").glob("part-*.parquet"))) > 1  # rows_per_part rolls


def test_rows_are_consistent(run):
    df = _tokens(run)
    assert df.height == df.select("step", "sample", "pos").unique().height
    assert set(df["rank"].unique()) == {0, 1}
    assert set(df["update"].unique()) == {0, 1}
    for rank_df in df.partition_by("rank"):
        assert rank_df["step"].is_sorted()
    assert (df["mu_logp"] < 0).all() and (df["old_logp"] < 0).all() and (df["pi_logp"] < 0).all()
    np.testing.assert_allclose(df["ratio"], np.exp(df["pi_logp"].cast(pl.Float64) - df["mu_logp"]), rtol=1e-5)
    pi = torch.from_numpy(df["pi_logp"].to_numpy().astype(np.float64))
    mu = torch.from_numpy(df["mu_logp"].to_numpy().astype(np.float64))
    np.testing.assert_allclose(df["binary_tv"], binary_tv(pi, mu).numpy(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(df["binary_kl"], binary_kl(pi, mu).numpy(), rtol=1e-3, atol=1e-7)
    assert (df["topk_tv"] >= df["binary_tv"] - 1e-6).all()
    # blocked_<rule> equals the rule registry on the stored values
    expected = evaluate_all(
        RULES,
        pi_logp=pi,
        mu_logp=mu,
        advantages=torch.from_numpy(df["advantage"].to_numpy().astype(np.float64)),
        topk_tv=torch.from_numpy(df["topk_tv"].to_numpy().astype(np.float64)),
    )
    for rule in RULES:
        agree = (df[f"blocked_{rule}"].to_numpy() == expected[rule].numpy()).mean()
        assert agree > 0.999, rule  # float32 storage may flip a token sitting on a threshold


def test_samples_match_tokens(run):
    samples = load_run(run).samples.collect()
    tokens = _tokens(run)
    assert samples.height == 6 * 16
    lengths = tokens.group_by("sample").len().sort("sample")
    assert lengths["len"].to_list() == samples.sort("sample")["length"].to_list()
    text = (
        tokens.sort("sample", "pos")
        .group_by("sample", maintain_order=True)
        .agg(pl.col("token").cast(pl.String).str.join(""))
    )
    joined = dict(zip(text["sample"], text["token"], strict=True))
    assert all(joined[s] == r for s, r in zip(samples["sample"], samples["response"], strict=True))
    # advantages are group-normalised: they sum to ~0 within each group
    sums = samples.group_by("group").agg(pl.col("advantage").sum())["advantage"]
    assert (sums.abs() < 1e-3).all()


def test_collapse_is_visible(tmp_path):
    path = write_synthetic_run(
        tmp_path / "r", steps=12, samples_per_step=32, seq_len=32, rules=["ppo"], collapse_at=8, seed=1
    )
    df = _tokens(path)
    per_step = (
        df.group_by("step")
        .agg(pl.col("entropy").mean(), (pl.col("mu_logp") - pl.col("old_logp")).abs().mean().alias("gap"))
        .sort("step")
    )
    before, after = per_step.filter(pl.col("step") < 8), per_step.filter(pl.col("step") >= 10)
    assert after["entropy"].max() < 0.5 * before["entropy"].min()
    assert after["gap"].min() > 3 * before["gap"].max()
    metrics = load_run(path).metrics.collect()
    grad = metrics.filter(pl.col("name") == "grad_norm").sort("step")["value"].to_numpy()
    assert grad[10:].min() > 3 * grad[:8].max()


def test_missing_mu_and_topk(tmp_path):
    path = write_synthetic_run(
        tmp_path / "r",
        steps=2,
        samples_per_step=8,
        seq_len=8,
        rules=["ppo", "dppo_topk_tv"],
        with_mu=False,
        with_topk=False,
    )
    df = _tokens(path)
    assert df["mu_logp"].null_count() == df.height
    assert df["blocked_dppo_topk_tv"].null_count() == df.height
    assert df["blocked_ppo"].null_count() == 0
    np.testing.assert_allclose(df["ratio"], np.exp(df["pi_logp"].cast(pl.Float64) - df["old_logp"]), rtol=1e-5)
    manifest = json.loads((path / "run.json").read_text())
    assert manifest["anchor"] == "old" and "mu_logp" in manifest["missing"]


def test_hostile_vocab_round_trips(tmp_path):
    path = write_synthetic_run(tmp_path / "r", steps=1, samples_per_step=8, seq_len=40, rules=[], vocab=HOSTILE_VOCAB)
    assert set(_tokens(path)["token"].cast(pl.String).unique()) <= set(HOSTILE_VOCAB)


def test_expected_rows(tmp_path):
    path = write_synthetic_run(tmp_path / "r", steps=10, samples_per_step=64, seq_len=40, rules=[])
    rows = _tokens(path).height
    assert abs(rows - expected_token_rows(10, 64, 40)) < 0.05 * rows


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"samples_per_step": 10, "group_size": 4}, "multiple of group_size"),
        ({"steps": 0}, "steps must be a positive int"),
        ({"collapse_at": 50}, "collapse_at"),
        ({"rules": ["nope"]}, "unknown rule"),
        ({"with_mu": False, "with_old": False}, "anchor"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        write_synthetic_run(tmp_path / "r", **kwargs)


def test_refuses_to_overwrite(tmp_path):
    write_synthetic_run(tmp_path / "r", steps=1, samples_per_step=8, seq_len=4, rules=[])
    with pytest.raises(FileExistsError, match="already holds a run"):
        write_synthetic_run(tmp_path / "r", steps=1, samples_per_step=8, seq_len=4, rules=[])


def test_write_run_checks_columns(tmp_path):
    from trustlens.run.tables import write_run

    with pytest.raises(ValueError, match="unknown columns"):
        write_run(tmp_path / "a", tokens={"step": [0], "sample": [0], "pos": [0], "pi_logp": [-1.0], "oops": [1]})
    with pytest.raises(ValueError, match="'pi_logp' is required"):
        write_run(tmp_path / "b", tokens={"step": [0], "sample": [0], "pos": [0]})
    with pytest.raises(ValueError, match="has 2 rows"):
        write_run(tmp_path / "c", tokens={"step": [0], "sample": [0], "pos": [0, 1], "pi_logp": [-1.0]})
    path = write_run(
        tmp_path / "d",
        tokens={
            "step": [1, 0],
            "sample": [1, 0],
            "pos": [0, 0],
            "pi_logp": [-1.0, -2.0],
            "token": ["<b>", "x"],
            "blocked_ppo": [True, None],
        },
    )
    df = _tokens(path)
    assert df["step"].to_list() == [0, 1] and df["pi_logp"].to_list() == [-2.0, -1.0]
    assert df["token"].cast(pl.String).to_list() == ["x", "<b>"]
    manifest = json.loads((path / "run.json").read_text())
    assert list(manifest["rules"]) == ["ppo"] and manifest["anchor"] == "old" and "mu_logp" in manifest["missing"]

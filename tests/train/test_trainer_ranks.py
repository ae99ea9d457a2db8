"""The built-in trainer under torchrun (2 processes, gloo; `trustlens train`): each rank records
its own shard, the metrics it logs are exact over ranks (block rates and token means pooled:
Σ counts / Σ tokens, never a mean of the ranks' rates), and non-finite values survive the
reduction (docs/metrics.md, "Under data parallelism")."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import trustlens
from trustlens.export import step_scalars

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

ROOT = Path(__file__).resolve().parents[2]


def torchrun(*args: str, timeout: int = 300) -> None:
    """`args` (a module or script and its arguments) in 2 processes under torchrun; fail with its stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    # its own session, so that a hung run is killed with its workers
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True
    )
    try:
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]


# One torchrun of 2 processes serves the three tests: each rank reduces a few hand-made metrics with
# `log_reduced` (its result to log-rank<R>.json), then trains a tiny run with `trustlens train` (the
# CLI's entry, as `torchrun -m trustlens.cli train` runs it) with a TensorBoard mirror on rank 0.
WORKER = """
import json, math, sys
from pathlib import Path
from trustlens.cli import main
from trustlens.train.pooled import log_reduced, ratio
from trustlens.train.world import init_world

out = Path(sys.argv[1])
world = init_world()
r = world.rank
logged = {}

class Sink:
    def log_metrics(self, step, metrics):
        logged[step] = metrics

metrics = {
    "blocked/x/neg": ratio([17, 2][r], [585, 255][r]),  # the audit's step: 19/840, not 0.018
    "blocked/x/pos": ratio(0, 0),  # no A > 0 token on any rank: no value
    "mismatch_kl": ratio([0.5, math.inf][r], [3, 4][r]),  # π_old gave a token probability 0
    "topk_kl_mean": ratio([math.inf, 1.0][r], [2, 5][r]),
    "topk_tv_max": [0.25, math.inf][r],
    "grad_norm": math.inf,  # the same on every rank
    "time/step": [1.5, math.nan][r],  # NaN: no value on rank 1
}
reduced = log_reduced(Sink(), world, 7, metrics)
(out / f"log-rank{r}.json").write_text(json.dumps({"reduced": reduced, "logged": logged}))

# a warm start at τ = 1 with partial credit: groups of mixed rewards, so signed tokens, and a
# large step so that the rules block some of them; held-out accuracy at the start and the end
code = main([
    "train", "--preset", "quick", "--steps", "2", "--eval-size", "8", "--keep-rate", "0.5",
    "--temperature", "1.0", "--partial-credit", "0.5", "--lr", "1e-3", "--rollout-precision", "fp8",
    "--rule", "pg_is", "--mirror", f"tensorboard:{out / 'tb'}", "--out", str(out / "run"), "--quiet",
])
assert code == 0, code
"""


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ranks")
    (out / "worker.py").write_text(WORKER)
    torchrun(str(out / "worker.py"), str(out))
    return out


def test_torchrun_logs_block_rates_pooled_over_ranks(ranks):
    """Two ranks with different numbers of A > 0 and A < 0 tokens: every logged block rate is
    Σ blocked / Σ tokens of that sign over both ranks' aggregates (the mean of the ranks' rates
    differs), and so are the export's and rank 0's live mirror's (its shard alone would not be)."""
    out, tb = ranks / "run", ranks / "tb"
    run = trustlens.load_run(out)
    assert run.manifest["world_size"] == 2 and run.manifest["status"] == "finished"

    per_rank = run.aggregates.group_by("step", "rank").agg(pl.exclude("update").sum()).collect()
    steps = per_rank.drop("rank").group_by("step").sum()
    rules = [c[2:-4] for c in per_rank.columns if c.startswith("k_") and c.endswith("_pos")]
    assert "ppo" in rules and "dppo_binary_kl" in rules
    exact, rank_mean, shard = {}, {}, {}
    for sign in ("pos", "neg"):
        for rule in rules:
            k, n = f"k_{rule}_{sign}", f"tokens_{sign}"
            name = f"blocked/{rule}/{sign}"
            for step, blocked, tokens in steps.select("step", k, n).rows():
                if tokens:
                    exact[(step, name)] = blocked / tokens
            by_rank = per_rank.filter(pl.col(n) > 0).group_by("step").agg((pl.col(k) / pl.col(n)).mean())
            rank_mean |= {(step, name): v for step, v in by_rank.rows()}
            rank0 = per_rank.filter((pl.col("rank") == 0) & (pl.col(n) > 0))
            shard |= {(step, name): b / t for step, b, t in rank0.select("step", k, n).rows()}
    # the ranks' sign counts differ, so that a mean of their rates is not the step's rate
    assert any(abs(rank_mean[key] - v) > 1e-3 for key, v in exact.items())
    assert any(abs(shard[key] - v) > 1e-3 for key, v in exact.items())

    logged = {(s, n): v for s, n, v in run.metrics.select("step", "name", "value").collect().rows()}
    for key, v in exact.items():
        assert logged[key] == pytest.approx(v, rel=1e-12, abs=1e-15), key
    for (step, name), v in logged.items():  # a sign no rank saw has no rate: NaN
        if name.startswith("blocked/") and name != "blocked/active" and (step, name) not in exact:
            assert math.isnan(v), (step, name)

    # the token means and the reward moments are pooled too
    for step, row in enumerate(steps.sort("step").iter_rows(named=True)):
        assert logged[(step, "mismatch_kl")] == pytest.approx(row["sum_k1"] / row["pairs"], rel=1e-9)
        assert logged[(step, "k3_kl")] == pytest.approx(row["sum_k3"] / row["pairs"], rel=1e-6, abs=1e-12)
    samples = run.samples.with_columns(pl.col("reward").cast(pl.Float64)).collect()  # the trainer's float32 rewards
    for (step,), s in samples.group_by("step"):
        assert logged[(step, "reward/mean")] == pytest.approx(s["reward"].mean(), rel=1e-12)
        assert logged[(step, "reward/std")] == pytest.approx(s["reward"].std(), rel=1e-9)
        assert logged[(step, "response_length/mean")] == pytest.approx(s["length"].mean(), rel=1e-12)

    sent = {(s, n): v for s, n, v in step_scalars(run).rows()}
    acc = event_accumulator.EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    mirrored = {(e.step, tag): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
    for key, v in exact.items():
        assert sent[key] == pytest.approx(v, rel=1e-12), key
        assert mirrored[key] == pytest.approx(v, rel=1e-6), key  # float32 event values
    # the trainer logs, pooled, every token-level name the export computes from the aggregates,
    # so rank 0's mirror (logged wins over its shard) sends the step's values for them too
    pooled = ("zero_adv_frac", "mismatch_kl", "k3_kl", "chi2_token", "prob_diff_mean", "prob_diff_max", "prob_pearson")
    checked = [(step, name) for step, name in sent if name in pooled]
    assert {name for _, name in checked} == set(pooled)
    for key in checked:
        assert logged[key] == pytest.approx(sent[key], rel=1e-6, abs=1e-12), key
        assert mirrored[key] == pytest.approx(sent[key], rel=1e-5, abs=1e-9), key


def test_torchrun_trains_disjoint_shards_through_the_cli(ranks):
    """`trustlens train` under torchrun: each rank rolls out its own share of the prompts and
    records its own shard; the metrics are logged once, reduced over the ranks."""
    run = trustlens.load_run(ranks / "run")
    tokens = run.tokens.collect()
    assert sorted(tokens["rank"].unique().to_list()) == [0, 1]
    assert tokens.select("step", "update", "sample", "pos").is_duplicated().sum() == 0
    s0, s1 = (set(r) for r in tokens.group_by("rank").agg(pl.col("sample").unique()).sort("rank")["sample"])
    assert s0 and s1 and not s0 & s1
    samples = run.samples.collect()
    assert samples.group_by("rank").len()["len"].to_list() == [2 * 4 * 4 // 2] * 2  # steps·prompts·G / ranks
    metrics = run.metrics.collect()
    assert metrics.select("step", "name").is_duplicated().sum() == 0
    assert metrics.filter(pl.col("name") == "eval/accuracy").height == 2


def test_log_pools_over_ranks_and_keeps_non_finite_values(ranks):
    """`log_reduced` under 2 processes: a rate is Σk / Σn over ranks; a +inf mean or max stays +inf
    (a value, docs/metrics.md); NaN means no value on that rank; rank 0 logs, once."""
    rank0, rank1 = (json.loads((ranks / f"log-rank{r}.json").read_text()) for r in (0, 1))
    reduced = rank0["reduced"]
    same = json.dumps(reduced)  # NaN is not == NaN: compare the texts
    assert json.dumps(rank1["reduced"]) == same and rank1["logged"] == {}
    assert list(rank0["logged"]) == ["7"] and json.dumps(rank0["logged"]["7"]) == same
    assert reduced["blocked/x/neg"] == 19 / 840 != (17 / 585 + 2 / 255) / 2
    assert math.isnan(reduced["blocked/x/pos"])
    assert reduced["mismatch_kl"] == reduced["topk_kl_mean"] == math.inf
    assert reduced["topk_tv_max"] == reduced["grad_norm"] == math.inf
    assert reduced["time/step"] == 1.5

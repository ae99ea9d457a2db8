"""trustlens.integrations.verl through verl's own actor code on 2 gloo ranks (CPU), checked
against the tensors verl's policy loss used; the run then opens on every dashboard page.

Runs in a venv with verl (`.ci/run` makes them: verl 0.9.1 and 0.7.1); skipped elsewhere.
Each rank is a subprocess running tests/integrations/verl_rank.py; this process plays verl's
driver (rank 0: samples, metrics, run.json), which hands the ranks their shares of each step's
batch with the step and the samples' ids in it, as verl's `_update_actor` does.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from packaging.version import Version

verl = pytest.importorskip("verl")
pytestmark = pytest.mark.slow

from omegaconf import OmegaConf  # noqa: E402

from trustlens import load_run  # noqa: E402
from trustlens.integrations import verl as hook  # noqa: E402
from trustlens.integrations._ray_hooks import finish  # noqa: E402
from trustlens.integrations.verl.state import STATE  # noqa: E402

RANK_SCRIPT = Path(__file__).with_name("verl_rank.py")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import verl_actor  # noqa: E402
import verl_grpo  # noqa: E402

WORLD = 2
PATHS = [verl_actor.default_path()]


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _train(run_dir: Path, path: str, tmp: Path, batches: Path) -> list[list[dict]]:
    """Run the 2 ranks on the driver's `batches`; returns each rank's spied policy-loss calls."""
    port = _free_port()
    outs = [tmp / f"calls{r}.json" for r in range(WORLD)]
    cmd = [sys.executable, str(RANK_SCRIPT)]
    procs = [
        subprocess.Popen([*cmd, str(r), str(WORLD), port, str(run_dir), str(outs[r]), path, str(batches)])
        for r in range(WORLD)
    ]
    codes = [p.wait(timeout=900) for p in procs]
    assert codes == [0] * WORLD
    return [json.loads(o.read_text()) for o in outs]


@pytest.fixture(scope="module", params=PATHS)
def verl_run(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    run_dir = tmp / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRUSTLENS_DIR", str(run_dir))  # drive() sets it for this process
        verl_actor.drive(str(run_dir), WORLD, str(tmp / "batches"))
        calls = _train(run_dir, request.param, tmp, tmp / "batches")
        finish(STATE, None)  # fit returns: the run is finished
    return run_dir, calls


def test_rows_are_the_tensors_verl_trained_on(verl_run):
    run_dir, calls = verl_run
    run = load_run(run_dir)
    tokens = run.tokens.collect()
    assert run.manifest["status"] == "finished"
    assert run.manifest["active_rule"] == "minirl"
    assert run.manifest["rules"]["minirl"]["low"] == 0.2 and run.manifest["rules"]["minirl"]["high"] == 0.28
    assert "dual clip" in run.manifest["config"]["loss"]
    assert run.manifest["sampling"] == {
        "temperature": 0.7,
        "top_p": None,
        "top_k": None,
        "min_p": None,
        "logprobs": "processed",
        "processors": [],  # the rollout section names no penalty, bias or mask
    }
    assert sorted(tokens["rank"].unique().to_list()) == [1, 2]
    assert tokens.select("step", "update", "rank", "sample", "pos").is_duplicated().sum() == 0
    assert tokens["mu_logp"].null_count() == 0 and tokens["entropy"].null_count() == 0
    assert sorted(tokens.select("step", "update").unique().rows()) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for rank, rank_calls in enumerate(calls, start=1):
        mine = tokens.filter(pl.col("rank") == rank)
        assert len(mine) == sum(len(c["pi"]) for c in rank_calls) > 0  # one row per token verl trained
        for column, key in (("pi_logp", "pi"), ("old_logp", "old"), ("advantage", "adv")):
            used = np.sort(np.concatenate([c[key] for c in rank_calls]).astype(np.float32))
            np.testing.assert_allclose(np.sort(mine[column].to_numpy()), used, rtol=0, atol=1e-6)
    zero = tokens.filter(pl.col("advantage") == 0)
    assert len(zero) > 0 and not zero["blocked_minirl"].any()  # A = 0 is never blocked


def test_r3_routing_is_read_from_the_rows_that_predicted_each_token(verl_run):
    """The rollout's `routed_experts` (verl_actor.routed_experts: experts on every layer at the
    positions that predict an odd response token, −1 at the others) through verl's own
    left_right_2_no_padding, mini- and micro-batching into ppo_loss: under R3 both sides are
    read from them, 0 flips, route_overlap 1 at odd pos and null at even pos. verl 0.7's
    DataParallelPPOActor (its config saying R3) has no router replay and drops routed_experts
    from the batch: no routing."""
    run = load_run(verl_run[0])
    tokens = run.tokens.collect()
    if PATHS == ["dp_actor"]:
        assert tokens["route_overlap"].null_count() == len(tokens) and run.routing.collect().is_empty()
        return
    odd = tokens.filter(pl.col("pos") % 2 == 1)
    assert len(odd) > 0 and odd["route_overlap"].to_list() == [1.0] * len(odd)
    assert tokens.filter(pl.col("pos") % 2 == 0)["route_overlap"].null_count() == len(tokens) - len(odd)
    assert tokens["route_flips"].fill_null(0).max() == 0 and tokens["route_first_flip"].null_count() == len(tokens)
    table = run.routing.group_by("layer").agg(pl.col("tokens").sum(), pl.col("flips").sum()).sort("layer").collect()
    assert table.rows() == [(layer, len(odd), 0) for layer in range(verl_actor.LAYERS)]


def test_samples_and_metrics_join_the_tokens(verl_run):
    run = load_run(verl_run[0])
    tokens, samples, metrics = run.tokens.collect(), run.samples.collect(), run.metrics.collect()
    assert len(samples) == 2 * WORLD * 8
    assert samples.select("step", "sample").is_duplicated().sum() == 0
    joined = tokens.join(samples.select("step", "sample", "length"), on=["step", "sample"], how="left")
    assert joined["length"].null_count() == 0  # every token row has its sample
    per_sample = tokens.group_by("step", "sample").agg(pl.len())
    lengths = per_sample.join(samples, on=["step", "sample"])
    assert (lengths["len"] == lengths["length"]).all()
    assert metrics.filter(pl.col("name") == "verl/actor/pg_loss")["value"].to_list() == [0.5, 1.0]
    assert "verl/note" not in metrics["name"].to_list()


def test_identical_answers_on_two_ranks_keep_the_driver_s_sample_ids(verl_run):
    """Row 0's answer repeats on the same rank (another micro-batch) and on the other rank: the
    driver gives each copy its own id and the ranks record each under it, once."""
    run = load_run(verl_run[0])
    tokens, samples = run.tokens.collect(), run.samples.collect()
    assert tokens.select("step", "update", "sample", "pos").is_duplicated().sum() == 0  # across ranks too
    per_sample = tokens.group_by("step", "sample").agg(pl.len(), pl.col("rank").unique().alias("ranks"))
    per_sample = samples.join(per_sample, on=["step", "sample"], how="left")
    assert per_sample["len"].null_count() == 0  # every sample trained
    assert (per_sample["len"] == per_sample["length"]).all() and (per_sample["ranks"].list.len() == 1).all()
    for step in (1, 2):
        copies = per_sample.filter(pl.col("step") == step).group_by("prompt", "response").agg("sample", "ranks")
        copies = copies.filter(pl.col("sample").list.len() > 1)
        assert copies["sample"].list.len().to_list() == [3]  # one answer, three samples
        assert sorted(copies["ranks"].explode().explode().to_list()) == [1, 1, 2]


def _opens_on_every_page(run_dir: Path, monkeypatch) -> None:
    from test_dashboard_app import PAGES, _app, _open, _pick_run

    at = _pick_run(_app(monkeypatch, run_dir.parent).run(), run_dir.name)
    for page, title in PAGES.items():
        at = _open(at, page)
        assert title in [t.value for t in at.title]
        assert not at.error, [e.value for e in at.error]


def test_dashboard_opens_the_verl_run_on_every_page(verl_run, monkeypatch):
    _opens_on_every_page(verl_run[0], monkeypatch)


@pytest.fixture(scope="module")
def main_ppo_run(tmp_path_factory):
    """examples/verl_grpo.py: verl's own `main_ppo` (2 GRPO steps, 2 Ray workers) on the CPU
    stand-ins of examples/verl_cpu, trustlens attached by `external_lib`; the run checked."""
    if Version(verl.__version__) < Version("0.9"):
        pytest.skip("the CPU stand-ins plug into verl ≥ 0.9's platform and rollout registries")
    run_dir = verl_grpo.train(tmp_path_factory.mktemp("main_ppo"))
    return run_dir, verl_grpo.check(run_dir)


def test_main_ppo_run_is_recorded_from_every_worker_and_the_driver(main_ppo_run):
    run_dir, counts = main_ppo_run  # check(): rows = verl's response tokens per step, rank, update
    run = load_run(run_dir)
    tokens = run.tokens.collect()
    assert counts["samples"] == verl_grpo.STEPS * verl_grpo.PROMPTS * verl_grpo.N
    assert run.manifest["active_rule"] == "minirl" and run.manifest["config"]["verl_version"] == verl.__version__
    assert run.samples.collect()["rank"].unique().to_list() == [0]  # the driver's
    assert "verl/actor/pg_loss" in run.metrics.collect()["name"].to_list()
    # μ is the rollout's own (fp32 HF generate), π_old verl's recomputation (bf16 compute)
    gap = (tokens["old_logp"] - tokens["mu_logp"]).abs()
    assert 0 < gap.max() < 0.1


def test_dashboard_opens_the_main_ppo_run_on_every_page(main_ppo_run, monkeypatch):
    _opens_on_every_page(main_ppo_run[0], monkeypatch)


@pytest.mark.parametrize(
    ("actor", "algorithm", "rule"),
    [
        ({}, {}, "minirl"),
        ({}, {"rollout_correction": {"rollout_is": "token"}}, "grpo_tis"),
        ({"policy_loss": {"loss_mode": "dppo_tv"}}, {}, "dppo_binary_tv_recompute"),
        ({"policy_loss": {"loss_mode": "dppo_kl"}}, {}, "dppo_binary_kl_recompute"),
        ({"policy_loss": {"loss_mode": "gpg"}}, {}, None),
        ({"policy_loss": {"loss_mode": "cispo"}}, {}, None),
        ({"policy_loss": {"loss_mode": "gspo"}}, {}, "gspo"),
        ({"policy_loss": {"loss_mode": "geo_mean"}}, {}, "gmpo"),
        ({}, {"rollout_correction": {"rollout_is": "sequence"}}, "grpo_seq_tis"),
        ({}, {"rollout_correction": {"bypass_mode": True}}, "dual_clip"),
    ],
)
def test_verl_losses_map_to_the_rule_that_blocks_the_same_tokens(actor, algorithm, rule):
    active = hook.verl_active_rule(OmegaConf.create(actor), OmegaConf.create(algorithm))
    assert active.name == rule
    assert (active.low, active.high) == ((0.2, 0.2) if rule else (None, None))
    assert active.note


def test_ray_setup_hook_patches_verl_in_every_ray_process(tmp_path):
    """The `+ray_kwargs.ray_init.runtime_env` overrides of docs/attach.md, as verl's main_ppo
    passes them to ray.init: a Ray worker process (verl's TaskRunner is one) comes up patched."""
    import ray

    env = {"TRUSTLENS_DIR": str(tmp_path / "run"), "OMP_NUM_THREADS": "1"}
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": "trustlens.integrations.verl.setup", "env_vars": env},
    )
    try:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}  # tests/integrations/conftest.py

        @ray.remote
        def patched() -> tuple[bool, str | None]:
            import os

            from verl.trainer.ppo.ray_trainer import RayPPOTrainer

            return hasattr(RayPPOTrainer.fit, "__wrapped__"), os.environ.get("TRUSTLENS_DIR")

        assert ray.get(patched.remote()) == (True, env["TRUSTLENS_DIR"])
    finally:
        ray.shutdown()

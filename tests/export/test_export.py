"""trustlens export and the live mirror: scalars computed once (trustlens.export.scalars), read
back with TensorBoard's own reader and from W&B's offline run file."""

import math
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
from s3_server import BUCKET
from wandb_log import history

from trustlens import Keep, TokenRecorder, load_run
from trustlens.analysis import detect_collapse, exact_aggregates, mismatch_per_step, step_signals
from trustlens.analysis.mismatch import SEQUENCE_LEVEL
from trustlens.divergence import topk_divergence, topk_from_logits
from trustlens.export import (
    StepMirror,
    alert_text,
    export_tensorboard,
    export_wandb,
    make_mirror,
    step_scalars,
    token_scalars,
)
from trustlens.export.scalars import with_signals
from trustlens.export.sinks import require
from trustlens.run.aggregates import step_aggregates
from trustlens.synthetic import write_synthetic_run

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample_run"
HOSTILE = "rule <img src=x onerror=alert(1)> [a](javascript:alert(2)) blocks"


def scalars_of(logdir: Path) -> dict[str, dict[int, float]]:
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_token_scalars_by_hand():
    """Block rates over A > 0 and A < 0 tokens; A = 0 tokens count only in zero_adv_frac."""
    tokens = pl.DataFrame(
        {
            "step": [0, 0, 0, 0, 0, 1],
            "advantage": [1.0, 1.0, -2.0, 0.0, 0.0, -1.0],
            "blocked_ppo": [True, False, True, False, False, False],
        }
    )
    got = {(s, n): v for s, n, v in token_scalars(tokens).rows()}
    assert got == {
        (0, "blocked/ppo/pos"): 0.5,
        (0, "blocked/ppo/neg"): 1.0,
        (0, "zero_adv_frac"): 0.4,
        (1, "blocked/ppo/neg"): 0.0,
        (1, "zero_adv_frac"): 0.0,
    }


def test_token_scalars_of_sampled_rows_leave_out_the_sequence_level_mismatch():
    """Weighted rows are a sample: no response is whole, so log_ppl_diff, log_ppl_abs_diff and
    chi2_seq are left out (docs/metrics.md, "Sampled runs")."""
    p_mu, p_old = [0.5, 0.8], [0.25, 0.8]  # one response: mean_t(log μ − log π_old) = log 2 / 2
    rows = {
        "step": [0, 0],
        "update": [0, 0],
        "sample": [0, 0],
        "advantage": [1.0, 1.0],
        "mu_logp": [math.log(p) for p in p_mu],
        "old_logp": [math.log(p) for p in p_old],
        "pi_logp": [math.log(p) for p in p_old],
    }
    sequence = {"log_ppl_diff", "log_ppl_abs_diff", "chi2_seq"}
    full = {n: v for _, n, v in token_scalars(pl.DataFrame(rows)).rows()}
    assert full["log_ppl_diff"] == pytest.approx(math.log(2) / 2) and sequence <= set(full)
    sampled = {n for _, n, _ in token_scalars(pl.DataFrame({**rows, "weight": [1.0, 20.0]})).rows()}
    assert "k3_kl" in sampled and not sequence & sampled


def test_step_scalars_of_a_trainer_run_match_the_analyses():
    run = load_run(SAMPLE / "pg_is")
    scalars = step_scalars(run)
    value = {(s, n): v for s, n, v in scalars.rows()}
    mismatch = mismatch_per_step(run.tokens, aggregates=exact_aggregates(run))  # a sampled run: all tokens
    for row in mismatch.iter_rows(named=True):
        assert value[(row["step"], "k3_kl")] == pytest.approx(row["k3_kl"], rel=1e-6)
    logged = run.metrics.filter(pl.col("name") == "eval/accuracy").collect()
    for step, v in logged.select("step", "value").rows():
        assert value[(step, "eval/accuracy")] == v
    # the trainer's logged block rates win, and equal the rows' (tests/test_sample_run.py)
    assert scalars.filter(pl.col("name") == "blocked/ppo/pos").height == 250
    assert scalars.group_by("step", "name").len()["len"].max() == 1


def test_tensorboard_export_reads_back_with_tensorboards_reader(tmp_path):
    done = export_tensorboard([SAMPLE / "pg_is", SAMPLE / "ppo"], tmp_path / "tb")
    # steps 0–249; the evaluation after the last step, at step 250, is sent but trained nothing
    assert done == {"pg_is": 250, "ppo": 250}
    for name in ("pg_is", "ppo"):
        read = scalars_of(tmp_path / "tb" / name)
        run = load_run(SAMPLE / name)
        expected = with_signals(step_scalars(run), step_signals(run))  # and the alerts' signals
        assert set(read) == set(expected["name"].unique())
        for step, metric, v in expected.rows():
            assert read[metric][step] == pytest.approx(v, rel=1e-6, abs=1e-12), (metric, step)


def test_alerts_are_escaped_text_in_tensorboard(tmp_path):
    run_dir = write_synthetic_run(tmp_path / "run", steps=12, samples_per_step=16, seq_len=16, seed=1, collapse_at=6)
    run = load_run(run_dir)
    alerts = detect_collapse(run)
    assert alerts.height > 0
    export_tensorboard([run_dir], tmp_path / "tb")
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb" / "run"), size_guidance={"tensors": 0})
    acc.Reload()
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors("alerts/text_summary")}
    assert sorted(texts) == sorted(set(alerts["step"].to_list()))
    first = alerts.row(0, named=True)
    assert first["severity"] in texts[first["step"]]


def test_alert_text_stays_text_in_tensorboards_markdown():
    from tensorboard import plugin_util

    alerts = pl.DataFrame(
        {"step": [3], "end_step": [5], "kind": ["blocked_drift"], "severity": ["critical"], "message": [HOSTILE]}
    )
    html = plugin_util.markdown_to_safe_html(alert_text(alerts)[3])
    assert "<img" not in html and "<a " not in html and "href" not in html
    assert "onerror" in html  # shown, as text


def test_wandb_offline_export(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = write_synthetic_run(tmp_path / "run", steps=12, samples_per_step=16, seq_len=16, seed=1, collapse_at=6)
    done = export_wandb([run_dir], project="trustlens-test", dir=str(tmp_path))
    assert done == {"run": 12}
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    logged = history(offline)
    expected = step_scalars(load_run(run_dir))
    for step, metric, v in expected.rows():
        assert logged[step][metric] == pytest.approx(v, rel=1e-9), (metric, step)
    tables = {p.name.split("_")[0] for p in (offline / "files" / "media" / "table").glob("*.table.json")}
    assert tables >= {"alerts", "driving"}


class ListSink:
    """A sink that keeps what it is given."""

    def __init__(self):
        self.steps, self.closed = {}, False

    def log_step(self, step, scalars):
        self.steps[step] = scalars

    def close(self):
        self.closed = True


def record_steps(rec, steps: int, gen: torch.Generator, responses: int = 4) -> None:
    """`steps` steps of 2 updates of `responses` (a multiple of 4) responses of 6 tokens, with
    advantages 1, -1, 0, 2, 1, -1, ..."""
    for step in range(steps):
        mu = -torch.rand(responses, 6, generator=gen) - 0.05
        pi = mu + 0.3 * torch.randn(responses, 6, generator=gen)
        for update in range(2):
            rec.record(
                step,
                update=update,
                token_ids=torch.randint(0, 50, (responses, 6), generator=gen),
                response_mask=torch.ones(responses, 6),
                pi_logp=pi.clamp(max=0),
                mu_logp=mu,
                old_logp=(mu + 0.01).clamp(max=0),
                advantages=torch.tensor([1.0, -1.0, 0.0, 2.0]).repeat(responses // 4),
            )
        rec.log_metrics(step, {"reward/mean": float(step)})


@pytest.mark.parametrize("keep", [None, Keep(rate=0.01)], ids=["all-rows", "keep-0.01"])
def test_mirror_streams_the_scalars_of_each_step(tmp_path, gen, keep):
    """Per step, the mirror sends the names and values `trustlens export` sends (step_scalars of
    the recorded run); of a sampled run, the exact ones of its aggregates."""
    sink = ListSink()
    with TokenRecorder(tmp_path / "run", rules=["ppo", "dppo_binary_tv"], keep=keep, mirror=sink) as rec:
        record_steps(rec, 3, gen)
    run = load_run(tmp_path / "run")
    assert sink.closed and run.sampled == (keep is not None)
    expected: dict[int, dict[str, float]] = {}
    for step, metric, v in step_scalars(run).rows():
        expected.setdefault(step, {})[metric] = v
    assert sorted(sink.steps) == sorted(expected) == [0, 1, 2]
    for step, values in expected.items():
        assert sink.steps[step] == pytest.approx(values, rel=1e-9, abs=1e-15), step
        assert {"blocked/ppo/neg", "k3_kl", "zero_adv_frac"} <= set(values)
    assert sink.steps[2]["reward/mean"] == 2.0


def test_a_sampled_mirror_sends_the_rates_of_all_tokens_not_of_the_kept_rows(tmp_path):
    """Keep keeps every token the active rule blocks and few others: ppo blocks ~90% of the kept A < 0 rows (what
    the mirror sent before it read the aggregates), ~19% of all A < 0 tokens. The mirror of the
    sampled recording sends the rates of a recording of every row, and no sequence-level mismatch."""
    sinks = {"full": ListSink(), "sampled": ListSink()}
    for name, keep in (("full", None), ("sampled", Keep(rate=0.01))):
        with TokenRecorder(tmp_path / name, rules=["ppo"], active_rule="ppo", keep=keep, mirror=sinks[name]) as rec:
            record_steps(rec, 3, torch.Generator().manual_seed(0), responses=64)  # the same tokens
    kept = load_run(tmp_path / "sampled").tokens.filter(pl.col("advantage") < 0)
    kept_rate = dict(kept.group_by("step").agg(pl.col("blocked_ppo").mean()).collect().rows())
    full, sampled = sinks["full"].steps, sinks["sampled"].steps
    for step in range(3):
        rates = {n: v for n, v in full[step].items() if n.startswith("blocked/")}
        assert {n: sampled[step][n] for n in rates} == rates  # exact: counts over the same tokens
        assert kept_rate[step] > 0.8 and 0.15 < full[step]["blocked/ppo/neg"] < 0.25
        assert sampled[step]["k3_kl"] == pytest.approx(full[step]["k3_kl"], rel=1e-6)
        assert set(SEQUENCE_LEVEL) <= set(full[step]) and not set(SEQUENCE_LEVEL) & set(sampled[step])


TOPK_MISMATCH = ("topk_tv_mean", "topk_tv_max", "topk_kl_mean")


def record_topk_steps(path: Path, keep: Keep | None, log: bool) -> tuple[dict, dict]:
    """3 steps of 2 updates with top-K divergences from logits, the same tokens on every call;
    `log`: log the top-K mismatch of μ vs π_old from π_old's logits, as the built-in trainer
    does (trustlens.train.step_metrics.mismatch_metrics). Returns the logged values per step and the
    mean of the token column topk_tv (μ vs π, over the step's updates) per step."""
    gen = torch.Generator().manual_seed(0)
    vocab, k = 40, 5
    logged, column_mean = {}, {}

    def logp(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return logits.log_softmax(-1).gather(-1, ids[..., None])[..., 0]

    with TokenRecorder(path, rules=["ppo", "dppo_topk_tv"], keep=keep) as rec:
        for step in range(3):
            mu_logits = 2 * torch.randn(8, 6, vocab, generator=gen)
            ids = torch.multinomial(mu_logits.softmax(-1).reshape(-1, vocab), 1, generator=gen).reshape(8, 6)
            mu_ids, mu_topk_logp = topk_from_logits(mu_logits, ids, k)
            old_logits = mu_logits + 0.2 * torch.randn(8, 6, vocab, generator=gen)
            pi_logits = [old_logits, old_logits + 0.8 * torch.randn(8, 6, vocab, generator=gen)]
            for update, logits in enumerate(pi_logits):
                rec.record(
                    step,
                    update=update,
                    token_ids=ids,
                    response_mask=torch.ones(8, 6),
                    pi_logp=logp(logits, ids),
                    mu_logp=logp(mu_logits, ids),
                    old_logp=logp(old_logits, ids),
                    advantages=torch.tensor([1.0, -1.0, 0.0, 2.0]).repeat(2),
                    logits=logits,
                    mu_topk_ids=mu_ids,
                    mu_topk_logp=mu_topk_logp,
                )
            tv_pi = torch.stack([topk_divergence(x, mu_ids, mu_topk_logp)[0] for x in pi_logits])
            column_mean[step] = float(tv_pi.double().mean())
            if log:
                tv, kl = (x.double() for x in topk_divergence(old_logits, mu_ids, mu_topk_logp))
                logged[step] = {
                    "topk_tv_mean": float(tv.mean()),
                    "topk_tv_max": float(tv.max()),
                    "topk_kl_mean": float(kl.mean()),
                }
                rec.log_metrics(step, logged[step])
    return logged, column_mean


@pytest.mark.parametrize("keep", [None, Keep(rate=0.05)], ids=["all-rows", "keep-0.05"])
def test_topk_mismatch_is_sent_as_logged_mu_vs_pi_old_or_not_at_all(tmp_path, keep):
    """topk_tv_mean, topk_tv_max and topk_kl_mean are μ vs π_old (docs/metrics.md): sent as the
    run logged them, and not at all by a run that logged none, sampled or not. The token columns
    topk_tv / topk_kl are μ vs π, whose means (stored in the aggregates) are another number."""
    for log in (True, False):
        logged, column_mean = record_topk_steps(tmp_path / f"log-{log}", keep, log)
        run = load_run(tmp_path / f"log-{log}")
        assert run.sampled == (keep is not None)
        sent: dict[int, dict[str, float]] = {}
        for step, name, value in step_scalars(run).rows():
            sent.setdefault(step, {})[name] = value
        assert sorted(sent) == [0, 1, 2]
        for step, values in sent.items():
            assert "k3_kl" in values
            if log:
                assert {n: values[n] for n in TOPK_MISMATCH} == pytest.approx(logged[step], rel=1e-6)
                assert values["topk_tv_mean"] < 0.5 * column_mean[step]  # μ vs π is further off
            else:
                assert not set(TOPK_MISMATCH) & set(values)
        if keep is not None:  # the aggregates hold the column's mean over every token, under no name
            steps = step_aggregates(run.aggregates)
            got = (steps["sum_topk_tv"] / steps["topk_n"]).to_list()
            assert got == pytest.approx([column_mean[s] for s in range(3)], rel=1e-6)
            assert steps["topk_n"].to_list() == [2 * 8 * 6] * 3


def test_mirror_to_tensorboard_during_a_training_run(tmp_path):
    from trustlens.train.config import config_from_preset
    from trustlens.train.trainer import train

    cfg = config_from_preset("quick", mirror=f"tensorboard:{tmp_path / 'tb'}")
    train(cfg, tmp_path / "run")
    read = scalars_of(tmp_path / "tb")
    expected = step_scalars(load_run(tmp_path / "run"))
    assert set(read) == set(expected["name"].unique())
    for step, metric, v in expected.rows():
        assert read[metric][step] == pytest.approx(v, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("keep", [None, Keep(rate=0.5)], ids=["all-rows", "keep-0.5"])
def test_the_records_win_over_a_logged_value_and_inf_is_sent(tmp_path, keep):
    """A logged value under a name the records give (token rows, or a sampled run's aggregates)
    is replaced by the records' exact value, what the dashboard shows; `shard=True` (one rank's
    rows) keeps the logged one. +inf, from the records or logged, is a value and reaches
    TensorBoard; NaN is no value and is left out."""
    mu = torch.full((2, 4), math.log(0.5))
    old = mu.clone()
    old[0, 1] = -math.inf  # π_old gives the sampled token probability 0: KL(μ ‖ π_old) = +inf
    sink = ListSink()
    with TokenRecorder(tmp_path / "run", rules=["ppo"], keep=keep, mirror=sink) as rec:
        rec.record(
            0,
            token_ids=torch.zeros(2, 4, dtype=torch.long),
            response_mask=torch.ones(2, 4),
            pi_logp=torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.5, 0.3, 0.3, 0.5]])),  # ppo blocks 2 of 4
            mu_logp=mu,
            old_logp=old,
            advantages=torch.tensor([1.0, -1.0]),
        )
        logged = {"mismatch_kl": 0.25, "blocked/ppo/neg": 0.9, "topk_kl_mean": math.inf, "reward/mean": math.nan}
        rec.log_metrics(0, logged)
    run = load_run(tmp_path / "run")
    sent = {n: v for _, n, v in step_scalars(run).rows()}
    assert sent["mismatch_kl"] == sent["topk_kl_mean"] == math.inf and sent["blocked/ppo/neg"] == 0.5
    assert "reward/mean" not in sent and sink.steps[0] == sent  # the live mirror sends the same
    shard = {n: v for _, n, v in step_scalars(run, shard=True).rows()}
    assert shard == {**sent, "mismatch_kl": 0.25, "blocked/ppo/neg": 0.9}
    export_tensorboard([run], tmp_path / "tb")
    read = scalars_of(tmp_path / "tb" / "run")
    assert read["mismatch_kl"][0] == read["topk_kl_mean"][0] == math.inf and "reward/mean" not in read


def test_a_failing_mirror_warns_and_the_recording_goes_on(tmp_path, gen):
    class Broken(ListSink):
        def log_step(self, step, scalars):
            raise OSError("disk of the mirror is full")

    with (
        pytest.warns(UserWarning, match="disk of the mirror is full"),
        TokenRecorder(tmp_path / "run", rules=["ppo"], mirror=Broken()) as rec,
    ):
        record_steps(rec, 3, gen)
    run = load_run(tmp_path / "run")
    assert run.status == "finished" and run.tokens.select(pl.len()).collect().item() == 3 * 2 * 24


def test_mirror_arguments_are_checked(tmp_path):
    for bad in ("tensorboard", "tensorboard:", "mlflow:x", 3):
        with pytest.raises(ValueError, match="mirror must be"):
            make_mirror(bad)
    assert isinstance(make_mirror(f"tensorboard:{tmp_path}"), StepMirror)
    with pytest.raises(ValueError, match="mirror must be"):
        TokenRecorder(tmp_path / "run", mirror="nope")
    assert not (tmp_path / "run" / "run.json").exists()


def test_missing_extra_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ImportError, match=r'pip install "trustlens\[tensorboard\]"'):
        require("tensorboardX")
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r'pip install "trustlens\[wandb\]"'):
        require("wandb")


def test_export_a_run_on_s3(s3, tmp_path):
    url = f"s3://{BUCKET}/runs/exp"
    write_synthetic_run(url, steps=4, samples_per_step=8, seq_len=8, seed=3)
    export_tensorboard([url], tmp_path / "tb")
    read = scalars_of(tmp_path / "tb" / "exp")
    run = load_run(url)
    expected = with_signals(step_scalars(run), step_signals(run))
    assert {m for _, m, _ in expected.rows()} == set(read)
    assert all(math.isclose(read[m][s], v, rel_tol=1e-6, abs_tol=1e-12) for s, m, v in expected.rows())


def test_cli(tmp_path, capsys):
    # in-process: trustlens.cli.main is what `trustlens export` runs (a process of its own only adds its start-up)
    from trustlens.cli import main

    assert main(["export", str(SAMPLE / "ppo"), "--to", "tensorboard", str(tmp_path)]) == 0
    assert "ppo: 250 training steps and their evaluations exported to tensorboard" in capsys.readouterr().out
    assert "eval/accuracy" in scalars_of(tmp_path / "ppo")
    assert main(["export", str(SAMPLE / "ppo"), "--to", "tensorboard"]) != 0
    assert "--to must be" in capsys.readouterr().err

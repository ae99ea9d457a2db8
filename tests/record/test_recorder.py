import json
import math
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import torch

from trustlens import NullRecorder, TokenRecorder, __version__, load_run
from trustlens.divergence import topk_divergence, topk_from_logits
from trustlens.record import SAMPLE_RANK, SAMPLE_STEP
from trustlens.rules import RULES, evaluate
from trustlens.run import META_SCHEMA_VERSION, META_TRUSTLENS_VERSION, SCHEMA_VERSION, RejectedInputError, WriterError
from trustlens.run.parts import PartFiles

B, T, V, K = 3, 5, 11, 4


class CountingTokenizer:
    """decode([id]) -> "<id>", counting how often each id is decoded."""

    def __init__(self):
        self.calls: dict[int, int] = {}

    def decode(self, ids):
        (i,) = ids
        self.calls[i] = self.calls.get(i, 0) + 1
        return f"<{i}>"


def make_batch(gen, b=B, t=T, v=V, dtype=torch.float32):
    """Random consistent inputs: π from logits, μ and π_old nearby, a mask with padding."""
    logits = torch.randn(b, t, v, generator=gen, dtype=torch.float64) * 2
    ids = torch.randint(0, v, (b, t), generator=gen)
    logp_all = torch.log_softmax(logits, -1)
    pi = logp_all.gather(-1, ids[..., None])[..., 0]
    mu = (pi + 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    old = (pi + 0.1 * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, 3:] = False
    mask[2, 1] = False  # a hole inside a response
    return {
        "token_ids": ids,
        "response_mask": mask,
        "pi_logp": pi.to(dtype),
        "mu_logp": mu.to(dtype),
        "old_logp": old.to(dtype),
        "advantages": torch.randn(b, generator=gen, dtype=torch.float64).to(dtype),
        "logits": logits.to(dtype),
    }


def tokens_of(run_dir) -> pl.DataFrame:
    return load_run(run_dir).tokens.collect().sort("step", "update", "sample", "pos")


def manifest_of(run_dir) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


def valid(x: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    return x[mask].double().numpy()


def test_round_trip_values(tmp_path, gen):
    batch = make_batch(gen)
    batch.pop("logits")
    tok = CountingTokenizer()
    with TokenRecorder(tmp_path / "run", tokenizer=tok, rules=["ppo"], config={"lr": 1e-6}) as rec:
        n = rec.record(7, update=2, sample_ids=[10, 11, 12], group_ids=[1, 1, 2], **batch)
    mask = batch["response_mask"]
    assert n == int(mask.sum()) == 12
    df = tokens_of(tmp_path / "run")
    assert df.height == 12
    b, t = torch.nonzero(mask, as_tuple=True)
    assert df["step"].to_list() == [7] * 12 and df["update"].to_list() == [2] * 12
    assert df["rank"].to_list() == [0] * 12
    assert df["sample"].to_list() == [10 + int(i) for i in b]
    assert df["group"].to_list() == [[1, 1, 2][int(i)] for i in b]
    assert df["pos"].to_list() == t.tolist()
    ids = batch["token_ids"][mask].tolist()
    assert df["token_id"].to_list() == ids
    assert df["token"].cast(pl.String).to_list() == [f"<{i}>" for i in ids]
    pi, mu, old = (valid(batch[k], mask) for k in ("pi_logp", "mu_logp", "old_logp"))
    np.testing.assert_allclose(df["pi_logp"].to_numpy(), pi, rtol=1e-6)
    np.testing.assert_allclose(df["mu_logp"].to_numpy(), mu, rtol=1e-6)
    np.testing.assert_allclose(df["old_logp"].to_numpy(), old, rtol=1e-6)
    np.testing.assert_allclose(df["ratio"].to_numpy(), np.exp(pi - mu), rtol=1e-5)
    # binary TV and KL(μ‖π) from their float64 definitions
    p, m = np.exp(pi), np.exp(mu)
    np.testing.assert_allclose(df["binary_tv"].to_numpy(), np.abs(p - m), rtol=1e-4, atol=1e-7)
    kl = m * np.log(m / p) + (1 - m) * np.log((1 - m) / (1 - p))
    np.testing.assert_allclose(df["binary_kl"].to_numpy(), kl, rtol=1e-4, atol=1e-7)
    adv = batch["advantages"][b].double().numpy()
    np.testing.assert_allclose(df["advantage"].to_numpy(), adv, rtol=1e-6)
    assert df["entropy"].null_count() == 12 and df["topk_tv"].null_count() == 12
    # each distinct token id decoded once
    assert set(tok.calls) == set(ids) and set(tok.calls.values()) == {1}
    manifest = manifest_of(tmp_path / "run")
    assert manifest["status"] == "finished" and manifest["error"] is None
    assert manifest["config"] == {"lr": 1e-6}
    assert manifest["schema_version"] == SCHEMA_VERSION and manifest["trustlens_version"] == __version__
    assert manifest["rules"] == {
        "ppo": {
            "low": 0.2,
            "high": 0.2,
            "anchor": "mu",
            "measure": "ratio",
            "weight": "ratio",
            "tis_cap": None,
            "description": RULES["ppo"].description,
        }
    }
    assert manifest["anchor"] == "mu" and manifest["world_size"] == 1
    assert set(manifest["missing"]) == {"topk_tv", "topk_kl", "entropy"}


def test_blocked_equals_rules_evaluate_for_every_rule(tmp_path, gen):
    batch = make_batch(gen, b=6, t=7, v=13)
    mask = batch["response_mask"]
    topk_ids, topk_logp = topk_from_logits(batch["logits"] + 0.2, batch["token_ids"], K)
    with TokenRecorder(tmp_path / "run", rules={**{r: (None, None) for r in RULES}, "ppo": (0.1, 0.3)}) as rec:
        rec.record(0, mu_topk_ids=topk_ids, mu_topk_logp=topk_logp, **batch)
    df = tokens_of(tmp_path / "run")
    tv, kl = topk_divergence(batch["logits"], topk_ids, topk_logp)
    np.testing.assert_allclose(df["topk_tv"].to_numpy(), valid(tv, mask), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(df["topk_kl"].to_numpy(), valid(kl, mask), rtol=1e-5, atol=1e-7)
    p = torch.softmax(batch["logits"].double(), -1)
    entropy = -(p * p.log()).sum(-1)
    np.testing.assert_allclose(df["entropy"].to_numpy(), valid(entropy, mask), rtol=1e-5)
    args = {k: batch[k] for k in ("pi_logp", "mu_logp", "old_logp", "advantages")}
    for rule in RULES:
        thresholds = {"low": 0.1, "high": 0.3} if rule == "ppo" else {}
        expected = evaluate(rule, topk_tv=tv, topk_kl=kl, response_mask=mask, **args, **thresholds)[mask]
        assert df[f"blocked_{rule}"].to_list() == expected.tolist(), rule
    assert any(df[f"blocked_{r}"].any() for r in RULES)  # the data exercises the rules
    assert manifest_of(tmp_path / "run")["missing"] == []


def test_temperature_divides_the_logits(tmp_path, gen):
    batch = make_batch(gen)
    mask = batch["response_mask"]
    tau = 0.7
    topk_ids, topk_logp = topk_from_logits(batch["logits"], batch["token_ids"], K, temperature=tau)
    with TokenRecorder(tmp_path / "run", rules=["dppo_topk_tv"]) as rec:
        rec.record(0, mu_topk_ids=topk_ids, mu_topk_logp=topk_logp, temperature=tau, **batch)
    df = tokens_of(tmp_path / "run")
    p = torch.softmax(batch["logits"].double() / tau, -1)
    np.testing.assert_allclose(df["entropy"].to_numpy(), valid(-(p * p.log()).sum(-1), mask), rtol=1e-5)
    tv, _ = topk_divergence(batch["logits"], topk_ids, topk_logp, temperature=tau)
    np.testing.assert_allclose(df["topk_tv"].to_numpy(), valid(tv, mask), rtol=1e-5, atol=1e-7)
    assert df["topk_tv"].max() < 1e-5  # μ's top-K came from the same tempered distribution


def test_inputs_that_require_grad(tmp_path, gen):
    batch = make_batch(gen)
    batch = {k: v.requires_grad_() if v.is_floating_point() else v for k, v in batch.items()}
    batch["entropy"] = torch.ones(B, T, requires_grad=True)
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        assert rec.record(0, **batch) == int(batch["response_mask"].sum())
    assert tokens_of(tmp_path / "run")["entropy"].to_list() == [1.0] * 12


def test_padding_may_hold_garbage(tmp_path, gen):
    batch = make_batch(gen)
    mask = batch["response_mask"]
    for key in ("pi_logp", "mu_logp", "old_logp"):
        batch[key] = batch[key].masked_fill(~mask, math.nan)
    batch["advantages"] = torch.randn(B, T, generator=gen).masked_fill(~mask, math.inf)
    batch["token_ids"] = batch["token_ids"].masked_fill(~mask, -100)
    with TokenRecorder(tmp_path / "run", rules=["ppo", "dppo_binary_tv"]) as rec:
        assert rec.record(0, **batch) == int(mask.sum())
    df = tokens_of(tmp_path / "run")
    assert df.height == int(mask.sum())
    assert df.select(pl.col("pi_logp", "mu_logp", "advantage").is_nan().any()).row(0) == (False, False, False)
    assert df["token_id"].min() >= 0


def test_sequence_and_token_advantages_agree(tmp_path, gen):
    batch = make_batch(gen)
    batch.pop("logits")
    per_token = dict(batch, advantages=batch["advantages"][:, None].expand(B, T).clone())
    with TokenRecorder(tmp_path / "seq") as rec:
        rec.record(0, **batch)
    with TokenRecorder(tmp_path / "tok") as rec:
        rec.record(0, **per_token)
    assert tokens_of(tmp_path / "seq").equals(tokens_of(tmp_path / "tok"))


def test_bf16_inputs_are_upcast(tmp_path, gen):
    batch = make_batch(gen, dtype=torch.bfloat16)
    mask = batch["response_mask"]
    with TokenRecorder(tmp_path / "run", rules=["dppo_binary_tv"]) as rec:
        rec.record(0, **batch)
    df = tokens_of(tmp_path / "run")
    pi, mu = valid(batch["pi_logp"], mask), valid(batch["mu_logp"], mask)  # exact bf16 values
    np.testing.assert_array_equal(df["pi_logp"].to_numpy(), pi.astype(np.float32))
    np.testing.assert_allclose(df["binary_tv"].to_numpy(), np.abs(np.exp(pi) - np.exp(mu)), rtol=1e-5, atol=1e-7)
    p = torch.softmax(batch["logits"].double(), -1)
    np.testing.assert_allclose(df["entropy"].to_numpy(), valid(-(p * p.log()).sum(-1), mask), rtol=1e-5)


def test_missing_mu_anchors_on_old(tmp_path, gen):
    batch = make_batch(gen)
    batch.pop("logits")
    mu = batch.pop("mu_logp")
    mask = batch["response_mask"]
    with TokenRecorder(tmp_path / "run", rules=["ppo", "minirl"]) as rec:
        rec.record(0, **batch)
        rec.flush()
        assert manifest_of(tmp_path / "run")["anchor"] == "old"
        rec.record(1, mu_logp=mu, **batch)
    df = tokens_of(tmp_path / "run")
    first = df.filter(pl.col("step") == 0)
    assert first["mu_logp"].null_count() == first.height
    pi, old = valid(batch["pi_logp"], mask), valid(batch["old_logp"], mask)
    np.testing.assert_allclose(first["ratio"].to_numpy(), np.exp(pi - old), rtol=1e-5)
    expected = evaluate("ppo", pi_logp=batch["pi_logp"], mu_logp=batch["old_logp"], advantages=batch["advantages"])
    assert first["blocked_ppo"].to_list() == expected[mask].tolist()
    manifest = manifest_of(tmp_path / "run")
    assert manifest["anchor"] == "mixed"  # step 1 brought μ
    assert "mu_logp" not in manifest["missing"]


def test_default_rules_missing_inputs_are_null_and_listed(tmp_path, gen):
    batch = make_batch(gen)
    batch.pop("logits")
    batch.pop("old_logp")
    with TokenRecorder(tmp_path / "run") as rec:
        rec.record(0, **batch)
    df = tokens_of(tmp_path / "run")
    undecided = {
        "minirl",
        "dppo_topk_tv",
        "dppo_topk_kl",
        "dppo_binary_tv_recompute",
        "dppo_binary_kl_recompute",
        "grpo_tis",
        "icepop",
        "gspo",
        "gmpo",
        "rs_token",
        "rs_seq",
        "rs_geo",
        "grpo_seq_tis",
        "clip_cov",
        "kl_cov",
    }
    for rule in RULES:
        assert df[f"blocked_{rule}"].null_count() == (df.height if rule in undecided else 0), rule
    missing = manifest_of(tmp_path / "run")["missing"]
    assert set(missing) == {"old_logp", "topk_tv", "topk_kl", "entropy"} | {f"blocked_{r}" for r in undecided}


@pytest.mark.parametrize(
    "rule,drop,message",
    [
        ("minirl", "old_logp", r"rule 'minirl' needs old_logp"),
        ("dppo_topk_kl", "logits", r"rule 'dppo_topk_kl' needs topk_kl"),
    ],
)
def test_named_rules_must_be_decidable(tmp_path, gen, rule, drop, message):
    batch = make_batch(gen)
    batch.pop(drop)
    with TokenRecorder(tmp_path / "run", rules=["ppo", rule]) as rec, pytest.raises(ValueError, match=message):
        rec.record(0, **batch)
    assert not any((tmp_path / "run").rglob("*.parquet"))


def _bad(batch, **changes):
    return {**batch, **changes}


BAD_INPUTS = [
    ("shape", lambda b: _bad(b, mu_logp=b["mu_logp"][:, :-1]), r"mu_logp has shape \(3, 4\); expected \(3, 5\)"),
    (
        "nan",
        lambda b: _bad(b, pi_logp=b["pi_logp"].index_put((torch.tensor(1), torch.tensor(2)), torch.tensor(math.nan))),
        r"pi_logp contains NaN.*\(1, 2\)",
    ),
    (
        "inf",
        lambda b: _bad(b, old_logp=b["old_logp"].index_put((torch.tensor(2), torch.tensor(4)), torch.tensor(math.inf))),
        r"old_logp contains inf.*\(2, 4\)",
    ),
    (
        "positive logp",
        lambda b: _bad(b, mu_logp=b["mu_logp"].index_put((torch.tensor(0), torch.tensor(1)), torch.tensor(0.5))),
        r"mu_logp holds positive log-probabilities.*\(0, 1\)",
    ),
    ("advantage nan", lambda b: _bad(b, advantages=torch.tensor([0.0, math.nan, 1.0])), r"advantages contains NaN"),
    ("advantage shape", lambda b: _bad(b, advantages=torch.zeros(4)), r"advantages has shape \(4,\)"),
    (
        "mask values",
        lambda b: _bad(b, response_mask=b["response_mask"].float() * 2),
        r"response_mask must hold only 0 and 1",
    ),
    ("mask shape", lambda b: _bad(b, response_mask=b["response_mask"][:2]), r"response_mask has shape"),
    ("float ids", lambda b: _bad(b, token_ids=b["token_ids"].float()), r"token_ids must be an integer tensor"),
    (
        "id outside vocab",
        lambda b: _bad(b, token_ids=b["token_ids"].index_put((torch.tensor(1), torch.tensor(0)), torch.tensor(V))),
        r"token_ids holds id 11 at \(b, t\) = \(1, 0\), a valid position; ids must be in \[0, 11\) \(the vocabulary",
    ),
    ("no anchor", lambda b: _bad(b, mu_logp=None, old_logp=None), r"needs mu_logp or old_logp"),
    ("topk half", lambda b: _bad(b, mu_topk_ids=torch.zeros(B, T, K, dtype=torch.long)), r"must be given together"),
    (
        "topk duplicate",
        lambda b: _bad(b, mu_topk_ids=torch.zeros(B, T, K, dtype=torch.long), mu_topk_logp=torch.full((B, T, K), -2.0)),
        r"mu_topk_ids repeats id",
    ),
    (
        "K > V",
        lambda b: _bad(
            b, mu_topk_ids=torch.arange(V + 1).expand(B, T, V + 1), mu_topk_logp=torch.full((B, T, V + 1), -3.0)
        ),
        r"K = 12 ids per position, more than the vocabulary",
    ),
    (
        "logits nan",
        lambda b: _bad(b, logits=b["logits"].index_put((torch.tensor(2), torch.tensor(3)), torch.tensor(math.nan))),
        r"logits hold NaN or \+inf at \(b, t\) = \(2, 3\)",
    ),
    ("entropy negative", lambda b: _bad(b, entropy=-torch.ones(B, T)), r"entropy holds negative values"),
    ("step", lambda b: _bad(b, step=-1), r"step must be an integer in \[0, "),
    ("update", lambda b: _bad(b, update=1.5), r"update must be an integer"),
    ("sample ids", lambda b: _bad(b, sample_ids=[1, 2]), r"sample_ids has shape \(2,\); expected \(3,\)"),
    ("temperature", lambda b: _bad(b, temperature=0.0), r"temperature must be a finite number > 0"),
]


# bad values of CPU tensors: found by the writer thread on its copy, raised by the next call
BAD_VALUES = {"nan", "inf", "positive logp", "entropy negative"}


@pytest.mark.parametrize("name,change,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_and_records_nothing(tmp_path, gen, name, change, message):
    batch = make_batch(gen)
    with TokenRecorder(tmp_path / "run", rules=["ppo", "dppo_binary_tv"]) as rec:
        rec.record(0, **batch)
        args = change(dict(batch, step=1))
        if name in BAD_VALUES:
            rec.record(**args)  # queued; its rows are dropped by the writer thread
            with pytest.raises(RejectedInputError, match=r"record\(step=1, update=0\) was not recorded: " + message):
                rec.flush()
            rec.flush()  # raised once
        else:
            with pytest.raises(ValueError, match=message):
                rec.record(**args)
            rec.flush()
        assert manifest_of(tmp_path / "run")["status"] == "running"
        rec.record(1, **batch)  # the recorder still works
    df = tokens_of(tmp_path / "run")
    assert sorted(set(df["step"].to_list())) == [0, 1]
    assert df.height == 2 * int(batch["response_mask"].sum())
    # a call that failed its checks took no default sample ids; a dropped one did
    first = B if name in BAD_VALUES else 0
    assert sorted(set(df.filter(pl.col("step") == 1)["sample"])) == [SAMPLE_STEP + first + i for i in range(B)]


def test_a_dropped_call_is_raised_by_the_next_call_which_records(tmp_path, gen):
    batch = make_batch(gen)
    bad = dict(batch, pi_logp=batch["pi_logp"].index_put((torch.tensor(0), torch.tensor(1)), torch.tensor(0.5)))
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(0, **bad)
        deadline = time.monotonic() + 30
        while not rec._writer.rejected and time.monotonic() < deadline:  # the writer finds it
            time.sleep(0.01)
        with pytest.raises(RejectedInputError, match=r"step=0.*pi_logp holds positive log-probabilities"):
            rec.record(1, **batch)
        rec.log_metrics(1, {"x": 1.0})  # raised once
    assert sorted(set(tokens_of(tmp_path / "run")["step"].to_list())) == [1]
    # a bad last call is raised by close, after the run is written and finished
    with pytest.raises(RejectedInputError, match="step=2"), TokenRecorder(tmp_path / "run2", rules=["ppo"]) as rec:
        rec.record(1, **batch)
        rec.record(2, **bad)
    assert manifest_of(tmp_path / "run2")["status"] == "finished"
    assert sorted(set(tokens_of(tmp_path / "run2")["step"].to_list())) == [1]
    # every dropped call is reported: named, or counted when several wait for the next call
    raised = []
    with TokenRecorder(tmp_path / "run3", rules=["ppo"]) as rec:
        for call in (lambda: rec.record(1, **bad), lambda: rec.record(2, **bad), rec.flush):
            try:
                call()
            except RejectedInputError as err:
                raised.append(str(err))
    text = " | ".join(raised)
    assert "step=1" in text and ("step=2" in text or "; and 1 later call(s) were dropped too" in text)


def test_all_padding_records_nothing(tmp_path, gen):
    batch = make_batch(gen)
    batch["response_mask"] = torch.zeros(B, T)
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        assert rec.record(0, **batch) == 0
    assert not any((tmp_path / "run").rglob("*.parquet"))


def test_unknown_rule_and_active_rule(tmp_path):
    with pytest.raises(KeyError, match="unknown rule 'ppo2'"):
        TokenRecorder(tmp_path / "a", rules=["ppo2"])
    with pytest.raises(ValueError, match="active_rule 'cispo' is not among"):
        TokenRecorder(tmp_path / "b", rules=["ppo"], active_rule="cispo")


def test_with_block_error_marks_run_failed(tmp_path, gen):
    batch = make_batch(gen)
    with pytest.raises(ZeroDivisionError), TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(0, **batch)
        _ = 1 / 0
    manifest = manifest_of(tmp_path / "run")
    assert manifest["status"] == "failed"
    assert manifest["error"] == "ZeroDivisionError: division by zero"
    assert tokens_of(tmp_path / "run").height == int(batch["response_mask"].sum())  # rows kept


def test_writer_error_surfaces_in_caller(tmp_path, gen, monkeypatch):
    def broken(self, decoder):
        raise OSError("disk full")

    monkeypatch.setattr(PartFiles, "write", broken)
    batch = make_batch(gen)
    rec = TokenRecorder(tmp_path / "run", rules=["ppo"])
    rec.record(0, **batch)
    with pytest.raises(WriterError, match="disk full"):
        rec.flush()
    with pytest.raises(WriterError, match="disk full"):
        rec.record(1, **batch)
    with pytest.raises(WriterError):
        rec.close()
    manifest = manifest_of(tmp_path / "run")
    assert manifest["status"] == "failed" and "disk full" in manifest["error"]


def test_part_files_roll_sort_and_carry_metadata(tmp_path, gen):
    batch = make_batch(gen)
    rows = int(batch["response_mask"].sum())
    with TokenRecorder(tmp_path / "run", rules=["ppo"], rows_per_file=2 * rows, tokenizer=CountingTokenizer()) as rec:
        for step in (5, 3, 4, 1, 2):  # out of order: each file is sorted by step
            rec.record(step, **batch)
    shard = tmp_path / "run" / "tokens" / "rank=0"
    files = sorted(shard.iterdir())
    assert [f.name for f in files] == ["part-000000.parquet", "part-000001.parquet", "part-000002.parquet"]
    steps = [pq.read_table(f).column("step").to_pylist() for f in files]
    assert steps == [[3] * rows + [5] * rows, [1] * rows + [4] * rows, [2] * rows]
    pf = pq.ParquetFile(files[0])
    meta = pf.schema_arrow.metadata
    assert meta[META_SCHEMA_VERSION] == str(SCHEMA_VERSION).encode()
    assert meta[META_TRUSTLENS_VERSION] == __version__.encode()
    assert str(pf.schema_arrow.field("token").type) == "dictionary<values=string, indices=int32, ordered=0>"
    assert pf.metadata.row_group(0).column(0).statistics.min == 3  # prunable by step


def test_metrics_and_samples(tmp_path, gen):
    batch = make_batch(gen)
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(3, **batch)
        rec.log_metrics(3, {"reward/mean": 0.5, "loss": torch.tensor(1.25), "n": 7})
        rec.log_samples(
            3,
            prompts=["1+1=", "2+2=", "<b>x</b>"],
            responses=["2", "4", "🙂"],
            rewards=torch.tensor([1.0, 0.0, 1.0]),
            lengths=[3, 5, 4],
        )
        with pytest.raises(ValueError, match=r"metric 'x' must be a number"):
            rec.log_metrics(3, {"x": "high"})
        with pytest.raises(ValueError, match="differ in length"):
            rec.log_samples(3, prompts=["a"], rewards=[1.0, 2.0])
        with pytest.raises(ValueError, match=r"rewards\[1\] must be a finite number, got inf"):
            rec.log_samples(3, rewards=[1.0, math.inf])
        rec.log_samples(4, rewards=[math.nan, None, 2.0])
    run = load_run(tmp_path / "run")
    metrics = run.metrics.collect().sort("name")
    assert metrics.select("step", "name", "value").rows() == [(3, "loss", 1.25), (3, "n", 7.0), (3, "reward/mean", 0.5)]
    assert run.samples.filter(pl.col("step") == 4).collect().sort("sample")["reward"].to_list() == [None, None, 2.0]
    samples = run.samples.filter(pl.col("step") == 3).collect().sort("sample")
    base = 3 * SAMPLE_STEP
    assert samples["sample"].to_list() == [base, base + 1, base + 2]
    assert samples["response"].to_list() == ["2", "4", "🙂"] and samples["prompt"][2] == "<b>x</b>"
    assert samples["advantage"].null_count() == 3
    # default ids join tokens to their samples
    joined = run.tokens.join(run.samples, on=["step", "sample"]).collect()
    assert joined.height == int(batch["response_mask"].sum())


def test_caller_may_reuse_its_tensors_after_record(tmp_path, gen):
    batch = make_batch(gen)
    batch.pop("logits")
    batch["sample_ids"] = torch.tensor([10, 11, 12])
    expected = batch["pi_logp"][batch["response_mask"]].clone()
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(0, **batch)
        for value in batch.values():  # the training loop overwrites its buffers in place
            value.zero_() if value.dtype != torch.bool else value.fill_(True)
    df = tokens_of(tmp_path / "run")
    assert sorted(set(df["sample"])) == [10, 11, 12]
    np.testing.assert_array_equal(df["pi_logp"].to_numpy(), expected.numpy())


def test_default_sample_ids_count_per_step_and_update(tmp_path, gen):
    batch = make_batch(gen)
    batch.pop("logits")
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(2, **batch)
        rec.record(2, **batch)  # next minibatch of the same step and update
        rec.record(2, update=1, **batch)  # the same samples, trained again
    df = load_run(tmp_path / "run").tokens.collect()
    base = 2 * SAMPLE_STEP
    assert sorted(set(df.filter(pl.col("update") == 0)["sample"])) == [base + i for i in range(6)]
    assert sorted(set(df.filter(pl.col("update") == 1)["sample"])) == [base + i for i in range(3)]
    assert (df["group"] == df["sample"]).all()
    assert SAMPLE_RANK * 1000 <= SAMPLE_STEP


def test_ranks_from_torch_distributed(tmp_path, gen, monkeypatch):
    batch = make_batch(gen)
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    for rank in (1, 0):
        monkeypatch.setattr(dist, "get_rank", lambda rank=rank: rank)
        with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
            rec.record(0, **batch)
        assert (tmp_path / "run" / "tokens" / f"rank={rank}" / "part-000000.parquet").is_file()
        assert (tmp_path / "run" / "run.json").exists() == (rank == 0)  # rank 0 owns the manifest
    df = load_run(tmp_path / "run").tokens.collect()
    rows = int(batch["response_mask"].sum())
    assert df["rank"].value_counts().sort("rank").rows() == [(0, rows), (1, rows)]
    assert df.select("sample").n_unique() == 2 * B  # default ids differ per rank
    assert manifest_of(tmp_path / "run")["world_size"] == 2


def test_refuses_to_overwrite_a_recorded_shard(tmp_path, gen):
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(0, **make_batch(gen))
    with pytest.raises(FileExistsError, match=r"already holds a run \(1 part files of rank 0\); pass resume=True"):
        TokenRecorder(tmp_path / "run")


def test_buffer_is_bounded(tmp_path, gen):
    batch = make_batch(gen, b=8, t=64, v=5)
    batch.pop("logits")
    batch["response_mask"] = torch.ones(8, 64, dtype=torch.bool)
    rows_per_file = 2000
    with TokenRecorder(tmp_path / "run", rules=["ppo"], rows_per_file=rows_per_file, queue_size=2) as rec:
        for step in range(200):  # 102,400 rows
            rec.record(step, **batch)
    assert rec.stats.rows_written == 200 * 512
    assert rec.stats.peak_buffered_rows < rows_per_file + 512
    assert rec.stats.files_written == math.ceil(200 * 512 / 2048)


def test_null_recorder_has_the_same_api(tmp_path):
    public = {n for n in dir(TokenRecorder) if not n.startswith("_") and callable(getattr(TokenRecorder, n))}
    assert public <= set(dir(NullRecorder))
    with NullRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        assert rec.record(0, token_ids=None) == 0
        rec.log_metrics(0, {"a": 1.0})
        rec.log_samples(0, prompts=["x"])
        rec.flush()
    assert not (tmp_path / "run").exists()


CHILD = textwrap.dedent(
    """
    import sys, torch
    torch.set_num_threads(1)
    from trustlens import TokenRecorder
    B, T = 4, 16
    def batch(step):
        g = torch.Generator().manual_seed(step)
        mu = -torch.rand(B, T, generator=g) * 3
        return dict(token_ids=torch.randint(0, 100, (B, T), generator=g), response_mask=torch.ones(B, T),
                    pi_logp=mu * 0.9, mu_logp=mu, advantages=torch.randn(B, generator=g))
    rec = TokenRecorder(sys.argv[1], rules=["ppo"], rows_per_file=200, flush_seconds=3600)
    step = 0
    while True:
        rec.record(step, **batch(step))
        step += 1
        if step % 10 == 0 and sys.argv[2] == "kill":
            rec.flush()
            print(step, flush=True)
        if sys.argv[2] == "exit" and step == 25:
            sys.exit(0)  # without close()
    """
)


def test_sigkill_leaves_a_loadable_run_with_every_flushed_row(tmp_path):
    run_dir = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir), "kill"], stdout=subprocess.PIPE, text=True)
    try:
        flushed = 0
        while flushed < 60:
            line = child.stdout.readline()
            assert line, "child died"
            flushed = int(line)
        time.sleep(0.05)  # kill it mid-loop, possibly mid-write
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
    run = load_run(run_dir)
    assert run.status == "running"  # it never closed
    df = run.tokens.collect()
    steps = sorted(set(df["step"].to_list()))
    assert steps == list(range(len(steps))) and len(steps) >= flushed  # every flushed step, in full
    assert df.height == 64 * len(steps)
    g = torch.Generator().manual_seed(3)
    mu = -torch.rand(4, 16, generator=g) * 3
    got = df.filter(pl.col("step") == 3).sort("sample", "pos")["mu_logp"].to_numpy()
    np.testing.assert_array_equal(got, mu.reshape(-1).numpy())


def test_exit_without_close_keeps_rows_and_says_so(tmp_path):
    run_dir = tmp_path / "run"
    subprocess.run([sys.executable, "-c", CHILD, str(run_dir), "exit"], check=True, timeout=120)
    run = load_run(run_dir)
    assert run.status == "failed" and "without TokenRecorder.close()" in run.manifest["error"]
    assert run.tokens.select(pl.len()).collect().item() == 25 * 64


RSS_CHILD = textwrap.dedent(
    """
    import resource, sys, torch
    torch.set_num_threads(1)
    from trustlens import TokenRecorder
    B, T = 32, 512
    g = torch.Generator().manual_seed(0)
    mu = -torch.rand(B, T, generator=g) * 3
    batch = dict(token_ids=torch.randint(0, 1000, (B, T), generator=g), response_mask=torch.ones(B, T),
                 pi_logp=mu * 0.9, mu_logp=mu, old_logp=mu * 0.95, advantages=torch.randn(B, generator=g))
    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    with TokenRecorder(sys.argv[1], rows_per_file=65536, queue_size=4) as rec:
        marks = []
        for step in range(400):  # 6.5M rows
            rec.record(step, **batch)
            if step in (100, 399):
                marks.append(rss_mb())
    print(marks[0], marks[1])
    """
)


@pytest.mark.slow
def test_resident_memory_does_not_grow_with_rows(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, str(tmp_path / "run")],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    early, late = map(float, out.split())
    # 4.9M more rows (~400 MB of columns) after the first mark: RSS must stay flat
    assert late - early < 60, (early, late)


def test_rank_and_world_size_explicit_then_distributed_then_environment(tmp_path, gen, monkeypatch):
    from trustlens.record.args import distributed_rank

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed_rank() == (0, 1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed_rank() == (3, 4)  # torchrun's environment, before init_process_group
    assert distributed_rank(1, 2) == (1, 2)  # explicit values win
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    assert distributed_rank() == (1, 2) and distributed_rank(rank=0) == (0, 2)
    with pytest.raises(ValueError, match="rank 2 must be < world_size 2"):
        distributed_rank(rank=2)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="environment WORLD_SIZE must be an integer"):
        distributed_rank()
    monkeypatch.setenv("WORLD_SIZE", "4")
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(0, **make_batch(gen))
    assert (tmp_path / "run" / "tokens" / "rank=3" / "part-000000.parquet").is_file()
    assert not (tmp_path / "run" / "run.json").exists()  # rank 0 writes it


def test_disabled_recorder_is_a_null_recorder(tmp_path, gen):
    rec = TokenRecorder(tmp_path / "run", rules=["ppo"], enabled=False)
    assert isinstance(rec, NullRecorder) and rec.record(0, **make_batch(gen)) == 0
    rec.log_samples(0, prompts=["p"])
    rec.close()
    assert not (tmp_path / "run").exists()


def test_default_sample_ids_whatever_the_call_order(tmp_path, gen):
    batch = make_batch(gen)
    batch.pop("logits")
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        rec.record(1, **batch)
        rec.log_samples(0, rewards=[1.0] * B)
        rec.record(1, **batch)  # a step logged in between does not restart the numbering
        rec.log_samples(1, rewards=[0.0] * (2 * B))
    run = load_run(tmp_path / "run")
    tokens = run.tokens.collect()
    assert sorted(set(tokens["sample"])) == [SAMPLE_STEP + i for i in range(2 * B)]
    assert tokens.select("sample", "pos").n_unique() == tokens.height  # no duplicated rows
    samples = run.samples.collect()
    assert sorted(samples.filter(pl.col("step") == 1)["sample"]) == [SAMPLE_STEP + i for i in range(2 * B)]


def test_sample_arguments_are_checked_by_their_names(tmp_path, gen):
    batch = make_batch(gen)
    batch.pop("logits")
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        with pytest.raises(ValueError, match=r"sample_ids holds 7 twice \(again at index 2\)"):
            rec.record(0, sample_ids=[7, 8, 7], **batch)
        with pytest.raises(ValueError, match="sample_ids holds 4 twice"):
            rec.log_samples(0, rewards=[1.0, 2.0], sample_ids=[4, 4])
        with pytest.raises(ValueError, match="prompts must be a sequence with one entry per sample, got str"):
            rec.log_samples(0, prompts="text")
        with pytest.raises(ValueError, match=r"differ in length: \{'prompts': 2, 'rewards': 3\}"):
            rec.log_samples(0, prompts=["a", "b"], rewards=[1.0, 2.0, 3.0])
        with pytest.raises(ValueError, match=r"rewards\[1\] must be a finite number, got inf"):
            rec.log_samples(0, rewards=[1.0, math.inf])
    assert load_run(tmp_path / "run").samples.collect().height == 0


def test_precomputed_divergences_and_decisions_are_recorded_as_given(tmp_path, gen):
    batch = make_batch(gen)
    top_ids, top_logp = topk_from_logits(batch["logits"].double() + 0.1, batch["token_ids"], K)
    computed_dir, given_dir = tmp_path / "computed", tmp_path / "given"
    rules = ["ppo", "dppo_topk_tv"]
    with TokenRecorder(computed_dir, rules=rules) as rec:
        rec.record(0, mu_topk_ids=top_ids, mu_topk_logp=top_logp, **batch)
    computed = tokens_of(computed_dir)
    tv, kl = topk_divergence(batch["logits"], top_ids, top_logp)
    blocked_ppo = torch.ones(B, T, dtype=torch.bool)  # not what ppo decides: used as given
    with TokenRecorder(given_dir, rules=rules) as rec:
        rec.record(0, topk_tv=tv, topk_kl=kl, blocked={"ppo": blocked_ppo}, **dict(batch, logits=None))
    given = tokens_of(given_dir)
    for column in ("topk_tv", "topk_kl", "blocked_dppo_topk_tv", "ratio", "binary_tv"):
        np.testing.assert_allclose(given[column].to_numpy(), computed[column].to_numpy(), rtol=1e-6)
    assert given["blocked_ppo"].all() and given["entropy"].is_null().all()
    with TokenRecorder(tmp_path / "bad", rules=rules) as rec:
        with pytest.raises(ValueError, match="topk_tv and topk_kl must be given together"):
            rec.record(0, topk_tv=tv, **batch)
        with pytest.raises(ValueError, match=r"blocked\['nope'\]: not an evaluated rule"):
            rec.record(0, blocked={"nope": blocked_ppo}, **batch)
        with pytest.raises(ValueError, match=r"blocked\['ppo'\] must be a bool tensor of shape \(3, 5\)"):
            rec.record(0, blocked={"ppo": blocked_ppo.float()}, **batch)
        rec.record(0, topk_tv=-tv - 1, topk_kl=kl, **batch)
        with pytest.raises(ValueError, match="topk_tv holds negative values"):
            rec.flush()  # a value: checked by the writer thread
        rec.record(0, topk_tv=tv, topk_kl=torch.full_like(kl, math.inf), **batch)  # +inf KL is a value

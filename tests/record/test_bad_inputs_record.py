"""Bad inputs to TokenRecorder: its constructor, `record`, `log_samples` and `log_metrics`; a
repeated (step, update, sample) key; a resumed run with another rule set (issue 32); a tokenizer
that gives something other than one str per id or never answers (issue 46), and text with lone
surrogates (issue 39). Each case asserts the error type and that the message names the argument."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from trustlens.record import TokenRecorder
from trustlens.run import load_run
from trustlens.run.errors import WriterError

NAN, INF = math.nan, math.inf
B, T = 3, 2


def _good(**over):
    kw = dict(
        token_ids=torch.zeros(B, T, dtype=torch.long),
        response_mask=torch.ones(B, T),
        pi_logp=torch.full((B, T), -1.0),
        mu_logp=torch.full((B, T), -1.2),
        advantages=torch.ones(B),
    )
    kw.update(over)
    return kw


CONSTRUCTOR_CASES = [
    (dict(run_dir=None), TypeError, "run_dir"),
    (dict(run_dir=""), ValueError, "run_dir"),
    (dict(run_dir=3), TypeError, "run_dir"),
    (dict(run_dir="s3://"), ValueError, "run_dir must name a location after s3://"),
    (dict(run_dir="file://"), ValueError, "run_dir must name a location after file://"),
    (dict(tokenizer="Qwen/Qwen2.5-0.5B"), TypeError, "tokenizer"),
    (dict(tokenizer=object()), TypeError, "tokenizer"),
    (dict(rules="ppo"), ValueError, "rules"),
    (dict(rules=["ppo", "ppo"]), ValueError, "ppo"),
    (dict(rules=["dppo_binary_tvv"]), KeyError, "dppo_binary_tvv"),
    (dict(rules={"ppo": 0.2}), ValueError, "ppo"),
    (dict(active_rule="cispo", rules=["ppo"]), ValueError, "active_rule"),
    (dict(rows_per_file=0), ValueError, "rows_per_file"),
    (dict(rows_per_file=1.5), ValueError, "rows_per_file"),
    (dict(queue_size=0), ValueError, "queue_size"),
    (dict(flush_seconds=0), ValueError, "flush_seconds"),
    (dict(flush_seconds=NAN), ValueError, "flush_seconds"),
    (dict(flush_seconds=INF), ValueError, "flush_seconds"),
    (dict(writer_timeout=-1), ValueError, "writer_timeout"),
    (dict(rank=-1), ValueError, "rank"),
    (dict(rank=2, world_size=2), ValueError, "rank"),
    (dict(world_size=0), ValueError, "world_size"),
    (dict(keep=0.1), ValueError, "keep"),
    (dict(config=[1, 2]), ValueError, "config"),
    (dict(resume=True, overwrite=True), ValueError, "resume"),
    (dict(resume="no"), TypeError, "resume"),
    (dict(overwrite="yes"), TypeError, "overwrite"),
    (dict(enabled="false"), TypeError, "enabled"),
]


@pytest.mark.parametrize(("kwargs", "error", "named"), CONSTRUCTOR_CASES)
def test_constructor_names_the_argument(tmp_path, kwargs, error, named):
    kwargs = {"run_dir": tmp_path / "run", **kwargs}
    with pytest.raises(error, match=named):
        TokenRecorder(**kwargs).close()


RECORD_CASES = [
    (dict(step=-1), "step"),
    (dict(step=1.5), "step"),
    (dict(step=True), "step"),
    (dict(step=None), "step"),
    (dict(update=-1), "update"),
    (dict(update=0.5), "update"),
    (dict(token_ids=torch.zeros(B, T)), "token_ids"),
    (dict(token_ids=torch.zeros(B, dtype=torch.long)), "token_ids"),
    (dict(token_ids=[[0, 0]]), "token_ids"),
    (dict(token_ids=torch.full((B, T), -1)), "token_ids"),
    (dict(response_mask=torch.ones(B, T + 1)), "response_mask"),
    (dict(response_mask=torch.full((B, T), 2.0)), "response_mask"),
    (dict(pi_logp=torch.zeros(B, T + 1)), "pi_logp"),
    (dict(pi_logp=torch.zeros(B, T, dtype=torch.long)), "pi_logp"),
    (dict(pi_logp=None), "pi_logp"),
    (dict(pi_logp=torch.full((B, T), 0.5)), "pi_logp"),
    (dict(pi_logp=torch.full((B, T), NAN)), "pi_logp"),
    (dict(pi_logp=torch.full((B, T), INF)), "pi_logp"),
    (dict(mu_logp=torch.full((B, T), 0.5)), "mu_logp"),
    (dict(mu_logp=torch.full((B, T), NAN)), "mu_logp"),
    (dict(mu_logp=None, old_logp=None), "mu_logp"),
    (dict(old_logp=torch.zeros(B)), "old_logp"),
    (dict(advantages=torch.ones(B + 1)), "advantages"),
    (dict(advantages=torch.ones(B, dtype=torch.long)), "advantages"),
    (dict(advantages=torch.tensor([1.0, NAN, 1.0])), "advantages"),
    (dict(advantages=[1.0, 1.0, 1.0]), "advantages"),
    (dict(temperature=0), "temperature"),
    (dict(temperature=INF), "temperature"),
    (dict(temperature=NAN), "temperature"),
    (dict(temperature="1"), "temperature"),
    (dict(entropy=torch.full((B, T), -1.0)), "entropy"),
    (dict(topk_tv=torch.full((B, T), 1.7), topk_kl=torch.zeros(B, T)), "topk_tv"),
    (dict(topk_tv=torch.full((B, T), -0.2), topk_kl=torch.zeros(B, T)), "topk_tv"),
    (dict(topk_tv=torch.zeros(B, T), topk_kl=torch.full((B, T), -1.0)), "topk_kl"),
    (dict(topk_tv=torch.zeros(B, T)), "topk_kl"),
    (dict(mu_topk_ids=torch.zeros(B, T, 2, dtype=torch.long)), "mu_topk"),
    (dict(sample_ids=[0, 0, 1]), "sample_ids"),
    (dict(sample_ids=[0.5, 1.5, 2.5]), "sample_ids"),
    (dict(sample_ids=[0, 1]), "sample_ids"),
    (dict(sample_ids="abc"), "sample_ids"),
    (dict(group_ids=[0.5, 1.0, 2.0]), "group_ids"),
    (dict(group_ids=[0, 1]), "group_ids"),
    (dict(blocked={"nope": torch.zeros(B, T, dtype=torch.bool)}), "nope"),
    (dict(blocked={"ppo": torch.zeros(B, T + 1, dtype=torch.bool)}), "ppo"),
    (dict(logits=torch.zeros(B, T, 5, device="meta")), "logits on meta"),
    (dict(mu_logp=torch.zeros(B, T, device="meta")), "mu_logp on meta"),
    (dict(advantages=torch.ones(B, device="meta")), "advantages on meta"),
    (dict(response_mask=torch.ones(B, T, device="meta")), "response_mask on meta"),
    (dict(logits=torch.full((B, T, 5), NAN)), "logits"),
]


@pytest.mark.parametrize(("over", "named"), RECORD_CASES)
def test_record_names_the_argument(tmp_path, over, named):
    step = over.pop("step", 0)
    with TokenRecorder(tmp_path / "run") as rec, pytest.raises(ValueError, match=named):
        rec.record(step, **_good(**over))
        rec.flush()  # values of CPU inputs are checked by the writer thread


SAMPLES_CASES = [
    (dict(lengths=[1.5, 2.0]), TypeError, r"lengths\[0\]"),
    (dict(lengths=[3, -1]), ValueError, r"lengths\[1\]"),
    (dict(lengths=torch.tensor([1.0, 2.0])), TypeError, r"lengths\[0\]"),
    (dict(sample_ids=[0.5, 1.0]), TypeError, r"sample_ids\[0\]"),
    (dict(sample_ids=[1, 1]), ValueError, "sample_ids"),
    (dict(group_ids=[0, 0.5]), TypeError, r"group_ids\[1\]"),
    (dict(prompts=[1, 2]), TypeError, r"prompts\[0\]"),
    (dict(responses=["a", b"b"]), TypeError, r"responses\[1\]"),
    (dict(rewards=[1.0, INF]), ValueError, "rewards"),
    (dict(rewards=[1.0], responses=["a", "b"]), ValueError, "rewards"),
    (dict(rewards="12"), ValueError, "rewards"),
    (dict(rewards=["1", "0"]), TypeError, r"rewards\[0\]"),
    (dict(advantages=[[1.0], [0.0]]), TypeError, r"advantages\[0\]"),
    (dict(advantages=torch.ones(2, 2)), TypeError, r"advantages\[0\]"),
]


@pytest.mark.parametrize(("over", "error", "named"), SAMPLES_CASES)
def test_log_samples_names_the_argument(tmp_path, over, error, named):
    with TokenRecorder(tmp_path / "run") as rec, pytest.raises(error, match=named):
        rec.log_samples(0, **{"rewards": [1.0, 0.0], **over})


@pytest.mark.parametrize(
    ("metrics", "named"),
    [
        ([1.0], "metrics"),
        ({"": 1.0}, "metric names"),
        ({"a": "x"}, "'a'"),
        ({3: 1.0}, "3"),
        ({"a": torch.ones(2)}, "'a'"),
        ({"a": True}, "'a'"),
    ],
)
def test_log_metrics_names_the_argument(tmp_path, metrics, named):
    with TokenRecorder(tmp_path / "run") as rec, pytest.raises(ValueError, match=named):
        rec.log_metrics(0, metrics)


def test_a_repeated_sample_key_is_refused_naming_the_ids(tmp_path):
    with TokenRecorder(tmp_path / "run") as rec:
        rec.record(0, sample_ids=[0, 1, 2], **_good())
        with pytest.raises(ValueError, match=r"sample_ids 0, 1, 2 were recorded before at step 0, update 0 on rank 0"):
            rec.record(0, sample_ids=[0, 1, 2], **_good())
        with pytest.raises(ValueError, match=r"sample_ids 2 were recorded before"):
            rec.record(0, sample_ids=[2, 5, 6], **_good())
        rec.record(0, sample_ids=[0, 1, 2], update=1, **_good())  # another update: a new key
        rec.record(1, sample_ids=[0, 1, 2], **_good())  # another step too
        rec.record(2, **_good())  # default ids 2·10⁹ + 0..2
        with pytest.raises(ValueError, match=r"sample_ids 2000000001 were recorded before at step 2"):
            rec.record(2, sample_ids=[2 * 10**9 + 1, 7, 8], **_good())
        rec.record(2, **_good())  # default ids go on after the ones taken
        rec.log_samples(0, rewards=[1.0, 2.0], sample_ids=[5, 6])
        with pytest.raises(ValueError, match=r"sample_ids 6 were recorded before at step 0 on rank 0"):
            rec.log_samples(0, rewards=[1.0], sample_ids=[6])
    tokens = load_run(tmp_path / "run").tokens.collect()
    assert tokens.height == 5 * B * T  # five calls recorded; the refused ones wrote nothing
    assert tokens.select("step", "update", "sample", "pos").is_duplicated().sum() == 0


def test_resuming_with_another_rule_set_is_refused(tmp_path):
    with TokenRecorder(tmp_path / "run") as rec:
        rec.record(0, **_good())
    with pytest.raises(ValueError, match=r"rules differ .* dropped \['cispo'"):
        TokenRecorder(tmp_path / "run", resume=True, rules=["ppo"])
    with TokenRecorder(tmp_path / "run", resume=True) as rec:  # the same rules: resumed
        rec.record(1, **_good())
    assert load_run(tmp_path / "run").tokens.select("step").unique().collect()["step"].sort().to_list() == [0, 1]


def test_valid_record_edge_cases(tmp_path):
    with TokenRecorder(tmp_path / "run", rules=["ppo_clip_higher", "minirl"]) as rec:
        # no μ (π_old is the anchor), a π of probability 0 (−inf), an empty mask
        rec.record(0, **_good(mu_logp=None, old_logp=torch.full((B, T), -1.0), pi_logp=torch.full((B, T), -INF)))
        assert (
            rec.record(1, **_good(mu_logp=None, old_logp=torch.full((B, T), -1.0), response_mask=torch.zeros(B, T)))
            == 0
        )
    tokens = load_run(tmp_path / "run").tokens.collect()
    assert tokens.height == B * T and tokens["mu_logp"].null_count() == B * T
    assert tokens["pi_logp"].to_list() == [-INF] * (B * T) and tokens["ratio"].to_list() == [0.0] * (B * T)


class _Tokenizer:
    """decode returning `give(ids)`; with batch=True a good decode and batch_decode returning `give`."""

    def __init__(self, give, batch=False):
        self.decode = (lambda ids: str(ids)) if batch else give
        if batch:
            self.batch_decode = give


TOKENIZER_CASES = [
    (_Tokenizer(lambda ids: ids), r"tokenizer.decode must give one str per id; tokenizer.decode\(\[0\]\) gave list"),
    (_Tokenizer(lambda ids: None), r"tokenizer.decode\(\[0\]\) gave NoneType"),
    (_Tokenizer(lambda ids: b"x"), r"tokenizer.decode\(\[0\]\) gave bytes"),
    (_Tokenizer(lambda ids: "one text", batch=True), "tokenizer.batch_decode must return a list of one str per id"),
    (_Tokenizer(lambda ids: ["a", "b"], batch=True), "tokenizer.batch_decode must return a list .* for 1 ids"),
    (_Tokenizer(lambda ids: [[7]], batch=True), r"tokenizer.batch_decode\(\[\[0\]\]\) gave list"),
]


@pytest.mark.parametrize(("tokenizer", "says"), TOKENIZER_CASES)
def test_a_tokenizer_giving_other_than_one_str_per_id_fails_the_first_record(tmp_path, tokenizer, says):
    rec = TokenRecorder(tmp_path / "run", rules=["ppo"], tokenizer=tokenizer)
    with pytest.raises(TypeError, match=says):
        rec.record(0, **_good())
    rec.close()  # the refused call queued nothing: the run closes cleanly
    assert load_run(tmp_path / "run").status == "finished"


def test_a_tokenizer_that_never_answers_fails_the_first_record_within_writer_timeout(tmp_path):
    """Issue 46: the first decode ran in the caller's thread, outside writer_timeout: a hung
    tokenizer made `record` block forever. Now it raises WriterError and the run closes `failed`."""
    release = threading.Event()  # set at the end, so that the stuck decode's thread ends too

    class Stuck:
        def decode(self, ids):
            release.wait(60)  # bounded only so that the old code fails (DID NOT RAISE) rather than hangs
            return "x"

    try:
        rec = TokenRecorder(tmp_path / "run", rules=["ppo"], tokenizer=Stuck(), writer_timeout=0.3)
        with pytest.raises(WriterError, match=r"did not decode token id 0 within writer_timeout=0.3 s"):
            rec.record(0, **_good())
        rec.close()  # already closed by the failed call: returns at once
        with pytest.raises(ValueError, match="is closed"):
            rec.record(1, **_good())
    finally:
        release.set()
    run = load_run(tmp_path / "run")
    assert run.status == "failed" and "writer_timeout=0.3 s" in run.manifest["error"]


def test_text_with_lone_surrogates_is_stored_with_replacement_characters(tmp_path):
    broken = "a\ud83d"  # half an emoji, as a tokenizer that splits one may give
    tokenizer = _Tokenizer(lambda ids: f"<{ids[0]}>{broken}")
    with TokenRecorder(tmp_path / "run", rules=["ppo"], tokenizer=tokenizer) as rec:
        rec.record(0, **_good())
        rec.log_samples(0, prompts=["p\udc80", None], responses=[broken, "fine"], rewards=[1.0, 0.0])
        rec.log_metrics(0, {"loss\ud800": 1.0})
    run = load_run(tmp_path / "run")
    assert run.tokens.collect()["token"].unique().to_list() == ["<0>a\ufffd"]
    samples = run.samples.collect().sort("sample")
    assert samples["prompt"].to_list() == ["p\ufffd", None] and samples["response"].to_list() == ["a\ufffd", "fine"]
    assert run.metrics.collect()["name"].to_list() == ["loss\ufffd"]

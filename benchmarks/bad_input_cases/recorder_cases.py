"""The recorder: TokenRecorder's construction, record, log_samples, log_metrics and resume."""

from __future__ import annotations

import torch

from bad_input_cases import INF, NAN, Case, Fixtures, bad, ok
from trustlens import Keep, TokenRecorder, load_run

A = "recorder"
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


def _tokens(path):
    return load_run(path).tokens.collect()


def cases(fx: Fixtures) -> list[Case]:
    out: list[Case] = []

    def construct(**kw):
        kw.setdefault("run_dir", fx.fresh())
        TokenRecorder(**kw).close()

    constructor_bad = {
        "run_dir None": (dict(run_dir=None), ("run_dir",)),
        "run_dir empty": (dict(run_dir=""), ("run_dir",)),
        "run_dir blank": (dict(run_dir="  "), ("run_dir",)),
        "run_dir number": (dict(run_dir=3), ("run_dir",)),
        "run_dir a file": (dict(run_dir=fx.variants["a_file"]), ("a_file",)),
        "run_dir an existing run": (dict(run_dir=fx.good), ("run_dir", "resume")),
        "tokenizer a model name": (dict(tokenizer="Qwen/Qwen2.5-0.5B"), ("tokenizer",)),
        "tokenizer an object": (dict(tokenizer=object()), ("tokenizer",)),
        "rules a string": (dict(rules="ppo"), ("rules",)),
        "rules repeated": (dict(rules=["ppo", "ppo"]), ("ppo",)),
        "rules typo": (dict(rules=["dppo_binary_tvv"]), ("dppo_binary_tvv",)),
        "rules numbers": (dict(rules=[1, 2]), ("rule",)),
        "rules dict of floats": (dict(rules={"ppo": 0.2}), ("ppo",)),
        "active_rule not recorded": (dict(active_rule="cispo", rules=["ppo"]), ("active_rule",)),
        "active_rule typo": (dict(active_rule="ppoo"), ("active_rule",)),
        "active_rule number": (dict(active_rule=1), ("active_rule",)),
        "rows_per_file 0": (dict(rows_per_file=0), ("rows_per_file",)),
        "rows_per_file -5": (dict(rows_per_file=-5), ("rows_per_file",)),
        "rows_per_file 1.5": (dict(rows_per_file=1.5), ("rows_per_file",)),
        "rows_per_file text": (dict(rows_per_file="1000"), ("rows_per_file",)),
        "queue_size 0": (dict(queue_size=0), ("queue_size",)),
        "queue_size 2.5": (dict(queue_size=2.5), ("queue_size",)),
        "flush_seconds 0": (dict(flush_seconds=0), ("flush_seconds",)),
        "flush_seconds NaN": (dict(flush_seconds=NAN), ("flush_seconds",)),
        "flush_seconds inf": (dict(flush_seconds=INF), ("flush_seconds",)),
        "flush_seconds text": (dict(flush_seconds="30"), ("flush_seconds",)),
        "writer_timeout -1": (dict(writer_timeout=-1), ("writer_timeout",)),
        "writer_timeout 0": (dict(writer_timeout=0), ("writer_timeout",)),
        "rank -1": (dict(rank=-1), ("rank",)),
        "rank = world_size": (dict(rank=2, world_size=2), ("rank",)),
        "rank 0.5": (dict(rank=0.5), ("rank",)),
        "world_size 0": (dict(world_size=0), ("world_size",)),
        "keep a rate": (dict(keep=0.1), ("keep",)),
        "keep a dict": (dict(keep={"rate": 0.1}), ("keep",)),
        "config a list": (dict(config=[1, 2]), ("config",)),
        "config a string": (dict(config="lr=1e-5"), ("config",)),
        "resume and overwrite": (dict(resume=True, overwrite=True), ("resume",)),
        "resume text": (dict(resume="no"), ("resume",)),
        "overwrite text": (dict(overwrite="yes"), ("overwrite",)),
        "enabled text": (dict(enabled="false"), ("enabled",)),
        "sampling bad key": (dict(sampling={"temprature": 1.0}), ("temprature",)),
        "sampling temperature 0": (dict(sampling={"temperature": 0}), ("temperature",)),
        "sampling top_p 2": (dict(sampling={"top_p": 2.0}), ("top_p",)),
        "sampling a list": (dict(sampling=[1.0]), ("sampling",)),
        "model_kind typo": (dict(model_kind="moes"), ("model_kind",)),
        "model_kind None": (dict(model_kind=None), ("model_kind",)),
        "mirror a number": (dict(mirror=3), ("mirror",)),
        "mirror unknown name": (dict(mirror="tensorbord"), ("tensorbord",)),
    }
    for label, (kw, words) in constructor_bad.items():
        out.append(bad(A, f"TokenRecorder {label}", lambda kw=kw: construct(**kw), *words))

    def record(over, step=0, calls=1, **ctor):
        path = fx.fresh()
        with TokenRecorder(path, **ctor) as rec:
            for _ in range(calls):
                rec.record(step, **_good(**over))
            rec.flush()  # values of CPU inputs are checked by the writer thread
        return path

    record_bad = {
        "step -1": (dict(step=-1), {}, ("step",)),
        "step 1.5": (dict(step=1.5), {}, ("step",)),
        "step True": (dict(step=True), {}, ("step",)),
        "step None": (dict(step=None), {}, ("step",)),
        "step text": (dict(step="0"), {}, ("step",)),
        "step a tensor of 2": (dict(step=torch.tensor([0, 1])), {}, ("step",)),
        "update -1": ({}, dict(update=-1), ("update",)),
        "update 0.5": ({}, dict(update=0.5), ("update",)),
        "token_ids float": ({}, dict(token_ids=torch.zeros(B, T)), ("token_ids",)),
        "token_ids 1-D": ({}, dict(token_ids=torch.zeros(B, dtype=torch.long)), ("token_ids",)),
        "token_ids list": ({}, dict(token_ids=[[0, 0]] * B), ("token_ids",)),
        "token_ids negative": ({}, dict(token_ids=torch.full((B, T), -1)), ("token_ids",)),
        "token_ids 3-D": ({}, dict(token_ids=torch.zeros(B, T, 1, dtype=torch.long)), ("token_ids",)),
        "response_mask shape": ({}, dict(response_mask=torch.ones(B, T + 1)), ("response_mask",)),
        "response_mask of 2": ({}, dict(response_mask=torch.full((B, T), 2.0)), ("response_mask",)),
        "response_mask list": ({}, dict(response_mask=[[1, 1]] * B), ("response_mask",)),
        "response_mask None": ({}, dict(response_mask=None), ("response_mask",)),
        "pi_logp shape": ({}, dict(pi_logp=torch.zeros(B, T + 1)), ("pi_logp",)),
        "pi_logp int": ({}, dict(pi_logp=torch.zeros(B, T, dtype=torch.long)), ("pi_logp",)),
        "pi_logp None": ({}, dict(pi_logp=None), ("pi_logp",)),
        "pi_logp probabilities": ({}, dict(pi_logp=torch.full((B, T), 0.5)), ("pi_logp",)),
        "pi_logp NaN": ({}, dict(pi_logp=torch.full((B, T), NAN)), ("pi_logp",)),
        "pi_logp +inf": ({}, dict(pi_logp=torch.full((B, T), INF)), ("pi_logp",)),
        "pi_logp numpy": ({}, dict(pi_logp=torch.full((B, T), -1.0).numpy()), ("pi_logp",)),
        "mu_logp probabilities": ({}, dict(mu_logp=torch.full((B, T), 0.5)), ("mu_logp",)),
        "mu_logp NaN": ({}, dict(mu_logp=torch.full((B, T), NAN)), ("mu_logp",)),
        "no mu and no old": ({}, dict(mu_logp=None, old_logp=None), ("mu_logp",)),
        "old_logp shape": ({}, dict(old_logp=torch.zeros(B)), ("old_logp",)),
        "advantages shape": ({}, dict(advantages=torch.ones(B + 1)), ("advantages",)),
        "advantages int": ({}, dict(advantages=torch.ones(B, dtype=torch.long)), ("advantages",)),
        "advantages NaN": ({}, dict(advantages=torch.tensor([1.0, NAN, 1.0])), ("advantages",)),
        "advantages list": ({}, dict(advantages=[1.0, 1.0, 1.0]), ("advantages",)),
        "advantages scalar": ({}, dict(advantages=torch.tensor(1.0)), ("advantages",)),
        "temperature 0": ({}, dict(temperature=0), ("temperature",)),
        "temperature inf": ({}, dict(temperature=INF), ("temperature",)),
        "temperature NaN": ({}, dict(temperature=NAN), ("temperature",)),
        "temperature text": ({}, dict(temperature="1"), ("temperature",)),
        "entropy negative": ({}, dict(entropy=torch.full((B, T), -1.0)), ("entropy",)),
        "entropy shape": ({}, dict(entropy=torch.zeros(B)), ("entropy",)),
        "topk_tv 1.7": ({}, dict(topk_tv=torch.full((B, T), 1.7), topk_kl=torch.zeros(B, T)), ("topk_tv",)),
        "topk_tv negative": ({}, dict(topk_tv=torch.full((B, T), -0.2), topk_kl=torch.zeros(B, T)), ("topk_tv",)),
        "topk_kl negative": ({}, dict(topk_tv=torch.zeros(B, T), topk_kl=torch.full((B, T), -1.0)), ("topk_kl",)),
        "topk_tv without topk_kl": ({}, dict(topk_tv=torch.zeros(B, T)), ("topk_kl",)),
        "mu_topk_ids without logp": ({}, dict(mu_topk_ids=torch.zeros(B, T, 2, dtype=torch.long)), ("mu_topk",)),
        "mu_topk without logits": (
            {},
            dict(mu_topk_ids=torch.zeros(B, T, 2, dtype=torch.long), mu_topk_logp=torch.full((B, T, 2), -1.0)),
            ("logits",),
        ),
        "logits 2-D": ({}, dict(logits=torch.zeros(B, T)), ("logits",)),
        "logits NaN": ({}, dict(logits=torch.full((B, T, 5), NAN)), ("logits",)),
        "logits token ids outside": (
            {},
            dict(logits=torch.zeros(B, T, 5), token_ids=torch.full((B, T), 7)),
            ("token_ids",),
        ),
        "sample_ids repeated": ({}, dict(sample_ids=[0, 0, 1]), ("sample_ids",)),
        "sample_ids fractional": ({}, dict(sample_ids=[0.5, 1.5, 2.5]), ("sample_ids",)),
        "sample_ids too few": ({}, dict(sample_ids=[0, 1]), ("sample_ids",)),
        "sample_ids text": ({}, dict(sample_ids="abc"), ("sample_ids",)),
        "group_ids fractional": ({}, dict(group_ids=[0.5, 1.0, 2.0]), ("group_ids",)),
        "group_ids too few": ({}, dict(group_ids=[0, 1]), ("group_ids",)),
        "blocked unknown rule": ({}, dict(blocked={"nope": torch.zeros(B, T, dtype=torch.bool)}), ("nope",)),
        "blocked shape": ({}, dict(blocked={"ppo": torch.zeros(B, T + 1, dtype=torch.bool)}), ("ppo",)),
        "blocked a list": ({}, dict(blocked=[torch.zeros(B, T, dtype=torch.bool)]), ("blocked",)),
        "logits on another device": ({}, dict(logits=torch.zeros(B, T, 5, device="meta")), ("logits", "meta")),
        "mu_logp on another device": ({}, dict(mu_logp=torch.zeros(B, T, device="meta")), ("mu_logp", "meta")),
    }
    for label, (call, over, words) in record_bad.items():
        step = call.get("step", 0)
        out.append(bad(A, f"record {label}", lambda over=over, step=step: record(over, step), *words))
    out.append(
        bad(A, "record the same sample ids twice", lambda: record({"sample_ids": [0, 1, 2]}, calls=2), "sample_ids")
    )
    out += [
        ok(
            A,
            "record a run without μ",
            lambda: _tokens(record({"mu_logp": None, "old_logp": torch.full((B, T), -1.0)})),
            lambda t: t.height == B * T and t["mu_logp"].null_count() == B * T,
        ),
        ok(
            A,
            "record -inf log π",
            lambda: _tokens(record({"pi_logp": torch.full((B, T), -INF)})),
            lambda t: t["ratio"].to_list() == [0.0] * (B * T),
        ),
        ok(A, "record an empty mask", lambda: _recorded_rows(fx, response_mask=torch.zeros(B, T)), lambda n: n == 0),
        ok(
            A,
            "record negative sample ids",
            lambda: _tokens(record({"sample_ids": [-1, 0, 1]})),
            lambda t: sorted(set(t["sample"])) == [-1, 0, 1],
        ),
        ok(
            A,
            "record no rules",
            lambda: _tokens(record({}, rules=[])),
            lambda t: not any(c.startswith("blocked_") for c in t.columns),
        ),
        ok(A, "record two calls in a step", lambda: _tokens(record({}, calls=2)), lambda t: t.height == 2 * B * T),
        ok(
            A,
            "record numpy int step",
            lambda: _tokens(record({}, step=__import__("numpy").int64(3))),
            lambda t: set(t["step"]) == {3},
        ),
        ok(
            A,
            "record a tensor step",
            lambda: _tokens(record({}, step=torch.tensor(2))),
            lambda t: set(t["step"]) == {2},
        ),
        ok(A, "record keep=Keep()", lambda: record({}, keep=Keep(rate=0.5)), lambda p: p.is_dir()),
    ]

    def samples(**kw):
        with TokenRecorder(fx.fresh()) as rec:
            rec.log_samples(0, **{"rewards": [1.0, 0.0], **kw})

    samples_bad = {
        "lengths fractional": (dict(lengths=[1.5, 2.0]), ("lengths",)),
        "lengths negative": (dict(lengths=[3, -1]), ("lengths",)),
        "lengths float tensor": (dict(lengths=torch.tensor([1.0, 2.0])), ("lengths",)),
        "sample_ids fractional": (dict(sample_ids=[0.5, 1.0]), ("sample_ids",)),
        "sample_ids repeated": (dict(sample_ids=[1, 1]), ("sample_ids",)),
        "group_ids fractional": (dict(group_ids=[0, 0.5]), ("group_ids",)),
        "prompts numbers": (dict(prompts=[1, 2]), ("prompts",)),
        "prompts one string": (dict(prompts="ab"), ("prompts",)),
        "responses bytes": (dict(responses=["a", b"b"]), ("responses",)),
        "rewards inf": (dict(rewards=[1.0, INF]), ("rewards",)),
        "rewards too few": (dict(rewards=[1.0], responses=["a", "b"]), ("rewards",)),
        "rewards text": (dict(rewards="12"), ("rewards",)),
        "rewards text values": (dict(rewards=["1", "0"]), ("rewards",)),
        "advantages a list per sample": (dict(advantages=[[1.0], [0.0]]), ("advantages",)),
        "advantages too many": (dict(advantages=[1.0, 0.0, 2.0]), ("advantages",)),
        "advantages 2-D": (dict(advantages=torch.ones(2, 2)), ("advantages",)),
    }
    for label, (kw, words) in samples_bad.items():
        out.append(bad(A, f"log_samples {label}", lambda kw=kw: samples(**kw), *words))
    for label, step in [("step -1", -1), ("step 0.5", 0.5), ("step None", None)]:
        out.append(bad(A, f"log_samples {label}", lambda step=step: _samples_at(fx, step), "step"))
    out += [
        ok(A, "log_samples rewards only", lambda: samples(), lambda r: r is None),
        ok(A, "log_samples NaN and None rewards", lambda: samples(rewards=[NAN, None]), lambda r: r is None),
    ]

    def metrics(step, values):
        with TokenRecorder(fx.fresh()) as rec:
            rec.log_metrics(step, values)

    metrics_bad = {
        "a list": (0, [1.0], ("metrics",)),
        "text value": (0, {"a": "x"}, ("'a'",)),
        "a number key": (0, {3: 1.0}, ("3",)),
        "a tensor of 2": (0, {"a": torch.ones(2)}, ("'a'",)),
        "a bool": (0, {"a": True}, ("'a'",)),
        "None value": (0, {"a": None}, ("'a'",)),
        "None": (0, None, ("metrics",)),
        "step -1": (-1, {"a": 1.0}, ("step",)),
        "step 2.5": (2.5, {"a": 1.0}, ("step",)),
        "an empty key": (0, {"": 1.0}, ("metric",)),
    }
    for label, (step, values, words) in metrics_bad.items():
        out.append(bad(A, f"log_metrics {label}", lambda step=step, values=values: metrics(step, values), *words))
    out += [
        ok(A, "log_metrics NaN kept", lambda: metrics(0, {"loss": NAN}), lambda r: r is None),
        ok(A, "log_metrics a 0-d tensor", lambda: metrics(0, {"loss": torch.tensor(1.5)}), lambda r: r is None),
        ok(A, "log_metrics empty", lambda: metrics(0, {}), lambda r: r is None),
    ]
    out += _resume_cases(fx)
    return out


def _samples_at(fx: Fixtures, step: object) -> None:
    with TokenRecorder(fx.fresh()) as rec:
        rec.log_samples(step, rewards=[1.0])  # type: ignore[arg-type]


def _resume_cases(fx: Fixtures) -> list[Case]:
    def recorded(**ctor):
        path = fx.fresh()
        with TokenRecorder(path, **ctor) as rec:
            rec.record(0, **_good())
        return path

    def resume(first: dict, then: dict):
        path = recorded(**first)
        with TokenRecorder(path, resume=True, **then) as rec:
            rec.record(1, **_good())
        return path

    out = [
        bad(A, "resume with fewer rules", lambda: resume({}, {"rules": ["ppo"]}), "rules"),
        bad(A, "resume with more rules", lambda: resume({"rules": ["ppo"]}, {"rules": ["ppo", "cispo"]}), "rules"),
        ok(
            A,
            "resume with another active_rule",
            lambda: load_run(
                resume(
                    {"rules": ["ppo", "cispo"], "active_rule": "ppo"},
                    {"rules": ["ppo", "cispo"], "active_rule": "cispo"},
                )
            ),
            lambda run: run.manifest["active_rule"] == "cispo",
        ),
        bad(A, "resume a file", lambda: TokenRecorder(fx.variants["a_file"], resume=True).close(), "a_file"),
        bad(A, "resume the same step", lambda: _resume_same_ids(recorded()), "step"),
        ok(
            A,
            "resume with the same rules",
            lambda: _tokens(resume({}, {})),
            lambda t: sorted(t["step"].unique()) == [0, 1],
        ),
        ok(A, "resume a fresh folder", lambda: _fresh_resume(fx), lambda t: t.height == B * T),
    ]
    return out


def _recorded_rows(fx: Fixtures, **over) -> int:
    with TokenRecorder(fx.fresh()) as rec:
        return rec.record(0, **_good(**over))


def _resume_same_ids(path) -> None:
    with TokenRecorder(path, resume=True) as rec:
        rec.record(0, sample_ids=[0, 1, 2], **_good())
        rec.record(0, sample_ids=[0, 1, 2], **_good())
        rec.flush()


def _fresh_resume(fx: Fixtures):
    path = fx.fresh()
    with TokenRecorder(path, resume=True) as rec:
        rec.record(0, **_good())
    return _tokens(path)

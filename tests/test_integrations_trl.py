"""A real TRL GRPO run on CPU with the trustlens hook: the recorded rows must be TRL's tensors.

A tiny Llama and the word-level tokenizer are built locally (nothing from a hub). The hook's
capture is checked against TRL's own batches (`_compute_loss` inputs, recorded by a spy
subclass), its log-probabilities against a float64 recomputation, its counterfactual
`blocked_minirl` against TRL's own `clip_ratio/region_mean`, and a rollout function that samples
with a bf16 copy of the model supplies μ so that the mismatch columns are filled.
"""

from __future__ import annotations

import copy
import os
import warnings

import polars as pl
import pytest
import torch
from packaging.version import Version

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from test_dashboard_app import PAGES, _app, _open, _pick_run  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from trustlens import load_run  # noqa: E402
from trustlens.integrations import trl as tl_trl  # noqa: E402
from trustlens.integrations.trl import (  # noqa: E402
    TrustLensGRPOTrainer,
    UnsupportedTRLVersion,
    default_rules,
    engine_rollout,
    with_trustlens,
)
from trustlens.integrations.trl.hook import _accepts_topk  # noqa: E402
from trustlens.train.model import ModelConfig, build_model, build_tokenizer  # noqa: E402

# four prompts of equal token length (no left padding: position ids agree between sampler and TRL)
PROMPTS = ["1 + 2 =", "3 + 4 =", "5 + 6 =", "7 + 8 ="]
N_GEN = 4  # completions per prompt
MAX_NEW = 6  # max_completion_length
TEMPERATURE = 0.8


def tiny():
    tok = build_tokenizer(max_number=20)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return build_model(cfg, seed=0).train(), tok


def length_reward(completions, **kwargs):
    """More words, more reward: a signal the tiny model can follow within a few steps."""
    return [len(c.split()) / MAX_NEW for c in completions]


def grpo_args(out_dir, **overrides) -> GRPOConfig:
    # generation batch = 4 × 2 = 8 completions = 2 prompts × 4; 3 optimizer steps: steps 0 and 1
    # share the first generation, so π moves between them and π_old ≠ π on the second.
    kw = dict(
        output_dir=str(out_dir),
        per_device_train_batch_size=4,
        num_generations=N_GEN,
        steps_per_generation=2,
        gradient_accumulation_steps=1,
        max_completion_length=MAX_NEW,
        max_steps=3,
        learning_rate=5e-2,
        temperature=TEMPERATURE,
        use_cpu=True,
        bf16=False,  # TRL's default runs the trainer under bf16 autocast; float32 keeps π exact
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    kw.update(overrides)
    return GRPOConfig(**kw)


class Spy(TrustLensGRPOTrainer):
    """Keeps a copy of every training batch TRL hands to its loss, and the weights it used."""

    def _compute_loss(self, model, inputs, *args, **kwargs):
        if self.model.training:
            self.spy.append(
                (
                    {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in inputs.items()},
                    copy.deepcopy(self.model.state_dict()),
                )
            )
        return super()._compute_loss(model, inputs, *args, **kwargs)


def run_trl(root, name, **kwargs):
    """A 3-step TRL GRPO run recorded into root/name; (trainer with its spied batches, tokenizer, run)."""
    model, tok = tiny()
    ds = datasets.Dataset.from_dict({"prompt": PROMPTS})
    run_dir = root / name
    trainer = Spy(
        model=model,
        processing_class=tok,
        reward_funcs=length_reward,
        args=grpo_args(root.parent / f"{root.name}-trl-{name}", **kwargs.pop("args", {})),
        train_dataset=ds,
        trustlens_dir=run_dir,
        **kwargs,
    )
    trainer.spy = []
    trainer.train()
    return trainer, tok, load_run(run_dir)


def logp_float64(model_state, model_template, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """log π(a_t) at TRL's temperature, recomputed in float64 from the weights TRL used."""
    model = copy.deepcopy(model_template).double()
    model.load_state_dict({k: v.double() for k, v in model_state.items()})
    ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, prompt_ids.shape[1] - 1 : -1]
    logp = torch.log_softmax(logits / TEMPERATURE, -1)
    return logp.gather(-1, completion_ids[..., None]).squeeze(-1)


def tokens_of(run) -> pl.DataFrame:
    return run.tokens.sort("step", "update", "sample", "pos").collect()


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("trl_runs")


@pytest.fixture(scope="module")
def no_mu(runs_root):
    """A TRL run without sampling log-probs (TRL's own generate)."""
    return run_trl(runs_root, "no_mu")


@pytest.fixture(scope="module")
def with_mu(runs_root):
    """A TRL run whose rollout_func samples with a bf16 copy of the model and returns μ."""
    return run_trl(runs_root, "with_mu", rollout_func=engine_rollout("bf16"))


def test_trl_run_records_trl_batches(no_mu):
    trainer, tok, run = no_mu
    tokens = tokens_of(run)
    m = run.manifest

    # the manifest says where the quantities come from
    assert m["status"] == "finished"
    assert m["config"]["trl_version"] == tl_trl.trl.__version__
    assert m["config"]["mu_source"] is None and "π_old" in m["config"]["mu_note"]
    assert m["anchor"] == "old" and "mu_logp" in m["missing"]
    assert m["active_rule"] == "minirl"
    assert set(m["rules"]) == set(default_rules())
    assert tokens["mu_logp"].null_count() == len(tokens)

    # one recorded micro-batch per TRL loss call: steps 0, 0, 1 with updates 0, 1, 0
    spied = trainer.spy
    assert len(spied) == 3
    keys = tokens.select("step", "update").unique().sort("step", "update").rows()
    assert keys == [(0, 0), (0, 1), (1, 0)]
    assert tokens.select("step", "update", "sample", "pos").is_duplicated().sum() == 0

    template = tiny()[0]
    for (batch, state), (step, update) in zip(spied, keys, strict=True):
        rows = tokens.filter((pl.col("step") == step) & (pl.col("update") == update))
        mask = batch["completion_mask"].bool()
        for i, sample in enumerate(batch[tl_trl.SAMPLE_KEY].tolist()):
            got = rows.filter(pl.col("sample") == sample).sort("pos")
            n = int(mask[i].sum())
            # ids, counts and positions are TRL's completion and mask
            assert got["pos"].to_list() == list(range(n))
            assert got["token_id"].to_list() == batch["completion_ids"][i, :n].tolist()
            assert got["token"].to_list() == [tok.decode([t]) for t in got["token_id"]]
            assert got["advantage"].to_list() == pytest.approx([float(batch["advantages"][i])] * n)
            assert got["group"].to_list() == [sample // N_GEN] * n
        # π is TRL's log-prob pass: equal to a float64 recomputation from the same weights
        ref = logp_float64(
            state,
            template,
            batch["prompt_ids"],
            batch["prompt_mask"],
            batch["completion_ids"],
            batch["completion_mask"],
        )
        order = {s: i for i, s in enumerate(batch[tl_trl.SAMPLE_KEY].tolist())}
        expected = [float(ref[order[s], p]) for s, p in rows.select("sample", "pos").iter_rows()]
        assert rows["pi_logp"].to_list() == pytest.approx(expected, abs=1e-4)

    # π_old: TRL's recomputation before the first update, so π = π_old on update 0 only
    diff = tokens.with_columns(d=(pl.col("pi_logp") - pl.col("old_logp")).abs())
    by_update = diff.group_by("step", "update").agg(pl.col("d").max()).sort("step", "update")
    assert by_update["d"].to_list()[0] < 1e-6 and by_update["d"].to_list()[1] > 1e-3
    assert tokens["entropy"].null_count() == 0 and tokens["entropy"].min() >= 0

    # the counterfactual minirl decision is TRL's own clipping (its clip_ratio/region_mean)
    clipped = tokens.group_by("step", "update").agg(pl.col("blocked_minirl").mean()).sort("step", "update")
    trl_clip = run.metrics.filter(pl.col("name") == "trl/clip_ratio/region_mean").sort("step").collect()
    per_step = clipped.group_by("step").agg(pl.col("blocked_minirl").mean()).sort("step")
    assert trl_clip["value"].to_list() == pytest.approx(per_step["blocked_minirl"].to_list(), abs=1e-6)
    assert tokens["blocked_minirl"].sum() > 0  # lr 5e-2 moves π far enough to clip

    # samples: 8 per generation, TRL's text and rewards; they join the token rows
    samples = run.samples.sort("sample").collect()
    assert samples.height == 16 and samples["sample"].to_list() == list(range(16))
    assert set(samples.filter(pl.col("step") == 0)["prompt"]) <= set(PROMPTS)
    lengths = tokens.group_by("sample").agg(pl.len().alias("n"), pl.col("step").first())
    joined = lengths.join(samples, on=["sample", "step"])
    assert joined.height == lengths.height
    assert (joined["n"] == joined["length"]).all()
    for resp, reward in samples.select("response", "reward").iter_rows():
        assert reward == pytest.approx(len(resp.split()) / MAX_NEW)

    # TRL's logs are in the metrics table, one row per (step, name)
    metrics = run.metrics.collect()
    assert {"trl/reward", "trl/loss", "trl/entropy"} <= set(metrics["name"])
    assert metrics.select("step", "name").is_duplicated().sum() == 0


def test_trl_rollout_func_supplies_mu(with_mu):
    trainer, _, run = with_mu
    tokens = tokens_of(run)
    assert run.manifest["config"]["mu_source"] == "rollout_func"
    assert run.manifest["anchor"] == "mu" and "mu_logp" not in run.manifest["missing"]
    assert tokens["mu_logp"].null_count() == 0

    # μ is the bf16 sampler's log-prob, TRL's sampling_per_token_logps
    for batch, _ in trainer.spy:
        mu = batch["sampling_per_token_logps"]
        mask = batch["completion_mask"].bool()
        for i, sample in enumerate(batch[tl_trl.SAMPLE_KEY].tolist()):
            got = tokens.filter(pl.col("sample") == sample).filter(pl.col("update") == 0)
            if got.height:
                assert got.sort("pos")["mu_logp"].to_list() == pytest.approx(mu[i][mask[i]].tolist(), abs=1e-6)

    # the mismatch columns are filled and consistent with their definitions; before any update
    # (π = π_old) they hold the bf16 engine's gap alone: far above float32 noise, still small
    first = tokens.filter((pl.col("step") == 0) & (pl.col("update") == 0))
    gap = (first["mu_logp"] - first["old_logp"]).abs()
    assert 1e-3 < gap.max() < 0.2 and gap.mean() < 0.05
    assert (first["pi_logp"] - first["old_logp"]).abs().max() < 1e-6
    assert first["binary_tv"].null_count() == 0 and first["binary_tv"].max() > 1e-5
    expected_tv = (first["pi_logp"].exp() - first["mu_logp"].exp()).abs()
    assert first["binary_tv"].to_list() == pytest.approx(expected_tv.to_list(), abs=1e-6)
    expected_ratio = (first["pi_logp"] - first["mu_logp"]).exp()
    assert first["ratio"].to_list() == pytest.approx(expected_ratio.to_list(), rel=1e-5)
    for rule in ("ppo", "dppo_binary_tv", "dppo_binary_kl", "minirl"):
        assert first[f"blocked_{rule}"].null_count() == 0


def test_fp32_engine_agrees_with_trl(tmp_path):
    """Same weights, same precision: the engine's μ is TRL's π_old up to float32 noise, so
    positions, temperature and token alignment match between the sampler and TRL's loss."""
    _, _, run = run_trl(tmp_path, "fp32", rollout_func=engine_rollout("fp32"), args={"max_steps": 1})
    first = run.tokens.filter(pl.col("update") == 0).collect()
    assert first.height > 0
    assert (first["mu_logp"] - first["old_logp"]).abs().max() < 1e-4


@pytest.mark.skipif(
    Version(tl_trl.trl.__version__) < Version("1.16"), reason="TRL maps a None sampling log-prob to NaN from 1.16 on"
)
def test_unscored_tokens_give_their_sequence_a_null_mu(tmp_path):
    """vLLM leaves a token it could not score as None (NaN in TRL's batch): that sequence is
    recorded with a null μ (anchored on π_old), the others keep theirs."""
    engine = engine_rollout("fp32")

    def rollout(prompts, trainer):
        out = engine(prompts, trainer)
        out["logprobs"][0][0] = None  # the first completion of every generation
        return out

    # two optimizer steps: both micro-batches of the first generation
    trainer, _, run = run_trl(tmp_path, "unscored", rollout_func=rollout, args={"max_steps": 2})
    batch = {
        k: torch.cat([b[k] for b, _ in trainer.spy])
        for k in ("sampling_per_token_logps", "completion_mask", tl_trl.SAMPLE_KEY)
    }
    tokens = run.tokens.collect()
    unscored = torch.isnan(batch["sampling_per_token_logps"]).any(dim=1)
    assert int(unscored.sum()) == 1
    bad = int(batch[tl_trl.SAMPLE_KEY][unscored])
    assert tokens.filter(pl.col("sample") == bad)["mu_logp"].null_count() == int(
        batch["completion_mask"][unscored].sum()
    )
    assert tokens.filter(pl.col("sample") != bad)["mu_logp"].null_count() == 0
    assert run.manifest["anchor"] == "mixed"


def test_rules_and_recorder_arguments(tmp_path):
    model, tok = tiny()
    ds = datasets.Dataset.from_dict({"prompt": PROMPTS})
    with pytest.raises(ValueError, match="exactly one of trustlens_dir"):
        TrustLensGRPOTrainer(
            model=model,
            processing_class=tok,
            reward_funcs=length_reward,
            args=grpo_args(tmp_path / "trl"),
            train_dataset=ds,
        )
    # a caller-chosen rule set with TRL's thresholds on the active rule
    trainer = TrustLensGRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=length_reward,
        train_dataset=ds,
        args=grpo_args(tmp_path / "trl", epsilon=0.1, epsilon_high=0.3, max_steps=1),
        trustlens_dir=tmp_path / "run",
        rules={"minirl": (0.1, 0.3), "ppo": (None, None)},
    )
    trainer.train()
    m = load_run(tmp_path / "run").manifest
    assert m["rules"]["minirl"]["low"] == 0.1 and m["rules"]["minirl"]["high"] == 0.3
    assert set(m["rules"]) == {"minirl", "ppo"} and m["active_rule"] == "minirl"


def test_unsupported_trl_is_named(monkeypatch):
    class Broken(GRPOTrainer):
        _compute_loss = None

    with pytest.raises(
        UnsupportedTRLVersion, match=rf"no method _compute_loss \(installed trl {tl_trl.trl.__version__}"
    ):
        with_trustlens(Broken)
    monkeypatch.setattr(tl_trl.trl, "__version__", "0.19.0")
    with pytest.raises(UnsupportedTRLVersion, match=r"trl 0\.19\.0 is older"):
        with_trustlens(type("Old", (GRPOTrainer,), {}))
    with pytest.raises(TypeError, match="GRPOTrainer or a subclass"):
        with_trustlens(dict)
    monkeypatch.setattr(tl_trl.trl, "__version__", "99.0.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with_trustlens(type("New", (GRPOTrainer,), {}))
    assert any("newer than the newest tested" in str(w.message) for w in caught)


@pytest.mark.parametrize("name", ["no_mu", "with_mu"])
def test_dashboard_opens_trl_runs_on_every_page(monkeypatch, runs_root, no_mu, with_mu, name):
    at = _pick_run(_app(monkeypatch, runs_root).run(), name)
    for page, title in PAGES.items():
        at = _open(at, page)
        assert title in [t.value for t in at.title]
        assert not at.error, [e.value for e in at.error]
        if page != "views/compare.py":  # a page about the chosen run says what its anchor is
            assert any("anchor is π_old" in i.value for i in at.info) == (name == "no_mu"), page


def _dppo():
    """TRL's DPPO trainer (trl.experimental.dppo, TRL 1.8 to 1.15), or skip: CI runs these tests
    with TRL 1.8.0 put first on the path (.ci/run)."""
    try:
        from trl.experimental import dppo
    except ImportError:
        pytest.skip(f"trl {tl_trl.trl.__version__} has no trl.experimental.dppo (TRL 1.8 has)")
    return dppo


@pytest.mark.parametrize("divergence, delta", [("binary_tv", 0.01), ("binary_kl", 5e-4)])  # tight: some tokens blocked
def test_dppo_trainer_is_recorded_as_its_dppo_rule(tmp_path, divergence, delta):
    dppo = _dppo()
    model, tok = tiny()
    args = dppo.DPPOConfig(
        **{k: v for k, v in grpo_args(tmp_path / "trl").to_dict().items() if k in _GRPO_KEYS},
        divergence_type=divergence,
        epsilon=delta,
        epsilon_high=delta,
    )
    trainer = with_trustlens(dppo.DPPOTrainer)(
        model=model,
        processing_class=tok,
        reward_funcs=length_reward,
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
        trustlens_dir=tmp_path / "run",
    )
    trainer.train()
    run = load_run(tmp_path / "run")
    rule = f"dppo_{divergence}"
    assert run.active_rule == rule and run.manifest["config"]["source"] == "trl.DPPOTrainer"
    assert (run.rules[rule]["low"], run.rules[rule]["high"], run.rules[rule]["anchor"]) == (delta, delta, "mu")
    assert run.manifest["config"]["divergence_type"] == divergence
    tokens = run.tokens.collect()
    assert tokens["mu_logp"].null_count() == 0  # DPPO always has the sampler's log-probs
    # TRL's own divergence mask on the recorded tokens blocks exactly what the recorded column
    # says, except at A = 0, which TRL masks by its A ≤ 0 branch (no gradient either way)
    pi, mu, adv = (
        torch.tensor(tokens[c].to_numpy(), dtype=torch.float32)[:, None] for c in ("pi_logp", "mu_logp", "advantage")
    )
    keep = trainer._compute_divergence_mask(pi, mu, adv, torch.ones_like(pi))[:, 0]
    nonzero = (adv[:, 0] != 0).numpy()
    trl_blocked = (keep == 0).numpy()
    ours = tokens[f"blocked_{rule}"].to_numpy()
    assert (ours[nonzero] == trl_blocked[nonzero]).all()
    assert not ours[~nonzero].any()
    assert 0 < ours[nonzero].sum() < nonzero.sum()  # the run exercises both decisions


def test_dppo_topk_run_records_topk_divergences(tmp_path):
    dppo = _dppo()
    model, tok = tiny()
    args = dppo.DPPOConfig(
        **{k: v for k, v in grpo_args(tmp_path / "trl").to_dict().items() if k in _GRPO_KEYS},
        divergence_type="topk_kl",
        divergence_topk=3,
        epsilon=1e-3,
        epsilon_high=1e-3,
    )
    trainer = with_trustlens(dppo.DPPOTrainer)(
        model=model,
        processing_class=tok,
        reward_funcs=length_reward,
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
        trustlens_dir=tmp_path / "run",
    )
    trainer.train()
    run = load_run(tmp_path / "run")
    assert run.manifest["config"]["divergence_type"] == "topk_kl"
    if not _accepts_topk(trainer.trustlens_recorder.record):
        # a recorder without precomputed top-K divergences cannot decide the top-K rules: no
        # active rule is claimed rather than a wrong one
        assert run.active_rule is None and not any(r.startswith("dppo_topk") for r in run.rules)
        return
    assert run.active_rule == "dppo_topk_kl" and run.rules["dppo_topk_kl"]["high"] == 1e-3
    tokens = run.tokens.collect()
    assert tokens["topk_kl"].null_count() == 0 and tokens["topk_tv"].null_count() == 0
    # with the sampled token in μ's top-K set (TRL forces it in), top-K ≥ binary
    assert (tokens["topk_tv"] >= tokens["binary_tv"] - 1e-6).all()
    assert (tokens["topk_kl"] >= tokens["binary_kl"] - 1e-6).all()


# GRPOConfig fields the DPPO tests reuse (DPPOConfig sets its own ε, ε_high and loss type)
_GRPO_KEYS = (
    "output_dir",
    "per_device_train_batch_size",
    "num_generations",
    "steps_per_generation",
    "gradient_accumulation_steps",
    "max_completion_length",
    "max_steps",
    "learning_rate",
    "temperature",
    "use_cpu",
    "bf16",
    "report_to",
    "logging_steps",
    "save_strategy",
    "seed",
    "disable_tqdm",
)


def test_gspo_gradient_and_mask_equal_trls_sequence_level_loss(tmp_path, gen):
    """TRL's own `_compute_loss` with importance_sampling_level="sequence" (GSPO), fed a log π we
    control: its gradient equals `policy_loss("gspo", loss_agg_mode="seq-mean-token-mean")`'s, and
    the tokens it gives no gradient are those `gspo` blocks; the hook records the run as gspo."""
    from trustlens.integrations import ActiveRule
    from trustlens.integrations.trl import active_rule_of
    from trustlens.rules.loss import policy_loss

    model, tok = tiny()
    args = grpo_args(
        tmp_path / "trl", importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4
    )
    assert active_rule_of(args) == ActiveRule("gspo", 3e-4, 4e-4)
    trainer = GRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=length_reward,
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
    )
    b, t = 16, MAX_NEW
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    step = torch.where(torch.arange(b)[:, None] % 2 == 0, 1e-4, 0.3)  # half the responses inside the band
    pi = (old + step * torch.randn(b, t, generator=gen, dtype=torch.float64)).clamp(max=-1e-4)
    mask = (torch.arange(t) < torch.randint(1, t + 1, (b, 1), generator=gen)).long()
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    leaf = pi.clone().requires_grad_()
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (leaf, torch.zeros_like(leaf), None)
    trainer.current_gradient_accumulation_steps = 1
    inputs = {
        "prompt_ids": torch.zeros(b, 2, dtype=torch.long),
        "prompt_mask": torch.ones(b, 2, dtype=torch.long),
        "completion_ids": torch.zeros(b, t, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "old_per_token_logps": old,
    }
    trainer.model.train()
    trainer._compute_loss(trainer.model, inputs).backward()
    ours = pi.clone().requires_grad_()
    out = policy_loss(
        "gspo",
        pi_logp=ours,
        mu_logp=old,
        old_logp=old,
        advantages=adv,
        response_mask=mask,
        low=3e-4,
        high=4e-4,
        loss_agg_mode="seq-mean-token-mean",
    )
    out.loss.backward()
    assert torch.allclose(ours.grad, leaf.grad, rtol=1e-12, atol=1e-15)
    valid = mask.bool() & (adv != 0)[:, None]
    assert torch.equal(out.blocked & valid, (leaf.grad == 0) & valid)
    assert bool(out.blocked.any()) and bool((~out.blocked & valid).any())

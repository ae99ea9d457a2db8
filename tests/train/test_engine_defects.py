"""The planted engine defects of `trustlens train --engine` (trustlens.train.engine_defects):
each reports the μ its bug reports, the clean engine is unchanged, and a run records them."""

import json
import math
from dataclasses import replace

import numpy as np
import polars as pl
import pytest
import torch

import trustlens
from trustlens.train.config import TrainConfig
from trustlens.train.engine_defects import (
    ENGINE_DEFECTS,
    SENTINEL_SHARE,
    deliver,
    engine_sampling,
    engine_token,
    merged_offset,
    nucleus_logits,
    resumed_after,
    sequence_weight,
)
from trustlens.train.model import ModelConfig, build_model, build_tokenizer
from trustlens.train.rollout import Rollout, RolloutConfig, RolloutEngine, response_logits
from trustlens.train.trainer import train

TOK = build_tokenizer()
SMALL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
PROMPTS = [TOK(t).input_ids for t in ("12 + 47 + 8 =", "3 + 4 =")]


def fp32_engine(defect: str, temperature: float = 0.5) -> tuple[torch.nn.Module, RolloutEngine]:
    model = build_model(SMALL, seed=0)
    cfg = RolloutConfig(temperature=temperature, max_new_tokens=10, precision="fp32", topk=5, defect=defect)
    return model, RolloutEngine(model, cfg, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id)


def float64_logits(model: torch.nn.Module, batch: Rollout) -> torch.Tensor:
    """The model's logits predicting each response token, float64 (B, T, V), no KV cache."""
    with torch.no_grad():
        return response_logits(model.double(), batch, 1.0).double()


def generate(engine: RolloutEngine) -> Rollout:
    return engine.generate([p for p in PROMPTS for _ in range(4)], generator=torch.Generator().manual_seed(0))


def test_nucleus_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.1, 0.5, 0.15, 0.25]])  # sorted: 0.5, 0.25, 0.15, 0.1; mass before: 0, 0.5, 0.75, 0.9
    kept = nucleus_logits(probs.log(), 0.8)
    assert torch.isinf(kept[0, 0]) and torch.isfinite(kept[0, 1:]).all()
    torch.testing.assert_close(torch.softmax(kept, -1), torch.tensor([[0.0, 0.5, 0.15, 0.25]]) / 0.9)
    top = nucleus_logits(torch.tensor([[0.0, 5.0, 0.0]]), 0.5)  # the most likely id alone reaches p
    assert torch.isfinite(top).tolist() == [[False, True, False]]


def test_clean_reports_mu_at_the_temperature():
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(1)) * 3
    tok, logp, ids, logp_k = engine_token(
        logits, temperature=0.5, topk=4, defect="clean", generator=torch.Generator().manual_seed(2), greedy=False
    )
    ref = torch.log_softmax(logits.double() / 0.5, -1)
    torch.testing.assert_close(logp.double(), ref.gather(-1, tok[:, None])[:, 0], atol=1e-5, rtol=0)
    torch.testing.assert_close(logp_k.double(), ref.gather(-1, ids), atol=1e-5, rtol=0)


def test_raw_logprobs_samples_at_tau_and_reports_before_it():
    model, engine = fp32_engine("raw_logprobs", temperature=0.5)
    batch = generate(engine)
    m = batch.response_mask
    raw = torch.log_softmax(float64_logits(model, batch), -1)  # (B, T, V) at τ = 1
    torch.testing.assert_close(
        batch.mu_logp[m].double(), raw.gather(-1, batch.response_ids[..., None])[..., 0][m], atol=2e-5, rtol=0
    )
    torch.testing.assert_close(batch.mu_topk_logp[m].double(), raw.gather(-1, batch.mu_topk_ids)[m], atol=2e-5, rtol=0)
    # the tokens were drawn from the clean engine's distribution: the same draws, the same tokens
    _, clean = fp32_engine("clean", temperature=0.5)
    assert torch.equal(generate(clean).response_ids, batch.response_ids)


def test_top_p_samples_inside_the_nucleus_and_renormalises():
    model, engine = fp32_engine("top_p", temperature=1.0)
    batch = generate(engine)
    m = batch.response_mask
    probs = torch.softmax(float64_logits(model, batch), -1)  # (B, T, V)
    sorted_probs, order = probs.sort(-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs
    kept = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < 0.8)  # (B, T, V)
    assert kept.gather(-1, batch.response_ids[..., None])[..., 0][m].all()
    mass = (probs * kept).sum(-1)  # (B, T) the nucleus's mass under softmax(logits / τ)
    expected = (probs.gather(-1, batch.response_ids[..., None])[..., 0] / mass).log()
    torch.testing.assert_close(batch.mu_logp[m].double(), expected[m], atol=2e-5, rtol=0)
    # μ's top-K: renormalised inside the nucleus, probability 0 outside it
    top_kept = kept.gather(-1, batch.mu_topk_ids)[m]
    assert torch.isneginf(batch.mu_topk_logp[m][~top_kept]).all()
    expected_k = (probs.gather(-1, batch.mu_topk_ids) / mass[..., None]).log()[m]
    torch.testing.assert_close(batch.mu_topk_logp[m][top_kept].double(), expected_k[top_kept], atol=2e-5, rtol=0)


def hand_rollout() -> Rollout:
    # two responses after a one-token prompt: lengths 3 and 2 (the second right-padded)
    semi = TOK.convert_tokens_to_ids(";")
    response = torch.tensor([[semi, 12, semi], [7, semi, 0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return Rollout(
        input_ids=torch.cat([torch.ones(2, 1, dtype=torch.long), response], 1),
        attention_mask=torch.cat([torch.ones(2, 1, dtype=torch.long), mask.long()], 1),
        prompt_len=1,
        response_ids=response,
        response_mask=mask,
        mu_logp=torch.tensor([[-0.1, -0.2, -0.3], [-1.0, -2.0, 0.0]]),
        mu_topk_ids=response[..., None],
        mu_topk_logp=torch.tensor([[-0.1, -0.2, -0.3], [-1.0, -2.0, 0.0]])[..., None],
    )


def test_shifted_gives_each_position_the_previous_log_mu():
    out = deliver(hand_rollout(), "shifted", tokenizer=TOK, generator=torch.Generator())
    assert torch.equal(out.mu_logp, torch.tensor([[-0.1, -0.1, -0.2], [-1.0, -1.0, 0.0]]))
    assert torch.equal(out.response_ids, hand_rollout().response_ids)


def test_sentinel_writes_zero_at_a_share_of_response_tokens():
    B, T = 64, 50
    mask = torch.rand(B, T, generator=torch.Generator().manual_seed(5)) < 0.8
    mu = torch.full((B, T), -1.5).masked_fill(~mask, 0.0)
    batch = Rollout(
        input_ids=torch.zeros(B, T + 1, dtype=torch.long),
        attention_mask=torch.ones(B, T + 1, dtype=torch.long),
        prompt_len=1,
        response_ids=torch.zeros(B, T, dtype=torch.long),
        response_mask=mask,
        mu_logp=mu,
        mu_topk_ids=torch.zeros(B, T, 1, dtype=torch.long),
        mu_topk_logp=mu[..., None],
    )
    out = deliver(batch, "sentinel", tokenizer=TOK, generator=torch.Generator().manual_seed(0))
    hit = mask & (out.mu_logp == 0.0)
    share = float(hit.sum()) / float(mask.sum())
    n = float(mask.sum())
    assert abs(share - SENTINEL_SHARE) < 4 * math.sqrt(SENTINEL_SHARE * (1 - SENTINEL_SHARE) / n)
    assert (out.mu_logp[mask & ~hit] == -1.5).all() and (out.mu_logp[~mask] == 0.0).all()


def test_token_ids_hands_the_trainer_unk_for_the_separator():
    batch = hand_rollout()
    out = deliver(batch, "token_ids", tokenizer=TOK, generator=torch.Generator())
    unk = TOK.unk_token_id
    assert out.response_ids.tolist() == [[unk, 12, unk], [7, unk, 0]]
    assert torch.equal(out.input_ids[:, 1:], out.response_ids) and torch.equal(
        out.input_ids[:, :1], batch.input_ids[:, :1]
    )
    assert torch.equal(out.mu_logp, batch.mu_logp)
    # μ's top-K ids through the same vocabulary: the sampled id stays in its set (record(logits=…) needs it)
    assert out.mu_topk_ids[..., 0].tolist() == out.response_ids.tolist()


def test_token_ids_keeps_a_top_k_set_holding_unk_distinct():
    # one position whose engine top-2 holds both `;` (sampled, μ 0.6) and `<unk>` (μ 0.1)
    semi, unk = TOK.convert_tokens_to_ids([";", TOK.unk_token])
    response = torch.tensor([[semi]])
    batch = replace(
        hand_rollout(),
        input_ids=torch.tensor([[1, semi]]),
        attention_mask=torch.ones(1, 2, dtype=torch.long),
        response_ids=response,
        response_mask=torch.tensor([[True]]),
        mu_logp=torch.tensor([[math.log(0.6)]]),
        mu_topk_ids=torch.tensor([[[semi, unk]]]),
        mu_topk_logp=torch.log(torch.tensor([[[0.6, 0.1]]])),
    )
    out = deliver(batch, "token_ids", tokenizer=TOK, generator=torch.Generator())
    assert out.mu_topk_ids.tolist() == [[[unk, semi]]]  # distinct; the sampled id <unk> at μ(;)
    assert out.mu_topk_logp[0, 0, 0].item() == pytest.approx(math.log(0.6)) and out.mu_topk_logp[0, 0, 1] == -math.inf


def test_frozen_policy_merges_the_adapter_again_at_every_sync():
    model, engine = fp32_engine("frozen_policy")
    _, clean = fp32_engine("clean")
    logits = torch.randn(2, SMALL.vocab_size, generator=torch.Generator().manual_seed(0))
    offset = merged_offset(SMALL.vocab_size)
    assert offset.std().item() == pytest.approx(0.05, rel=0.3) and torch.equal(offset, merged_offset(SMALL.vocab_size))
    for k in range(3):  # k syncs so far: k copies of the delta on the engine's logits
        assert torch.allclose(engine._next_logits(logits, None, noise=False), logits + k * offset)
        assert torch.equal(clean._next_logits(logits, None, noise=False), logits)
        engine.sync_weights(model)
        clean.sync_weights(model)


def test_top_p_mask_hands_the_trainer_the_nucleus_it_sampled_from(tmp_path):
    _, engine = fp32_engine("top_p_mask", temperature=1.0)
    batch = engine.generate(PROMPTS, generator=torch.Generator().manual_seed(0))
    support = batch.support  # (B, T, V)
    assert support is not None and support.shape[:2] == batch.response_ids.shape
    valid = batch.response_mask
    sampled_in = support.gather(-1, batch.response_ids[..., None])[..., 0]
    assert bool(sampled_in[valid].all())  # every sampled id lies in its support
    assert fp32_engine("top_p")[1].generate(PROMPTS, generator=torch.Generator().manual_seed(0)).support is None
    cfg = TrainConfig(engine="top_p_mask", **TINY)
    train(cfg, tmp_path / "run", progress=False)
    rows = trustlens.load_run(tmp_path / "run").tokens.collect()
    mass = rows["pi_support_mass"]
    assert mass.null_count() == 0 and mass.min() > 0 and mass.max() <= 1 and mass.mean() < 0.99
    assert rows["support_size"].min() >= 1
    # the recorded μ is renormalised over the support, π is not: d ≈ −log S on average
    d = (rows["mu_logp"] - rows["old_logp"]).mean()
    assert d == pytest.approx(-np.log(mass.to_numpy()).mean(), abs=0.03)


def test_clean_delivers_the_rollout_itself():
    batch = hand_rollout()
    for defect in ("clean", "raw_logprobs", "top_p"):
        assert deliver(batch, defect, tokenizer=TOK, generator=torch.Generator()) is batch


def test_engine_option_is_checked():
    with pytest.raises(ValueError, match="engine must be one of clean, raw_logprobs"):
        TrainConfig(engine="typo")
    with pytest.raises(ValueError, match="temperature ≠ 1"):
        TrainConfig(engine="raw_logprobs", temperature=1.0)
    assert engine_sampling("raw_logprobs", 0.5) == {
        "temperature": 0.5,
        "top_p": None,
        "top_k": None,
        "min_p": None,
        "logprobs": "raw",
        "processors": [],
    }
    assert engine_sampling("top_p", 1.0)["top_p"] == 0.8
    with pytest.raises(
        ValueError, match="engine 'resume' restarts the run after step steps // 2 − 1: it needs steps ≥ 2"
    ):
        TrainConfig(engine="resume", steps=1)


TINY = dict(steps=1, prompts_per_step=2, group_size=2, minibatches=1, eval_size=0, max_new_tokens=12)


def test_runs_record_what_each_defect_reports(tmp_path):
    """Each defect's run on the shipped warm start (one step of 4 responses, seed 0) records the
    engine's reported sampling and a μ that shows its bug against the clean run."""
    gaps, zeros = {}, {}
    for defect in ENGINE_DEFECTS:
        cfg = TrainConfig(engine=defect, **(TINY | ({"steps": 2} if defect == "resume" else {})))
        train(cfg, tmp_path / defect, progress=False)
        manifest = json.loads((tmp_path / defect / "run.json").read_text())
        assert manifest["sampling"] == engine_sampling(defect, cfg.temperature)
        assert manifest["model_kind"] == "dense" and manifest["config"]["engine"] == defect
        rows = trustlens.load_run(tmp_path / defect).tokens.collect()
        if defect == "token_ids":  # π_old gives the <unk> the trainer reads almost nothing
            swapped = rows.filter(pl.col("token") == "<unk>")
            assert len(swapped) > 0 and swapped["old_logp"].max() < -3
        gap = rows["mu_logp"] - rows["old_logp"]  # (N,) log μ − log π_old
        gaps[defect] = (gap.mean(), gap.abs().mean())
        zeros[defect] = int((rows["mu_logp"] == 0.0).sum())
    assert gaps["clean"][1] < 0.02  # the bf16 engine's drift
    assert gaps["raw_logprobs"][1] > 5 * gaps["clean"][1]
    assert gaps["top_p"][0] > 5 * abs(gaps["clean"][0])  # renormalised: μ above π_old
    assert gaps["shifted"][1] > 0.1
    assert zeros["sentinel"] > zeros["clean"]
    assert gaps["token_ids"][0] > 1  # the trainer's context holds ids the engine never sampled


def test_batch_variant_splits_the_output_layer_of_a_partial_engine_batch():
    """split_k_hook: rows of full engine batches keep the layer's logits; the last B mod MAX_SEQS
    rows are Σ over SPLITS chunks of the hidden size — the same values up to float32 rounding."""
    from trustlens.train.engine_defects import MAX_SEQS, split_k_hook

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 300, bias=False)
    h = torch.randn(MAX_SEQS + 3, 5, 64)  # (B, L, d): one full batch and a partial one of 3
    plain = layer(h)
    layer.register_forward_hook(split_k_hook)
    with torch.no_grad():
        split = layer(h)
    assert torch.equal(split[:MAX_SEQS], plain[:MAX_SEQS])
    assert not torch.equal(split[MAX_SEQS:], plain[MAX_SEQS:])
    torch.testing.assert_close(split.double(), (h.double() @ layer.weight.double().T), atol=1e-5, rtol=0)
    assert torch.equal(layer(h[:MAX_SEQS]), plain[:MAX_SEQS])  # a full batch alone: untouched


def test_resume_engine_restarts_from_the_warm_start_and_takes_syncs_as_deltas():
    """After `restart`, the engine holds θ_0 (the warm start), not the trainer's θ_r; a later sync
    of θ gives θ + (θ_0 − θ_r): behind by what the trainer learnt before the restart."""
    start, engine = fp32_engine("resume")
    trainer = build_model(SMALL, seed=0)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.01)  # θ_r: the first half's training
    engine.restart(start, trainer)
    held = dict(engine.model.named_parameters())
    for name, p in start.named_parameters():  # θ_r + (θ_0 − θ_r): θ_0 up to float32 rounding
        torch.testing.assert_close(held[name], p, rtol=0, atol=1e-7)
    theta_r = {name: p.detach().clone() for name, p in trainer.named_parameters()}
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.02)  # θ: after the resume
    engine.sync_weights(trainer)
    for name, p in trainer.named_parameters():
        torch.testing.assert_close(held[name], p + (dict(start.named_parameters())[name] - theta_r[name]))
    assert resumed_after(8) == 3 and resumed_after(2) == 0


def test_resume_run_holds_its_resume_point_and_a_lasting_step_in_the_mismatch(tmp_path):
    """A `resume` run of the default preset, 8 steps: the run is reopened after step 3 (run.json
    resumed_after [3]), every step is recorded once, k3 of π_old vs μ steps up from step 4 on and
    stays (the engine serves θ + (θ_0 − θ_3)), and the doctor names the resume first."""
    from trustlens.analysis import doctor
    from trustlens.train.config import config_from_preset

    train(config_from_preset("default", steps=8, eval_size=0, engine="resume"), tmp_path / "run", progress=False)
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["resumed_after"] == [3] and manifest["status"] == "finished"
    rows = trustlens.load_run(tmp_path / "run").tokens.collect()
    d = pl.col("old_logp") - pl.col("mu_logp")  # log π_old − log μ
    k3 = rows.group_by("step").agg((d.exp() - 1 - d).mean().alias("k3"), pl.len()).sort("step")
    assert k3["step"].to_list() == list(range(8))
    assert k3["k3"][4:].min() > 10 * k3["k3"][:4].max()
    first = doctor(tmp_path / "run")[0]
    assert (first.check, first.verdict) == ("resume", "problem"), first.summary


def test_sequence_weight_sums_the_token_log_ratios():
    mu = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.3, -0.3]])
    old = torch.tensor([[-1.5, -1.0, -9.0], [-0.2, -0.4, -0.3]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    # Σ log(π_old/μ) over the response: −0.5 + 1.0 (the masked −8.5 left out); 0.1 − 0.1 + 0
    torch.testing.assert_close(sequence_weight(mu, old, mask), torch.tensor([math.exp(0.5), 1.0]))


def test_sequence_sum_run_records_the_summed_weight_and_the_doctor_names_it(tmp_path):
    """A `sequence_sum` run (default preset, 2 steps) records per response the weight it computed,
    exp(Σ log(π_old/μ)), on every token of the response; the doctor names it first; a clean run
    records no sequence weight."""
    from trustlens.analysis import doctor
    from trustlens.train.config import config_from_preset

    cfg = config_from_preset("default", steps=2, eval_size=0, engine="sequence_sum")
    train(cfg, tmp_path / "run", progress=False)
    rows = trustlens.load_run(tmp_path / "run").tokens.collect()
    per_response = rows.group_by("step", "update", "sample").agg(
        pl.col("seq_weight").n_unique().alias("values"),
        pl.col("seq_weight").first(),
        (pl.col("old_logp").cast(pl.Float64) - pl.col("mu_logp")).sum().exp().alias("summed"),
    )
    assert per_response["values"].max() == 1
    np.testing.assert_allclose(per_response["seq_weight"], per_response["summed"], rtol=1e-4)
    first = doctor(tmp_path / "run")[0]
    assert (first.check, first.verdict) == ("sequence_sum", "problem"), first.summary
    train(replace(cfg, engine="clean", steps=1), tmp_path / "clean", progress=False)
    clean = trustlens.load_run(tmp_path / "clean").tokens.collect()
    assert "seq_weight" not in clean.columns or clean["seq_weight"].null_count() == len(clean)

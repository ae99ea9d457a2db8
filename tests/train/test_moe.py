"""The built-in mixture of experts (`--model moe`): the model, its shipped warm start, the engine's
routing at reduced precision, the trainer's routing (one pass, replay, the shadow split) and the
refusals on a dense model."""

import json

import polars as pl
import pytest
import torch
from transformers import Qwen3MoeForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

import trustlens
from trustlens.analysis.diagnosis import doctor
from trustlens.cli import main
from trustlens.routing import routing_share
from trustlens.routing.replay import DENSE, routers, routing
from trustlens.train.config import TrainConfig, config_from_preset
from trustlens.train.model import MOE, ModelConfig, build_model, build_tokenizer, load_checkpoint, save_checkpoint
from trustlens.train.rollout import RolloutConfig, RolloutEngine, fp8_round
from trustlens.train.routed import (
    flip_metrics,
    flipped,
    load_balancing_loss,
    policy_logits,
    routing_record_kwargs,
)
from trustlens.train.trainer import train
from trustlens.train.warmup import WarmupConfig, warmup

TOK = build_tokenizer()
TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, num_experts=4,
                   expert_intermediate_size=16, number_periods=(2, 5))  # fmt: skip
PROMPTS = [TOK(p).input_ids for p in ("3 + 4 + 5 =", "10 + 22 + 7 =", "41 + 0 + 9 =", "8 + 8 + 8 =")]


def test_the_moe_model():
    model = build_model(MOE, seed=0)
    assert isinstance(model, Qwen3MoeForCausalLM) and MOE.kind == "moe" and ModelConfig().kind == "dense"
    assert sorted(routers(model)) == [1, 2, 3]  # layer 0 is dense
    router = routers(model)[1]
    assert (router.num_experts, router.top_k) == (8, 2)
    assert model.config.router_aux_loss_coef == 0.01


def test_the_shipped_warm_start_loads_with_safetensors_only():
    model, tokenizer, meta = load_checkpoint(model="moe")
    assert isinstance(model, Qwen3MoeForCausalLM) and len(tokenizer) == model.config.vocab_size
    assert meta["config"]["model"]["num_experts"] == 8 and meta["reached_target"]
    assert 0.3 < meta["accuracy_greedy"] < 0.6  # mediocre on purpose, like the dense warm start
    shipped = trustlens.paths.data_path("warmstart_moe")
    assert sorted(p.name for p in shipped.iterdir()) == [
        "config.json",
        "meta.json",
        "model.safetensors",
        "tokenizer.json",
    ]


def test_warmup_trains_the_moe_with_its_aux_loss(tmp_path):
    cfg = WarmupConfig(max_steps=2, batch_size=8, eval_every=2, eval_size=4, final_eval_size=4, model=TINY)
    _, _, meta = warmup(cfg, tmp_path / "w", progress=False)
    model, _, _ = load_checkpoint(tmp_path / "w")
    assert isinstance(model, Qwen3MoeForCausalLM) and meta["steps"] == 2
    assert json.loads((tmp_path / "w" / "config.json").read_text())["model_type"] == "qwen3_moe"


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp8"])
def test_the_engine_reports_its_routing_and_flips_near_ties_at_reduced_precision(precision):
    model, _, _ = load_checkpoint(model="moe")
    engine = RolloutEngine(model, RolloutConfig(precision=precision, max_new_tokens=12), eos_id=2, pad_id=0)
    batch = engine.generate(PROMPTS * 4, generator=torch.Generator().manual_seed(0))
    experts = batch.routed_experts
    S = batch.input_ids.shape[1]
    assert experts.shape == (16, S, 4, 2) and (experts[:, :, 0] == DENSE).all()
    _, routed = policy_logits(model, batch, 1.0)
    trainer = routed.experts  # (B, T, L, k) the trainer's float32 routing
    engine_side = experts[:, batch.prompt_len - 1 : -1]
    flips = flipped(engine_side, trainer)[batch.response_mask]
    if precision == "fp32":  # the same numerics up to the KV cache: no flip
        assert not flips.any()
    else:  # bf16 router logits: near-tied experts flip on some tokens, not on most
        assert 0 < flips.float().mean() < 0.2


def test_the_fp8_engine_quantises_the_experts_and_runs_the_router_in_bf16():
    model = build_model(TINY, seed=0)
    engine = RolloutEngine(model, RolloutConfig(precision="fp8"), eos_id=2, pad_id=0)
    source, served = dict(model.named_parameters()), dict(engine.model.named_parameters())
    name = "model.layers.1.mlp.experts.gate_up_proj"
    assert torch.equal(served[name], fp8_round(source[name].detach(), dim=-1))
    gate = "model.layers.1.mlp.gate.weight"
    assert torch.equal(served[gate], source[gate].detach().to(torch.bfloat16).float())


def test_the_load_balancing_loss_is_transformers_own():
    model = build_model(TINY, seed=0)
    ids = torch.randint(4, 100, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with routing(model) as trace:
        out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    ours = load_balancing_loss(trace, mask)
    theirs = load_balancing_loss_func(out.router_logits, 4, 2, mask)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)


def test_flip_metrics_hand_case():
    mu = torch.tensor([[[[-1, -1], [0, 1], [2, 3]], [[-1, -1], [1, 0], [3, 1]]]])  # (1, 2, 3, 2)
    pi = torch.tensor([[[[-1, -1], [1, 0], [2, 3]], [[-1, -1], [1, 0], [2, 3]]]])
    assert flipped(mu, pi).tolist() == [[[False, False, False], [False, False, True]]]  # sets, not orders
    m = flip_metrics(mu, pi, torch.tensor([[True, True]]))
    assert m["routing/flipped_tokens"].value == 0.5 and m["routing/flipped_layers"].value == 0.25


def test_routing_record_kwargs_on_a_mixture_of_experts_only():
    mu = pi = torch.zeros(1, 2, 3, 2, dtype=torch.long)
    assert routing_record_kwargs(None, None) == {}
    assert routing_record_kwargs(mu, pi) == {"mu_routed_experts": mu, "pi_routed_experts": pi}


def test_the_recorded_routing_agrees_with_the_replay_split(tmp_path):
    """Issue 49's check: the share of Σ |Δ log p| the record attributes to the tokens with a
    flipped layer (trustlens.routing.routing_share, the doctor's `routing` check) is within 5 % of
    the total of the shadow forward's routing part, Σ |live − replayed| / Σ (|live − replayed| +
    |replayed − μ|) over the same tokens, on the built-in MoE with the fp8 engine at τ = 1 (the fp8
    preset's numerics). Both are sums over many tokens (3 steps of 32 × 4 responses, ~2,900 tokens): on
    one step of a few hundred they differ by up to 0.3, over a whole 160-step run by 0.01–0.04
    (docs/claims.md). The routing part is a real share here (0.1–0.25 over seeds 0–2), so the 5 %
    is a fraction of it, not of a share near 0."""
    cfg = config_from_preset("quick", model="moe", rollout_precision="fp8", temperature=1.0, prompts_per_step=32,
                             steps=3, eval_size=0, routing_split_every=1)  # fmt: skip
    train(cfg, tmp_path / "r", progress=False)
    run = trustlens.load_run(tmp_path / "r")
    m = _metrics(tmp_path / "r")
    tokens = dict(run.tokens.filter(pl.col("update") == 0).group_by("step").len().collect().iter_rows())
    # the split's per-step means, weighted by the step's response tokens: sums over the run's tokens
    routing = sum(m[s, "routing/abs_dlogp_routing"] * n for s, n in tokens.items())
    residual = sum(m[s, "routing/abs_dlogp_residual"] * n for s, n in tokens.items())
    split = routing / (routing + residual)
    recorded = routing_share(run)
    assert recorded is not None and 0 < recorded.flipped_share < 0.2
    assert recorded.tokens == sum(tokens.values()) > 2500
    assert run.routing.collect()["flips"].sum() > 0  # the exact per-layer table
    assert split > 0.08
    assert recorded.dlogp_share == pytest.approx(split, abs=0.05)
    (finding,) = doctor(run, checks=["routing"])  # the share it reports is the recorded one
    assert finding.evidence["dlogp_share"] == recorded.dlogp_share and "routed differently" in finding.summary
    # the flipped tokens carry well over their number's share of k3 at τ = 1: the doctor says so
    assert finding.verdict in ("warning", "problem") and "router replay" in finding.fix


def _metrics(run_dir):
    m = trustlens.load_run(run_dir).metrics.collect()
    return {(s, n): v for s, n, v in zip(m["step"], m["name"], m["value"], strict=True)}


@pytest.mark.parametrize("replay", [False, True])
def test_the_trainer_splits_the_mismatch_and_replays_the_routing(tmp_path, replay):
    cfg = config_from_preset("quick", model="moe", rollout_precision="fp8", steps=2, eval_size=0, max_new_tokens=8,
                             routing_split_every=1, routing_replay=replay)  # fmt: skip
    result = train(cfg, tmp_path / "r", progress=False)
    assert len(result.rewards) == 2
    m = _metrics(tmp_path / "r")
    for step in (0, 1):
        # π_old is the live pass without replay, the replayed one with it: its K3 is the split's
        same = m[step, "routing/k3_replayed" if replay else "routing/k3_live"]
        assert same == pytest.approx(m[step, "k3_kl"], rel=1e-9, abs=1e-15)
        assert 0 <= m[step, "routing/share"] <= 1 and 0 <= m[step, "routing/flipped_tokens"] <= 1
    manifest = json.loads((tmp_path / "r" / "run.json").read_text())
    assert manifest["config"]["model"] == "moe" and manifest["config"]["routing_replay"] is replay


def test_replay_on_a_dense_model_is_one_clear_line(tmp_path, capsys):
    for name, value in (("routing_replay", True), ("routing_split_every", 5)):
        with pytest.raises(
            ValueError, match=r"needs a mixture-of-experts model, and this run's is dense: add --model moe"
        ):
            TrainConfig(**{name: value})
    assert main(["train", "--routing-replay", "--quiet", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--routing-replay needs a mixture-of-experts model" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()
    dense = tmp_path / "dense"
    save_checkpoint(
        build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)), TOK, dense
    )
    cfg = TrainConfig(model="moe", checkpoint=str(dense), routing_replay=True, steps=1)
    with pytest.raises(ValueError, match=r"checkpoint .* is dense: pass an MoE checkpoint"):
        train(cfg, None, progress=False)

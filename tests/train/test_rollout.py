import copy

import pytest
import torch

from trustlens.train.model import ModelConfig, build_model, build_tokenizer
from trustlens.train.rollout import FP8_MAX, RolloutConfig, RolloutEngine, fp8_round, left_pad, response_logits

TOK = build_tokenizer()
EOS, PAD = TOK.eos_token_id, TOK.pad_token_id
SMALL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
# prompts of different lengths, so that left padding is exercised
PROMPTS = [TOK(t).input_ids for t in ("12 + 47 + 8 =", "3 + 4 =", "1 + 2 + 3 + 4 =")]


class EosBias(torch.nn.Module):
    """A causal LM whose eos logit is raised by `bias`, so that responses end at varied lengths."""

    def __init__(self, inner: torch.nn.Module, bias: float) -> None:
        super().__init__()
        self.inner, self.bias = inner, bias

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out.logits[..., EOS] += self.bias
        return out


def small_model(bias: float = 5.0, seed: int = 0) -> torch.nn.Module:
    return EosBias(build_model(SMALL, seed=seed), bias)


def float64_logp(model: torch.nn.Module, batch, temperature: float) -> torch.Tensor:
    """log softmax of the model's logits / τ in float64, (B, T, V), without a KV cache."""
    with torch.no_grad():
        logits = response_logits(copy.deepcopy(model).double(), batch, temperature)
    return torch.log_softmax(logits.double(), -1)


def generate(engine, prompts=PROMPTS, repeat=4, seed=0, **kw):
    return engine.generate(
        [p for p in prompts for _ in range(repeat)], generator=torch.Generator().manual_seed(seed), **kw
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fp32_mu_equals_float64_recomputation(temperature):
    model = small_model()
    cfg = RolloutConfig(temperature=temperature, max_new_tokens=12, precision="fp32")
    batch = generate(RolloutEngine(model, cfg, eos_id=EOS, pad_id=PAD))
    m = batch.response_mask
    assert m.any(-1).all() and not m.all()  # some responses end early, none is empty
    ref = float64_logp(model, batch, temperature)  # (B, T, V)
    ref_tok = ref.gather(-1, batch.response_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(batch.mu_logp[m].double(), ref_tok[m], atol=2e-5, rtol=0)
    ref_topk = ref.gather(-1, batch.mu_topk_ids)
    torch.testing.assert_close(batch.mu_topk_logp[m].double(), ref_topk[m], atol=2e-5, rtol=0)


def test_topk_holds_the_most_likely_ids_and_the_sampled_one():
    model = small_model()
    batch = generate(
        RolloutEngine(model, RolloutConfig(max_new_tokens=10, precision="fp32", topk=20), eos_id=EOS, pad_id=PAD)
    )
    m = batch.response_mask
    assert batch.mu_topk_ids.shape == (*m.shape, 20)
    assert (batch.mu_topk_ids == batch.response_ids[..., None]).any(-1)[m].all()
    ref = float64_logp(model, batch, 1.0)
    top19 = ref.topk(19, -1).indices.sort(-1).values
    for b, t in m.nonzero().tolist():
        # the 19 most likely ids are always kept; the 20th slot holds the sampled id if needed
        assert set(top19[b, t].tolist()) <= set(batch.mu_topk_ids[b, t].tolist())


def test_padding_after_eos():
    batch = generate(RolloutEngine(small_model(), RolloutConfig(max_new_tokens=12), eos_id=EOS, pad_id=PAD))
    ids, m = batch.response_ids, batch.response_mask
    for row_ids, row_m in zip(ids.tolist(), m.tolist(), strict=True):
        n = sum(row_m)
        assert row_m == [True] * n + [False] * (len(row_m) - n)  # the mask is a prefix
        assert EOS not in row_ids[: n - 1]  # eos, if any, is the last real token
        if n < len(row_ids):
            assert row_ids[n - 1] == EOS and set(row_ids[n:]) == {PAD}
    assert (batch.mu_logp[~m] == 0).all() and (batch.mu_logp[m] < 0).all()
    assert batch.input_ids.shape[1] == batch.prompt_len + ids.shape[1]
    assert torch.equal(batch.attention_mask[:, batch.prompt_len :].bool(), m)
    assert torch.equal(batch.lengths(), m.sum(-1))


def test_bf16_engine_has_a_small_real_mismatch():
    model = small_model()
    batch = generate(RolloutEngine(model, RolloutConfig(max_new_tokens=12), eos_id=EOS, pad_id=PAD))
    ref = float64_logp(model, batch, 1.0).gather(-1, batch.response_ids[..., None]).squeeze(-1)
    gap = (batch.mu_logp.double() - ref)[batch.response_mask].abs()
    assert 1e-4 < gap.max() < 0.5


def test_sync_weights_copies_the_trainer():
    trainer = small_model(seed=0)
    engine = RolloutEngine(trainer, RolloutConfig(max_new_tokens=8, precision="fp32"), eos_id=EOS, pad_id=PAD)
    assert next(engine.model.parameters()).data_ptr() != next(trainer.parameters()).data_ptr()
    other = small_model(seed=1)
    trainer.load_state_dict(other.state_dict())
    before = generate(engine, seed=3)
    engine.sync_weights(trainer)
    after = generate(engine, seed=3)
    fresh = generate(RolloutEngine(other, engine.config, eos_id=EOS, pad_id=PAD), seed=3)
    assert not torch.equal(before.response_ids, after.response_ids)
    assert torch.equal(after.response_ids, fresh.response_ids) and torch.equal(after.mu_logp, fresh.mu_logp)
    with pytest.raises(ValueError, match="no parameter"):
        engine.sync_weights(build_model(SMALL, seed=0))


def test_bf16_engine_keeps_float32_buffers():
    engine = RolloutEngine(small_model(), RolloutConfig(), eos_id=EOS, pad_id=PAD)
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert all(b.dtype == torch.float32 for b in engine.model.buffers() if b.is_floating_point())


def test_logit_noise_changes_mu_and_is_seeded():
    model = small_model()
    clean = RolloutEngine(model, RolloutConfig(max_new_tokens=8, precision="fp32"), eos_id=EOS, pad_id=PAD)
    noisy = RolloutEngine(
        model, RolloutConfig(max_new_tokens=8, precision="fp32", logit_noise=1.0), eos_id=EOS, pad_id=PAD
    )
    a, b = generate(noisy, seed=5), generate(noisy, seed=5)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.mu_logp, b.mu_logp)
    # the noisy μ is not the clean model's distribution at the same tokens
    ref = float64_logp(model, a, 1.0).gather(-1, a.response_ids[..., None]).squeeze(-1)
    assert (a.mu_logp.double() - ref)[a.response_mask].abs().max() > 0.1
    assert not torch.equal(generate(clean, seed=5).mu_logp, a.mu_logp)


def test_greedy_takes_the_argmax():
    model = small_model()
    batch = generate(
        RolloutEngine(model, RolloutConfig(max_new_tokens=8, precision="fp32"), eos_id=EOS, pad_id=PAD), greedy=True
    )
    ref = float64_logp(model, batch, 1.0)
    m = batch.response_mask
    assert torch.equal(ref.argmax(-1)[m], batch.response_ids[m])


def test_bad_arguments():
    with pytest.raises(ValueError, match="precision"):
        RolloutConfig(precision="fp16")
    with pytest.raises(ValueError, match="lag"):
        RolloutConfig(lag=-1)
    with pytest.raises(ValueError, match="temperature"):
        RolloutConfig(temperature=0)
    with pytest.raises(ValueError, match="prompts"):
        left_pad([[1, 2], []], PAD)


def test_stale_engine_serves_the_weights_of_k_syncs_ago():
    """With lag k, after the trainer's t-th sync the engine holds exactly the weights of sync t − k
    (the starting weights while t < k)."""
    k = 2
    trainer = build_model(SMALL, seed=0)
    engine = RolloutEngine(trainer, RolloutConfig(precision="fp32", lag=k), eos_id=EOS, pad_id=PAD)
    history = [copy.deepcopy(trainer.state_dict())]  # weights after sync t, t = 0 the start
    for t in range(1, 6):
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(t)))
        history.append(copy.deepcopy(trainer.state_dict()))
        engine.sync_weights(trainer)
        served = history[max(t - k, 0)]
        for name, p in engine.model.named_parameters():
            assert torch.equal(p, served[name]), (t, name)


def test_fp8_round_hand_checked():
    # scale = 448 / 448 = 1: 0.3 = 1.2 · 2⁻² rounds to the nearest 3-bit mantissa, 1.25 · 2⁻² = 0.3125
    x = torch.tensor([448.0, 1.0, 0.3, -0.3])
    assert fp8_round(x).tolist() == [448.0, 1.0, 0.3125, -0.3125]
    # per-row scales: each row's amax maps to 448 and comes back exactly
    w = torch.tensor([[2.0, 0.5], [0.01, -0.04]])
    out = fp8_round(w, dim=1)
    assert out[0, 0] == 2.0 and out[1, 1] == pytest.approx(-0.04, rel=1e-6)
    assert out[0, 1] == 0.5  # 0.5 · 448 / 2 = 112, a float8_e4m3fn value


def test_fp8_engine_quantises_block_weights_and_differs_boundedly():
    """The fp8 engine's block weights are float8 values times one scale per output channel; its
    log-probs differ from the float32 model's by a small, bounded amount (measured on this model:
    mean |Δ log p| 0.0015 nats, max 0.0069, against 0.00074 for the bf16 engine; on the shipped
    warm start the fp8 engine's k3 is ~17× the bf16 one)."""
    model = build_model(SMALL, seed=0)
    engine = RolloutEngine(model, RolloutConfig(max_new_tokens=12, precision="fp8"), eos_id=EOS, pad_id=PAD)
    w = engine.model.model.layers[0].mlp.up_proj.weight.float()  # (out, in)
    scale = w.abs().amax(dim=1, keepdim=True) / FP8_MAX
    codes = w / scale
    # float8 values up to the float32 rounding of the scale
    torch.testing.assert_close(codes.to(torch.float8_e4m3fn).float(), codes, rtol=1e-5, atol=0)
    torch.testing.assert_close(engine.model.lm_head.weight, model.lm_head.weight, atol=0, rtol=0)
    batch = generate(engine, seed=1)
    m = batch.response_mask
    ref = float64_logp(model, batch, 1.0).gather(-1, batch.response_ids[..., None]).squeeze(-1)
    gap = (batch.mu_logp.double() - ref)[m].abs()
    bf16 = generate(RolloutEngine(model, RolloutConfig(max_new_tokens=12), eos_id=EOS, pad_id=PAD), seed=1)
    bf16_ref = float64_logp(model, bf16, 1.0).gather(-1, bf16.response_ids[..., None]).squeeze(-1)
    bf16_gap = (bf16.mu_logp.double() - bf16_ref)[bf16.response_mask].abs()
    print(f"fp8 mean |Δ log p| {gap.mean():.4g} max {gap.max():.4g}; bf16 mean {bf16_gap.mean():.4g}")
    assert 5e-4 < float(gap.mean()) < 0.01 and float(gap.max()) < 0.05
    assert float(gap.mean()) > 1.5 * float(bf16_gap.mean())


def test_fp32_exact_mu_is_the_trainers_bits():
    """The fp32_exact engine decodes with the trainer's forward over the final shape: log μ equals
    the trainer's log π_old (token_logp of response_logits) bit for bit, responses of varied
    lengths padded to max_new_tokens; the KV-cache fp32 engine's does not on every token."""
    from trustlens.train.trainer import token_logp

    model = small_model(bias=3.0)
    exact = generate(
        RolloutEngine(
            model, RolloutConfig(temperature=0.5, max_new_tokens=10, precision="fp32_exact"), eos_id=EOS, pad_id=PAD
        )
    )
    m = exact.response_mask
    assert exact.response_ids.shape[1] == 10 and not m.all() and m.any(-1).all()
    with torch.no_grad():
        old = token_logp(response_logits(model, exact, 0.5).float(), exact.response_ids)
    assert torch.equal(exact.mu_logp[m], old[m])
    assert (exact.response_ids[~m] == PAD).all()

"""trustlens.routing.replay on a tiny Qwen3-MoE built in code: reading and forcing the routing, and
the split of Δ log p into a routing and a residual part (hand-checked cases)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from trustlens.divergence import token_logp
from trustlens.routing import replay_split, routing
from trustlens.routing.replay import DENSE, last_logits, routers, select_experts, split_dlogp

E, K, L = 4, 2, 3  # experts, top-k, layers (layer 0 dense)


def tiny_moe(seed: int = 0) -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(
        vocab_size=24,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        num_hidden_layers=L,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_experts=E,
        num_experts_per_tok=K,
        mlp_only_layers=[0],
        max_position_embeddings=32,
    )
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(config).float().eval()


def batch(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 24, (3, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded row
    response = torch.ones(3, 4, dtype=torch.bool)
    response[2, 3] = False
    logp_mu = -torch.rand(3, 4, generator=gen)
    return ids, mask, response, logp_mu


def live_experts(model, ids, mask):
    with routing(model) as trace:
        last_logits(model, ids, mask, 4, 1.0)
    return trace.routed_experts(ids.shape[0])


def test_routers_and_the_live_experts():
    model = tiny_moe()
    assert sorted(routers(model)) == [1, 2]
    ids, mask, _, _ = batch()
    experts = live_experts(model, ids, mask)
    assert experts.shape == (3, 9, L, K) and experts.dtype == torch.long
    assert (experts[:, :, 0] == DENSE).all()  # the dense layer
    assert ((experts[:, :, 1:] >= 0) & (experts[:, :, 1:] < E)).all()
    # the top-k of each router's own softmax, k distinct experts per token
    assert (experts[..., 1:, 0] != experts[..., 1:, 1]).all()


def test_select_experts_is_the_routers_own_choice_bit_for_bit():
    model = tiny_moe()
    router = routers(model)[1]
    hidden = torch.randn(10, 16, generator=torch.Generator().manual_seed(3))
    logits, weights, experts = router(hidden)
    again_w, again_e = select_experts(router, logits)
    assert torch.equal(again_e, experts) and torch.equal(again_w, weights)
    forced_w, _ = select_experts(router, logits, experts.flip(-1))  # the same set in another order
    assert torch.equal(forced_w, weights.flip(-1))


def test_forcing_the_live_routing_gives_a_routing_part_of_zero():
    model = tiny_moe()
    ids, mask, response, logp_mu = batch()
    split = replay_split(model, ids, mask, response, live_experts(model, ids, mask), logp_mu)
    assert torch.equal(split.routing, torch.zeros(3, 4, dtype=torch.float64))
    expected = torch.where(response, split.logp_live - logp_mu.double(), 0.0)
    assert torch.equal(split.residual, expected)
    assert torch.equal(split.pi_routed_experts, live_experts(model, ids, mask))


def test_a_different_routing_splits_dlogp_exactly():
    model = tiny_moe()
    ids, mask, response, logp_mu = batch()
    live = live_experts(model, ids, mask)
    other = torch.where(live >= 0, (live + 1) % E, DENSE)  # every token to other experts
    other[:, :4] = DENSE  # −1 keeps the model's own choice on the prompt's first positions
    split = replay_split(model, ids, mask, response, other, logp_mu)
    dlogp = torch.where(response, split.logp_live - logp_mu.double(), 0.0)
    assert torch.equal(split.routing + split.residual, dlogp)
    assert split.routing[response].abs().min() > 0  # every response token was rerouted
    assert torch.equal(split.routing[~response], torch.zeros(1, dtype=torch.float64))
    # the replayed pass is the model's forward with those experts: read them back
    with routing(model, force=other) as trace:
        replayed = token_logp(last_logits(model, ids, mask, 4, 1.0).float(), ids[:, -4:])
    used = trace.routed_experts(3)
    assert torch.equal(used[:, 4:], other[:, 4:]) and torch.equal(used[:, :4], live[:, :4])
    assert torch.equal(split.logp_replayed, torch.where(response, replayed.double(), 0.0))


def test_forced_routing_trains_the_router():
    model = tiny_moe().train()
    ids, mask, _, _ = batch()
    forced = live_experts(model, ids, mask).flip(-1)
    with routing(model, force=forced):
        last_logits(model, ids, mask, 4, 1.0).sum().backward()
    assert routers(model)[1].weight.grad.abs().sum() > 0


def test_split_of_float32_values_is_exact():
    live = torch.tensor([[-0.1, -3.5, -1e-7]])
    replayed = torch.tensor([[-0.2, -3.25, -2e-7]])
    mu = torch.tensor([[-0.15, -9.0, -5e-8]])
    split = split_dlogp(live, replayed, mu, torch.ones(1, 3, dtype=torch.bool))
    assert torch.equal(split.routing + split.residual, live.double() - mu.double())
    assert split.routing[0, 1].item() == -0.25 and split.residual[0, 1].item() == 5.75  # exact binary values


def test_replay_on_a_dense_model_is_one_clear_line():
    dense = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=24,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    ids, mask, response, logp_mu = batch()
    forced = torch.full((3, 9, 1, 2), DENSE)
    with pytest.raises(ValueError, match=r"no mixture-of-experts router .*--model moe"):
        replay_split(dense, ids, mask, response, forced, logp_mu)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda f: f[:, :, :2], r"force must be \(B, S, L=3, k=2\)"),
        (lambda f: f.float(), "integer expert ids"),
        (
            lambda f: f.masked_fill(torch.zeros_like(f, dtype=torch.bool).index_fill_(1, torch.tensor([4]), True), E),
            r"expert id 4 at \(b=0, s=4, layer=0\)",
        ),
        (lambda f: f[:, :5], "force covers 15 positions"),
    ],
)
def test_bad_forced_routing_is_refused(make, message):
    model = tiny_moe()
    ids, mask, _, _ = batch()
    forced = make(live_experts(model, ids, mask))
    with pytest.raises(ValueError, match=message), routing(model, force=forced):
        last_logits(model, ids, mask, 4, 1.0)

"""record's top-K sets always hold the sampled token (forced in from mu_logp), and μ's top-K is
never dropped silently (issue 28, points 2 and 3)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trustlens import TokenRecorder, load_run

V, K = 40, 4


def batch(seed: int, with_sampled: bool, b: int = 3, t: int = 5) -> dict:
    """π and μ from logits, a_t drawn from μ, μ's top-K random sets (holding a_t or not)."""
    gen = torch.Generator().manual_seed(seed)
    pi_logits = torch.randn(b, t, V, generator=gen, dtype=torch.float64) * 2
    mu_logits = pi_logits + torch.randn(b, t, V, generator=gen, dtype=torch.float64)
    log_mu = torch.log_softmax(mu_logits, -1)
    ids = torch.multinomial(log_mu.exp().reshape(-1, V), 1, generator=gen).reshape(b, t)
    sets = torch.stack([torch.randperm(V, generator=gen)[:K] for _ in range(b * t)]).reshape(b, t, K)
    holds = (sets == ids[..., None]).any(-1)
    if with_sampled:
        sets[..., 0] = torch.where(holds, sets[..., 0], ids)
    else:  # no set holds a_t
        sets = torch.where(sets == ids[..., None], (ids[..., None] + 1) % V, sets)
        sets = torch.where(holds[..., None], torch.arange(K).expand(b, t, K) + (ids[..., None] + 1) % (V - K), sets)
    return dict(
        token_ids=ids,
        response_mask=torch.ones(b, t, dtype=torch.bool),
        pi_logp=torch.log_softmax(pi_logits, -1).gather(-1, ids[..., None])[..., 0].float(),
        mu_logp=log_mu.gather(-1, ids[..., None])[..., 0].float(),
        advantages=torch.randn(b, generator=gen),
        logits=pi_logits.float(),
        mu_topk_ids=sets,
        mu_topk_logp=log_mu.gather(-1, sets).float(),
    )


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), with_sampled=st.booleans())
def test_topk_divergences_bound_the_binary_ones(tmp_path_factory, seed, with_sampled):
    run_dir = tmp_path_factory.mktemp("run")
    with TokenRecorder(run_dir, rules=["dppo_binary_tv"]) as rec:
        rec.record(0, **batch(seed, with_sampled))
    rows = load_run(run_dir).tokens.collect()
    for topk, binary in (("topk_tv", "binary_tv"), ("topk_kl", "binary_kl")):
        gap = rows[topk].to_numpy() - rows[binary].to_numpy()
        assert np.all(gap >= -2e-6), (topk, gap.min())


def test_a_set_without_the_sampled_token_and_no_mu_logp_names_its_position(tmp_path):
    given = batch(0, with_sampled=True)
    given["mu_topk_ids"][1, 2] = (given["token_ids"][1, 2] + 1 + torch.arange(K)) % V
    given["old_logp"] = given.pop("mu_logp")
    lacks = r"mu_topk_ids at \(b, t\) = \(1, 2\) lacks the sampled token"
    with TokenRecorder(tmp_path / "run", rules=["dppo_binary_tv"]) as rec, pytest.raises(ValueError, match=lacks):
        rec.record(0, **given)


@pytest.mark.parametrize("precomputed", [False, True])
def test_topk_without_logits(tmp_path, precomputed):
    given = batch(0, with_sampled=True)
    del given["logits"]
    if precomputed:  # the trainer computed them: nothing is dropped
        given["topk_tv"], given["topk_kl"] = torch.full((3, 5), 0.5), torch.full((3, 5), 0.9)
    with TokenRecorder(tmp_path / "run", rules=["dppo_binary_tv"]) as rec:
        if precomputed:
            assert rec.record(0, **given) == 15
        else:
            with pytest.raises(ValueError, match=r"mu_topk_ids and mu_topk_logp were given without logits.*topk_tv"):
                rec.record(0, **given)

"""The columns the doctor's temperature and truncation checks read from π's logits and μ's top-K
(issue 30, points 1a and 1b): pi_logp_raw = log softmax(logits)(a_t), the distribution before
the sampling temperature, and mu_topk_mass / pi_topk_mass = Σ_S μ and Σ_S π over μ's top-K set
S, against hand-checked cases and float64 definitions, on the CPU's chunked path and through a
recorder into a run."""

import math

import numpy as np
import pytest
import torch

import trustlens.divergence.kernels as kernels
from trustlens import TokenRecorder, load_run
from trustlens.divergence import topk_buckets, topk_mass
from trustlens.record.logit_quantities import logit_quantities

V, K, TAU = 30, 4, 0.7


def _impls() -> list:
    """The CPU's chunked path (None), the logit pass's torch reference, and its Triton kernel
    under the interpreter where Triton imports."""
    return [
        None,
        "torch",
        pytest.param("triton", marks=pytest.mark.skipif(not kernels.triton_available(), reason="no triton")),
    ]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's inf − inf inside Triton's interpreter
@pytest.mark.parametrize("impl", _impls())
def test_hand_checked_row(monkeypatch, impl):
    """Raw logits (0, log 2, log 5): raw π = (1, 2, 5)/8; at τ = 0.5, π ∝ (1, 4, 25)/30. μ
    renormalised over the top-p set {2, 1}: μ = (4, 25)/29 there, Σ_S μ = 1, Σ_S π = 29/30."""
    if impl is not None:
        monkeypatch.setattr(kernels, "pass_impl", lambda device: impl)
    logits = torch.tensor([[[0.0, math.log(2.0), math.log(5.0)]]], dtype=torch.float64)  # (1, 1, 3)
    mask = torch.ones(1, 1, dtype=torch.bool)
    a_t = torch.tensor([[1]])
    mu_ids = torch.tensor([[[2, 1]]])
    mu_logp = torch.tensor([[[math.log(25 / 29), math.log(4 / 29)]]], dtype=torch.float64)
    got = logit_quantities(logits, mask, a_t, mu_ids, mu_logp, None, 0.5, want_entropy=False)
    tol = 1e-12 if impl is None else 1e-6  # the pass sums in float32
    assert got["pi_logp_raw"].item() == pytest.approx(math.log(2 / 8), abs=tol)
    assert got["mu_topk_mass"].item() == pytest.approx(1.0, abs=1e-12)  # μ's side is float64 in both
    assert got["pi_topk_mass"].item() == pytest.approx(29 / 30, abs=tol)
    log_mu, log_pi = topk_buckets(logits[0], mu_ids[0], mu_logp[0], temperature=0.5)  # (1, K + 1)
    assert topk_mass(log_pi).item() == pytest.approx(29 / 30, abs=tol)
    assert log_mu[0, -1].item() == -math.inf  # μ's rest bucket is empty


def batch(gen: torch.Generator, dtype=torch.float32) -> dict:
    """π's raw logits (B, T, V), a_t drawn from μ at τ, μ's top-K sets (from μ, a_t forced in)."""
    b, t = 3, 5
    raw = torch.randn(b, t, V, generator=gen, dtype=torch.float64) * 2
    raw[..., 3] = -math.inf  # a masked token
    log_mu = torch.log_softmax((raw + 0.1 * torch.randn(b, t, V, generator=gen, dtype=torch.float64)) / TAU, -1)
    ids = torch.multinomial(log_mu.exp().reshape(-1, V), 1, generator=gen).reshape(b, t)
    sets = log_mu.topk(K, -1).indices
    sets[..., -1] = torch.where((sets == ids[..., None]).any(-1), sets[..., -1], ids)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, 3:] = False
    return dict(
        token_ids=ids,
        response_mask=mask,
        pi_logp=torch.log_softmax(raw / TAU, -1).gather(-1, ids[..., None])[..., 0].float(),
        mu_logp=log_mu.gather(-1, ids[..., None])[..., 0].float(),
        advantages=torch.randn(b, generator=gen),
        logits=raw.to(dtype),
        mu_topk_ids=sets,
        mu_topk_logp=log_mu.gather(-1, sets).float(),
    )


def definitions(given: dict) -> dict[str, np.ndarray]:
    """The three columns at the valid positions, float64, from their definitions."""
    raw = given["logits"].double()
    ids, sets, mask = given["token_ids"], given["mu_topk_ids"], given["response_mask"]
    pi = torch.softmax(raw / TAU, -1)
    return {
        "pi_logp_raw": torch.log_softmax(raw, -1).gather(-1, ids[..., None])[..., 0][mask].numpy(),
        "mu_topk_mass": given["mu_topk_logp"].double().exp().sum(-1)[mask].numpy(),
        "pi_topk_mass": pi.gather(-1, sets).sum(-1)[mask].numpy(),
    }


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_columns_equal_their_float64_definitions(gen, dtype):
    given = batch(gen, dtype)
    if dtype == torch.bfloat16:  # the definitions read the logits as the pass does
        given["logits"] = given["logits"].to(dtype)
    want = definitions(given)
    got = logit_quantities(
        given["logits"],
        given["response_mask"],
        given["token_ids"],
        given["mu_topk_ids"],
        given["mu_topk_logp"],
        given["mu_logp"],
        TAU,
        want_entropy=True,
    )
    mask = given["response_mask"]
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    for name, expected in want.items():
        np.testing.assert_allclose(got[name][mask].double().numpy(), expected, rtol=0, atol=tol, err_msg=name)
        assert (got[name][~mask] == 0).all()


def test_without_temperature_or_top_k_the_columns_are_not_computed(gen):
    given = batch(gen)
    args = (given["logits"], given["response_mask"], given["token_ids"])
    at_one = logit_quantities(*args, given["mu_topk_ids"], given["mu_topk_logp"], None, 1.0, want_entropy=False)
    assert set(at_one) == {"topk_tv", "topk_kl", "mu_topk_mass", "pi_topk_mass"}  # τ = 1: raw = π
    no_topk = logit_quantities(*args, None, None, None, TAU, want_entropy=False)
    assert set(no_topk) == {"pi_logp_raw"}


def test_a_recorded_run_carries_them_and_null_without_logits(tmp_path, gen):
    given = batch(gen)
    want = definitions(given)
    with TokenRecorder(tmp_path / "run", rules=["dppo_binary_tv"]) as rec:
        rec.record(0, temperature=TAU, **given)
        plain = {k: v for k, v in given.items() if k not in ("logits", "mu_topk_ids", "mu_topk_logp")}
        rec.record(1, **plain)
    rows = load_run(tmp_path / "run").tokens.sort("step", "sample", "pos").collect()
    first, second = rows.filter(rows["step"] == 0), rows.filter(rows["step"] == 1)
    for name, expected in want.items():  # stored as float32
        np.testing.assert_allclose(first[name].to_numpy(), expected, rtol=0, atol=1e-6, err_msg=name)
        assert second[name].null_count() == len(second)

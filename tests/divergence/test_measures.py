import math
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.distributions import Categorical, kl_divergence

import trustlens.divergence as divergence
import trustlens.divergence.vocab_chunks as vocab_chunks
from trustlens.divergence import (
    binary_kl,
    binary_tv,
    entropy_from_logits,
    exact_divergence,
    topk_divergence,
    topk_divergence_from_logp,
    topk_from_logits,
)

FEW = settings(max_examples=25, deadline=None)


# ---- float64 definitions -------------------------------------------------------------------


def buckets64(pi_logits, ids, mu_logp, temperature=1.0):
    """Log-probabilities of μ and π over the buckets S ∪ {rest} (..., K+1) in float64, S = ids:
    μ from its recorded log-probs (μ_rest = 1 − Σ_S μ, clamped at 0; 0 when K = V), π from its
    logits (rest by logsumexp)."""
    log_pi = torch.log_softmax(pi_logits.double() / temperature, -1)
    pi_rest = log_pi.scatter(-1, ids, -math.inf).logsumexp(-1, keepdim=True)
    mu_s = mu_logp.double().exp()
    mu_rest = (1 - mu_s.sum(-1, keepdim=True)).clamp(min=0.0)
    if ids.shape[-1] == pi_logits.shape[-1]:  # S is the vocabulary: the rest bucket is empty
        mu_rest.zero_()
    return torch.cat([mu_s, mu_rest], -1).log(), torch.cat([log_pi.gather(-1, ids), pi_rest], -1)


def logp64(logits, token):
    """log softmax(logits)[token] (...) in float64 as −softplus(log Σ_{j≠token} e^{x_j − x_token}):
    exact also for π(token) = 1 − 1e-20, where a log-softmax rounds to 0."""
    x = logits.double()
    gap = x - x.gather(-1, token.unsqueeze(-1))
    others = gap.scatter(-1, token.unsqueeze(-1), -math.inf).logsumexp(-1)
    return -torch.nn.functional.softplus(others, threshold=50)


def tv_kl64(log_mu, log_pi):
    """TV and KL(μ ‖ π) from log-probabilities (..., B) via torch.distributions, in float64.
    (Given as logits: Categorical(probs=…) would clamp probabilities below 2e-16.)"""
    kl = kl_divergence(Categorical(logits=log_mu), Categorical(logits=log_pi))
    return 0.5 * (log_mu.exp() - log_pi.exp()).abs().sum(-1), kl


def binary_kl64(mu: float, pi: float) -> float:
    """KL(μ_bin ‖ π_bin) in float64 from the probabilities themselves."""
    return mu * math.log(mu / pi) + (1 - mu) * math.log((1 - mu) / (1 - pi))


def random_case(seed, lead, vocab, k, scale, noise, temperature):
    """π logits, μ logits near them, and μ's top-K record with a sampled token forced in."""
    gen = torch.Generator().manual_seed(seed)
    pi = torch.randn(*lead, vocab, generator=gen) * scale
    mu = pi + torch.randn(*lead, vocab, generator=gen) * noise
    probs = torch.softmax(mu.reshape(-1, vocab) / temperature, -1)
    sampled = torch.multinomial(probs, 1, generator=gen).reshape(lead)
    ids, logp = topk_from_logits(mu, sampled, k, temperature)
    return pi, mu, sampled, ids, logp


cases = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**31),
        "lead": st.lists(st.integers(1, 4), min_size=0, max_size=3),
        "vocab": st.integers(2, 70),
        "k_frac": st.floats(0.0, 1.0),
        "scale": st.sampled_from([0.1, 1.0, 4.0, 20.0]),
        "noise": st.sampled_from([0.0, 0.01, 0.5, 3.0]),
        "temperature": st.sampled_from([0.6, 1.0, 1.5]),
    }
)


def build(case):
    k = max(1, round(case["k_frac"] * case["vocab"]))
    args = {key: case[key] for key in ("seed", "lead", "vocab", "scale", "noise", "temperature")}
    return random_case(k=k, **args)


# ---- top-K ---------------------------------------------------------------------------------


@FEW
@given(cases)
def test_topk_matches_float64_and_lies_between_binary_and_exact(case):
    pi, mu, sampled, ids, logp = build(case)
    tau = case["temperature"]
    tv, kl = topk_divergence(pi, ids, logp, temperature=tau)
    tv64, kl64 = tv_kl64(*buckets64(pi, ids, logp, tau))  # torch.distributions, float64
    assert tv.dtype == kl.dtype == torch.float32 and tv.shape == pi.shape[:-1]
    torch.testing.assert_close(tv.double(), tv64, atol=2e-6, rtol=1e-4)
    torch.testing.assert_close(kl.double(), kl64, atol=2e-6, rtol=1e-4)

    etv, ekl = exact_divergence(pi, mu, temperature=tau)
    pi_logp, mu_logp = logp64(pi / tau, sampled), logp64(mu / tau, sampled)
    btv, bkl = binary_tv(pi_logp, mu_logp), binary_kl(pi_logp, mu_logp)
    for t in (tv, etv, btv):
        assert bool(((t >= 0) & (t <= 1)).all())
    for k in (kl, ekl, bkl):
        assert bool((k >= 0).all())
    tol = 1e-5
    assert bool((btv <= tv + tol).all()) and bool((tv <= etv + tol).all())
    assert bool((bkl <= kl + tol * (1 + kl)).all()) and bool((kl <= ekl + tol * (1 + ekl)).all())


@FEW
@given(cases)
def test_zero_when_pi_equals_mu(case):
    pi, _, sampled, _, _ = build(case)
    ids, logp = topk_from_logits(pi, sampled, max(1, pi.shape[-1] // 3))
    tv, kl = topk_divergence(pi, ids, logp)
    etv, ekl = exact_divergence(pi, pi.clone())
    assert bool((etv == 0).all()) and bool((ekl == 0).all())
    # μ_rest = 1 − Σ_S μ inherits the float32 rounding of μ's recorded log-probs (~K·1e-7).
    assert bool((tv <= 1e-6).all()) and bool((kl <= 1e-5).all())


def test_topk_equals_exact_when_k_is_the_vocabulary(gen):
    pi, mu = torch.randn(5, 9, generator=gen) * 3, torch.randn(5, 9, generator=gen) * 3
    ids, logp = topk_from_logits(mu, torch.zeros(5, dtype=torch.long), 9)
    tv, kl = topk_divergence(pi, ids, logp)
    etv, ekl = exact_divergence(pi, mu)
    torch.testing.assert_close(tv, etv, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(kl, ekl, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "rest_offset",
    [-30.0, -60.0, -120.0, 40.0],  # π's rest bucket tiny, tiny, below float32 exp range; huge
)
def test_topk_rest_bucket_at_the_extremes(rest_offset, gen):
    """π's mass on S close to 1 (rest ≈ e^-30 … e^-120, where 1 − Σ_S would be 0 in float32)
    and far from it; μ keeps 1e-3 in its rest bucket so the rest term dominates the KL."""
    V, K = 1000, 8
    pi = torch.randn(4, V, generator=gen)
    ids = torch.stack([torch.randperm(V, generator=gen)[:K] for _ in range(4)])
    pi = pi + rest_offset
    pi.scatter_(-1, ids, torch.randn(4, K, generator=gen))
    mu_s = torch.softmax(torch.randn(4, K, generator=gen).double(), -1) * (1 - 1e-3)
    mu_logp = mu_s.log().float()
    tv, kl = topk_divergence(pi, ids, mu_logp)
    tv64, kl64 = tv_kl64(*buckets64(pi, ids, mu_logp))
    torch.testing.assert_close(kl.double(), kl64, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(tv.double(), tv64, atol=1e-6, rtol=1e-5)


def test_topk_large_logits_and_pi_far_from_mu():
    """Logits spread over ±500 (probabilities far below float32's range) match float64."""
    pi, _, _, ids, logp = random_case(1, (3, 5), 300, 12, 200.0, 200.0, 1.0)
    tv, kl = topk_divergence(pi, ids, logp)
    tv64, kl64 = tv_kl64(*buckets64(pi, ids, logp))
    torch.testing.assert_close(kl.double(), kl64, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(tv.double(), tv64, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("offset", [0.0, 1000.0, -1000.0, 45.0, -25.0])
@pytest.mark.parametrize("outlier", [None, 95.0, 300.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_topk_every_exp_shift_path(offset, outlier, temperature, gen):
    """Logits far from 0 (the exps need a shift), and a logit outside S far above those in S
    (an unshifted exp overflows and the row is redone exactly): all match float64."""
    pi, _, _, ids, logp = random_case(8, (4,), 200, 10, 3.0, 1.0, temperature)
    pi = pi + offset
    if outlier is not None:
        free = next(v for v in range(200) if v not in ids[0].tolist())
        pi[0, free] = offset + outlier
    tv, kl = topk_divergence(pi.double(), ids, logp, temperature=temperature)
    tv32, kl32 = topk_divergence(pi, ids, logp, temperature=temperature)
    tv64, kl64 = tv_kl64(*buckets64(pi.double(), ids, logp, temperature))
    torch.testing.assert_close(tv, tv64, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(kl, kl64, atol=1e-9, rtol=1e-9)
    tv64, kl64 = tv_kl64(*buckets64(pi, ids, logp, temperature))  # the float32 logits
    torch.testing.assert_close(tv32.double(), tv64, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(kl32.double(), kl64, atol=1e-6, rtol=1e-5)


def test_topk_masked_logits_of_pi(gen):
    """A −inf logit is a token of probability 0: inside S it makes the KL infinite, outside it
    is simply absent."""
    pi = torch.randn(2, 10, generator=gen)
    ids = torch.tensor([[0, 1, 2], [0, 1, 2]])
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.1], [0.5, 0.2, 0.1]]))
    masked = pi.clone()
    masked[0, 1] = -math.inf  # in S
    masked[1, 7] = -math.inf  # in the rest bucket
    tv, kl = topk_divergence(masked, ids, logp)
    assert math.isinf(float(kl[0]))
    p1 = torch.softmax(masked[1].double(), -1)
    pi_b = torch.cat([p1[:3], p1[3:].sum(0, True)])
    tv64, kl64 = tv_kl64(torch.tensor([0.5, 0.2, 0.1, 0.2], dtype=torch.float64).log(), pi_b.log())
    assert float(tv[1]) == pytest.approx(float(tv64), rel=1e-5)
    assert float(kl[1]) == pytest.approx(float(kl64), rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_topk_half_precision_inputs_accumulate_in_float32(dtype, gen):
    pi, _, _, ids, logp = random_case(3, (6, 7), 500, 20, 3.0, 0.5, 1.0)
    pi_h, logp_h = pi.to(dtype), logp.to(dtype)
    tv, kl = topk_divergence(pi_h, ids, logp_h)
    assert tv.dtype == kl.dtype == torch.float32
    tv64, kl64 = tv_kl64(*buckets64(pi_h, ids, logp_h))  # the same rounded numbers, in float64
    torch.testing.assert_close(tv.double(), tv64, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(kl.double(), kl64, atol=1e-6, rtol=1e-4)


def test_float64_inputs_give_float64_results():
    pi, _, _, ids, logp = random_case(4, (3,), 50, 5, 2.0, 1.0, 1.0)
    tv, kl = topk_divergence(pi.double(), ids, logp.double())
    assert tv.dtype == kl.dtype == torch.float64
    tv64, kl64 = tv_kl64(*buckets64(pi, ids, logp))
    torch.testing.assert_close(tv, tv64, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(kl, kl64, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("lead", [(), (7,), (2, 3), (2, 1, 3, 2)])
def test_any_leading_dims(lead):
    pi, mu, _, ids, logp = random_case(5, lead, 40, 6, 2.0, 1.0, 1.0)
    tv, kl = topk_divergence(pi, ids, logp)
    etv, ekl = exact_divergence(pi, mu)
    assert tv.shape == kl.shape == etv.shape == ekl.shape == torch.Size(lead)
    flat = topk_divergence(pi.reshape(-1, 40), ids.reshape(-1, 6), logp.reshape(-1, 6))
    torch.testing.assert_close(tv.reshape(-1), flat[0])
    torch.testing.assert_close(kl.reshape(-1), flat[1])


def test_non_contiguous_logits_are_read_in_place(monkeypatch):
    """Sliced and transposed logits (whose rows cannot be flattened without a copy) give the
    same numbers as their contiguous copies, also when a chunk holds a single row."""
    monkeypatch.setattr(vocab_chunks, "CHUNK_ELEMENTS", 1)
    pi, mu, _, ids, logp = random_case(6, (3, 5), 30, 4, 2.0, 1.0, 1.0)
    for view in (lambda t: t[:, :-1], lambda t: t.transpose(0, 1)):
        expected = topk_divergence(view(pi).contiguous(), view(ids), view(logp))
        torch.testing.assert_close(topk_divergence(view(pi), view(ids), view(logp)), expected)
        exact = exact_divergence(view(pi).contiguous(), view(mu).contiguous())
        torch.testing.assert_close(exact_divergence(view(pi), view(mu)), exact)


def test_chunks_are_bounded(monkeypatch):
    """Every chunk of rows holds at most max(V, CHUNK_ELEMENTS) elements, and all rows are seen."""
    seen = []
    real = vocab_chunks.row_chunks

    def spy(*tensors):
        for first, chunk in real(*tensors):
            seen.append((first, chunk[0].shape))
            yield first, chunk

    pi, mu, _, ids, logp = random_case(7, (40, 3), 300, 10, 2.0, 1.0, 1.0)
    monkeypatch.setattr(vocab_chunks, "CHUNK_ELEMENTS", 1000)
    monkeypatch.setattr(vocab_chunks, "row_chunks", spy)
    topk_divergence(pi, ids, logp)
    exact_divergence(pi, mu)
    assert seen and all(shape[0] * shape[1] <= 1000 for _, shape in seen)
    rows = sorted(first + shape[0] for first, shape in seen)
    assert rows[-1] == 120 and len(seen) == 2 * 40  # 3 rows per chunk, twice over 120 rows


PEAK_RSS = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux peak-RSS reset")


@PEAK_RSS
@pytest.mark.parametrize("kernel", ["eager", pytest.param("compiled", marks=pytest.mark.slow)])
def test_extra_memory_is_bounded(monkeypatch, kernel):
    """On (256, 65536) float32 logits a full log-softmax copy is 64 MiB: the reference form needs
    it, topk_divergence and exact_divergence stay at a few 1 MiB chunks. Measured by the
    benchmark's probe (peak RSS growth); allocations this large are always fresh mappings.
    These inputs are large enough for topk_divergence's compiled kernel: "eager" runs the chunk
    loop (TRUSTLENS_NO_COMPILE=1), "compiled" the kernel (slow: it compiles it, tens of seconds
    on a loaded machine; CI runs it)."""
    if kernel == "eager":
        monkeypatch.setenv("TRUSTLENS_NO_COMPILE", "1")
    bench = load("divergence")
    copy = 256 * 65536 * 4 / 2**20
    topk_inputs = bench.make_inputs(256, 65536, 20, torch.float32, exact=False)
    assert bench.peak_extra_mib(bench.topk_reference, *topk_inputs) >= 0.9 * copy  # sees a copy
    assert bench.peak_extra_mib(topk_divergence, *topk_inputs) <= copy / 8
    del topk_inputs
    exact_inputs = bench.make_inputs(256, 65536, 20, torch.float32, exact=True)
    assert bench.peak_extra_mib(exact_divergence, *exact_inputs) <= copy / 8


# ---- topk_from_logits --------------------------------------------------------------------


def test_topk_from_logits_forces_the_sampled_token():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    ids, logp = topk_from_logits(logits, torch.tensor([1, 0]), 3, temperature=2.0)
    assert ids.tolist() == [[0, 1, 2], [4, 3, 0]]  # row 0 keeps its top 3, row 1 forces id 0 in
    expected = torch.log_softmax(logits.double() / 2.0, -1).gather(-1, ids)
    torch.testing.assert_close(logp.double(), expected, atol=1e-7, rtol=1e-6)
    assert ids.dtype == torch.long and logp.dtype == torch.float32


def test_topk_from_logits_keeps_probabilities_near_one():
    """π = 1 − 2e^-30: a float32 log-softmax says log π = 0, the record keeps −1.87e-13."""
    _, logp = topk_from_logits(torch.tensor([[30.0, 0.0, 0.0]]), torch.tensor([0]), 1)
    assert float(logp[0, 0]) == pytest.approx(-math.log1p(2 * math.exp(-30)), rel=1e-6)


@FEW
@given(cases)
def test_topk_from_logits_records_the_top_k(case):
    _, mu, sampled, ids, logp = build(case)
    k = ids.shape[-1]
    assert bool((ids == sampled.unsqueeze(-1)).any(-1).all())
    expected = torch.log_softmax(mu.double() / case["temperature"], -1)
    torch.testing.assert_close(logp.double(), expected.gather(-1, ids), atol=1e-6, rtol=1e-5)
    top = expected.topk(k, -1).values
    # The first k-1 entries are the top k-1 (up to ties), the k-th is the top k-th or the sample.
    torch.testing.assert_close(logp[..., : k - 1].double(), top[..., : k - 1], atol=1e-6, rtol=1e-5)


# ---- binary forms at the extremes of issue 2 --------------------------------------------------


@pytest.mark.parametrize(
    "mu, pi",
    [
        (0.999999, 0.99),
        (1e-9, 1e-7),
        (0.5, 1 - 1e-7),  # π → 1
        (1 - 1e-6, 1 - 1e-7),
        (0.9, 1 - 1e-12),
        (1e-30, 0.5),
    ],
)
def test_binary_extremes_within_1e3_of_float64(mu, pi):
    pi_logp, mu_logp = torch.tensor([math.log(pi)]), torch.tensor([math.log(mu)])
    assert float(binary_kl(pi_logp, mu_logp)) == pytest.approx(binary_kl64(mu, pi), rel=1e-3)
    assert float(binary_tv(pi_logp, mu_logp)) == pytest.approx(abs(pi - mu), rel=1e-3)


def test_binary_tv_no_overflow_for_tiny_mu():
    """μ below float32's exp range and π ≫ μ: |π − μ| = π, not inf."""
    tv = binary_tv(torch.tensor([math.log(0.25)]), torch.tensor([-200.0]))
    assert float(tv) == pytest.approx(0.25, rel=1e-6)


def test_binary_agrees_with_topk_of_one_bucket(gen):
    """With K = 1 and S = {a_t}, top-K is the binary form."""
    pi, mu = torch.randn(6, 20, generator=gen) * 2, torch.randn(6, 20, generator=gen) * 2
    sampled = torch.arange(6)
    ids, logp = topk_from_logits(mu, sampled, 1)
    tv, kl = topk_divergence(pi, ids, logp)
    pi_logp = torch.log_softmax(pi, -1).gather(-1, ids).squeeze(-1)
    torch.testing.assert_close(tv, binary_tv(pi_logp, logp.squeeze(-1)), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(kl, binary_kl(pi_logp, logp.squeeze(-1)), atol=1e-6, rtol=1e-5)


# ---- exact ---------------------------------------------------------------------------------


@FEW
@given(cases)
def test_exact_matches_torch_distributions(case):
    pi, mu, _, _, _ = build(case)
    tau = case["temperature"]
    tv, kl = exact_divergence(pi, mu, temperature=tau)
    p, q = Categorical(logits=mu.double() / tau), Categorical(logits=pi.double() / tau)
    torch.testing.assert_close(kl.double(), kl_divergence(p, q), atol=2e-6, rtol=1e-4)
    tv64 = 0.5 * (p.probs - q.probs).abs().sum(-1)
    torch.testing.assert_close(tv.double(), tv64, atol=2e-6, rtol=1e-4)


def test_exact_masked_logits(gen):
    """μ = 0 where μ's logit is −inf (no KL term, also when π = 0 there too); π = 0 < μ → inf."""
    pi, mu = torch.randn(3, 6, generator=gen), torch.randn(3, 6, generator=gen)
    mu[0, 2] = -math.inf
    mu[1, 3] = pi[1, 3] = -math.inf
    pi[2, 4] = -math.inf
    tv, kl = exact_divergence(pi, mu)
    for row in (0, 1):
        m, p = torch.softmax(mu[row].double(), -1), torch.softmax(pi[row].double(), -1)
        terms = torch.where(m > 0, m * (m.log() - p.log()), torch.zeros_like(m))
        assert float(kl[row]) == pytest.approx(float(terms.sum()), rel=1e-5)
        assert float(tv[row]) == pytest.approx(float(0.5 * (m - p).abs().sum()), rel=1e-5)
    assert math.isinf(float(kl[2]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_exact_half_precision(dtype, gen):
    pi = (torch.randn(4, 3, 100, generator=gen) * 3).to(dtype)
    mu = (torch.randn(4, 3, 100, generator=gen) * 3).to(dtype)
    tv, kl = exact_divergence(pi, mu)
    assert tv.dtype == torch.float32
    p, q = Categorical(logits=mu.double()), Categorical(logits=pi.double())
    torch.testing.assert_close(kl.double(), kl_divergence(p, q), atol=1e-6, rtol=1e-5)


# ---- entropy -------------------------------------------------------------------------------


@FEW
@given(cases)
def test_entropy_matches_torch_distributions(case):
    pi, _, _, _, _ = build(case)
    tau = case["temperature"]
    h = entropy_from_logits(pi, temperature=tau)
    assert h.shape == pi.shape[:-1] and h.dtype == torch.float32
    torch.testing.assert_close(h.double(), Categorical(logits=pi.double() / tau).entropy(), atol=2e-6, rtol=1e-5)


def test_entropy_closed_forms():
    """Uniform over V: log V; one-hot (the rest −inf): 0; float64 in, float64 out."""
    uniform = torch.zeros(2, 7, dtype=torch.float64)
    assert entropy_from_logits(uniform).tolist() == pytest.approx([math.log(7)] * 2, abs=1e-15)
    one_hot = torch.full((3, 5), -math.inf, dtype=torch.float64)
    one_hot[torch.arange(3), torch.tensor([0, 2, 4])] = 1.0
    assert entropy_from_logits(one_hot).tolist() == [0.0, 0.0, 0.0]


def test_entropy_masked_tokens_add_nothing(gen):
    """A −inf logit is a token of probability 0: the entropy is that of the other tokens."""
    logits = torch.randn(4, 9, generator=gen, dtype=torch.float64)
    logits[1, 3] = logits[2, :5] = -math.inf
    expected = [float(Categorical(logits=row[torch.isfinite(row)]).entropy()) for row in logits]
    assert entropy_from_logits(logits).tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_entropy_half_precision(dtype, gen):
    logits = (torch.randn(3, 5, 300, generator=gen) * 3).to(dtype)
    h = entropy_from_logits(logits)
    assert h.dtype == torch.float32
    torch.testing.assert_close(h.double(), Categorical(logits=logits.double()).entropy(), atol=1e-6, rtol=1e-5)


def test_entropy_over_many_chunks(monkeypatch, gen):
    """Chunks of 2 rows (a last partial one), non-contiguous input: the same as one pass."""
    monkeypatch.setattr(divergence, "ENTROPY_CHUNK_ELEMENTS", 2 * 50)
    logits = torch.randn(7, 5, 50, generator=gen)[:, ::2]
    torch.testing.assert_close(
        entropy_from_logits(logits).double(), Categorical(logits=logits.double()).entropy(), atol=2e-6, rtol=1e-5
    )


@pytest.mark.parametrize(
    ("value", "message"), [(math.nan, "NaN"), (math.inf, "inf"), (-math.inf, "a row of only -inf")]
)
def test_entropy_bad_logits_name_the_index(value, message):
    logits = torch.zeros(2, 3, 4)
    if value == -math.inf:
        logits[1, 2] = value
    else:
        logits[1, 2, 3] = value
    with pytest.raises(ValueError, match=rf"logits contains {message}.*\(1, 2, \d\)"):
        entropy_from_logits(logits)


# ---- bad input -----------------------------------------------------------------------------


def _good():
    pi = torch.randn(2, 3, 10)
    ids = torch.arange(4).expand(2, 3, 4).clone()
    logp = torch.full((2, 3, 4), math.log(0.2))
    return pi, ids, logp


def _with(t, index, value):
    t = t.clone()
    t[index] = value
    return t


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda pi, ids, lp: (pi, ids, lp[..., :3]),
            r"mu_topk_ids \(2, 3, 4\), mu_topk_logp \(2, 3, 3\)",
        ),
        (
            lambda pi, ids, lp: (pi[:1], ids, lp),
            r"mu_topk_ids has shape \(2, 3, 4\); expected \(1, 3, 'K'\)",
        ),
        (
            lambda pi, ids, lp: (_with(pi, (1, 2, 7), math.nan), ids, lp),
            r"pi_logits contains NaN .*index \(1, 2, 7\)",
        ),
        (
            lambda pi, ids, lp: (_with(pi, (0, 1, 3), math.inf), ids, lp),
            r"pi_logits contains inf .*index \(0, 1, 3\)",
        ),
        (
            lambda pi, ids, lp: (_with(pi, (1, 0), -math.inf), ids, lp),
            r"pi_logits contains a row of only -inf .*\(1, 0, 0\)",
        ),
        (
            lambda pi, ids, lp: (pi, ids, _with(lp, (0, 2, 1), math.nan)),
            r"mu_topk_logp contains NaN .*\(0, 2, 1\)",
        ),
        (
            lambda pi, ids, lp: (pi, ids, _with(lp, (0, 0, 0), 0.5)),
            r"mu_topk_logp holds positive .*\(0, 0, 0\)",
        ),
        (
            lambda pi, ids, lp: (pi, ids, _with(lp, (1, 1), -0.05)),
            r"mu_topk_logp at index \(1, 1\) gives a top-K mass",
        ),
        (
            lambda pi, ids, lp: (pi, _with(ids, (1, 2, 3), 0), lp),
            r"mu_topk_ids repeats id 0 in the set at index \(1, 2\)",
        ),
        (
            lambda pi, ids, lp: (pi, _with(ids, (0, 1, 2), 10), lp),
            r"mu_topk_ids holds id 10 at index \(0, 1, 2\), outside .*\[0, 10\)",
        ),
        (lambda pi, ids, lp: (pi, _with(ids, (0, 0, 0), -1), lp), r"mu_topk_ids holds id -1"),
        (lambda pi, ids, lp: (pi, ids.float(), lp), r"mu_topk_ids must be an integer tensor"),
        (
            lambda pi, ids, lp: (pi[..., :3], ids, lp),
            r"K = 4 ids per position, more than the vocabulary of pi_logits \(V = 3\)",
        ),
        (lambda pi, ids, lp: (pi, ids[..., :0], lp[..., :0]), r"K = 0"),
        (lambda pi, ids, lp: (pi.long(), ids, lp), r"pi_logits must be a floating-point tensor"),
        (lambda pi, ids, lp: (pi.tolist(), ids, lp), r"pi_logits must be a torch.Tensor"),
        (
            lambda pi, ids, lp: (pi[..., :0], ids, lp),
            r"pi_logits must have shape \(\.\.\., V\) with V ≥ 1",
        ),
    ],
)
def test_topk_divergence_bad_input(change, message, monkeypatch):
    monkeypatch.setattr(vocab_chunks, "CHUNK_ELEMENTS", 10)  # one row per chunk: indices map back
    with pytest.raises(ValueError, match=message):
        topk_divergence(*change(*_good()))


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan, math.inf, "1"])
def test_bad_temperature(temperature):
    with pytest.raises(ValueError, match="temperature must be"):
        topk_divergence(*_good(), temperature=temperature)
    with pytest.raises(ValueError, match="temperature must be"):
        topk_from_logits(torch.randn(3, 5), torch.zeros(3, dtype=torch.long), 2, temperature)


def test_exact_divergence_bad_input():
    pi, mu = torch.randn(2, 5), torch.randn(2, 5)
    with pytest.raises(ValueError, match=r"pi_logits \(2, 5\), mu_logits \(2, 4\)"):
        exact_divergence(pi, mu[:, :4])
    with pytest.raises(ValueError, match=r"mu_logits contains NaN .*index \(1, 3\)"):
        exact_divergence(pi, _with(mu, (1, 3), math.nan))
    with pytest.raises(ValueError, match=r"pi_logits contains inf .*index \(0, 0\)"):
        exact_divergence(_with(pi, (0, 0), math.inf), mu)


def test_topk_from_logits_bad_input():
    logits, sampled = torch.randn(3, 5), torch.tensor([0, 4, 2])
    for k in (0, 6, 2.0, True):
        with pytest.raises(ValueError, match=r"k must be an int in \[1, V = 5\]"):
            topk_from_logits(logits, sampled, k)
    with pytest.raises(ValueError, match=r"sampled_ids has shape \(2,\); expected \(3,\)"):
        topk_from_logits(logits, sampled[:2], 2)
    with pytest.raises(ValueError, match=r"sampled_ids holds id 5 at index \(1,\)"):
        topk_from_logits(logits, torch.tensor([0, 5, 1]), 2)
    with pytest.raises(ValueError, match=r"logits contains NaN .*index \(2, 1\)"):
        topk_from_logits(_with(logits, (2, 1), math.nan), sampled, 2)


def test_binary_kl_reads_rounded_pi_one_as_half_epsilon():
    # log_softmax rounds log π to 0 for a near-certain token; μ just as certain must not give +inf.
    logits = torch.tensor([[30.0, 0.0, 0.0]])
    pi_logp = torch.log_softmax(logits, -1)[:, 0]
    assert float(pi_logp) == 0.0
    mu = 1 - 1e-7
    got = float(binary_kl(pi_logp, torch.tensor([math.log(mu)])))
    half_eps = torch.finfo(torch.float32).eps / 2
    want = mu * math.log(mu / (1 - half_eps)) + (1 - mu) * math.log((1 - mu) / half_eps)
    assert got == pytest.approx(want, rel=1e-3)
    assert got < 1e-5
    # In float64 the floor is float64's: an exact 0 still reads as a tiny 1 − π.
    got64 = float(
        binary_kl(torch.tensor([0.0], dtype=torch.float64), torch.tensor([math.log(0.5)], dtype=torch.float64))
    )
    eps64 = torch.finfo(torch.float64).eps / 2
    assert got64 == pytest.approx(0.5 * math.log(0.5) + 0.5 * math.log(0.5 / eps64), rel=1e-9)


@settings(max_examples=60, deadline=None)
@example(seed=3190, v=2, k=1, spread=4.5, sampled_rank=0)
@given(
    seed=st.integers(0, 2**31 - 1),
    v=st.integers(2, 40),
    k=st.integers(1, 8),
    spread=st.floats(0.1, 6.0),
    sampled_rank=st.integers(0, 39),
)
def test_topk_at_least_binary_with_the_sampled_token_forced_in(seed, v, k, spread, sampled_rank):
    # μ's top-K set may lack the sampled token (a rollout engine that records only its top-K);
    # forced in, the buckets {a_t, rest} coarsen S ∪ {rest}, so topk ≥ binary for TV and KL
    k = min(k, v)
    g = torch.Generator().manual_seed(seed)
    mu_logits = torch.randn(3, v, generator=g, dtype=torch.float64) * spread
    pi_logits = mu_logits + torch.randn(3, v, generator=g, dtype=torch.float64) * spread
    order = mu_logits.argsort(-1, descending=True)
    sampled = order[:, min(sampled_rank, v - 1)]  # (3,) any rank, often outside the top-K
    mu_logp_all, pi_logp_all = torch.log_softmax(mu_logits, -1), torch.log_softmax(pi_logits, -1)
    ids = order[:, :k]
    mu_logp = mu_logp_all.gather(-1, sampled[:, None])[:, 0]
    pi_logp = pi_logp_all.gather(-1, sampled[:, None])[:, 0]
    tv, kl = topk_divergence(pi_logits, ids, mu_logp_all.gather(-1, ids), sampled_ids=sampled, sampled_logp=mu_logp)
    # equal when S = {a_t} (k = 1): up to the rounding of two formulas, which reaches ~2e-9
    # relative where π(a_t) is within 1e-8 of 1 (1 − π then carries the log-softmax's rounding;
    # found by hypothesis: seed=3190, v=2, k=1, spread=4.5, sampled_rank=0)
    assert torch.all(tv >= binary_tv(pi_logp, mu_logp) * (1 - 1e-6) - 1e-12)
    assert torch.all(kl >= binary_kl(pi_logp, mu_logp) * (1 - 1e-6) - 1e-12)
    # the same as passing the forced set itself (what topk_from_logits records)
    forced_ids, forced_logp = topk_from_logits(mu_logits, sampled, k)
    tv2, kl2 = topk_divergence(pi_logits, forced_ids, forced_logp)
    assert torch.allclose(tv, tv2, rtol=1e-9, atol=1e-12) and torch.allclose(kl, kl2, rtol=1e-9, atol=1e-12)


def test_topk_set_without_the_sampled_token_needs_its_logp():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    ids, logp = torch.tensor([[0, 1]]), torch.log_softmax(logits, -1)[:, :2]
    with pytest.raises(ValueError, match=r"mu_topk_ids at index \(0,\) lacks the sampled token 3.*pass sampled_logp"):
        topk_divergence(logits, ids, logp, sampled_ids=torch.tensor([3]))
    # a set that holds it needs nothing more, and is unchanged
    same = topk_divergence(logits, ids, logp, sampled_ids=torch.tensor([1]))
    assert all(torch.equal(a, b) for a, b in zip(same, topk_divergence(logits, ids, logp), strict=True))


def test_infinite_kl_is_a_value():
    # π gives probability 0 (a −inf logit) to a token μ gave mass to: KL = +inf, TV finite
    pi_logits = torch.tensor([[0.0, -math.inf, 0.0]])
    mu_logp = torch.log(torch.tensor([[0.5, 0.25]]))
    tv, kl = topk_divergence(pi_logits, torch.tensor([[0, 1]]), mu_logp)
    assert kl.item() == math.inf and tv.item() == pytest.approx(0.5 * (0.0 + 0.25 + 0.25), abs=1e-6)
    # the binary forms: log π(a_t) = −inf is valid input
    pi, mu = torch.tensor([-math.inf, -1.0, -math.inf]), torch.tensor([-0.5, -math.inf, -math.inf])
    assert binary_kl(pi, mu).tolist() == [math.inf, pytest.approx(-math.log1p(-math.exp(-1.0))), 0.0]
    assert binary_tv(pi, mu).tolist() == [pytest.approx(math.exp(-0.5)), pytest.approx(math.exp(-1.0)), 0.0]


def test_topk_from_logp_equals_topk_from_logits(gen):
    # TRL's DPPOTrainer keeps π only on μ's top-K ids: the same buckets, π_rest from Σ_S π
    mu_logits = torch.randn(4, 7, 50, generator=gen, dtype=torch.float64) * 2
    pi_logits = mu_logits + torch.randn(4, 7, 50, generator=gen, dtype=torch.float64)
    sampled = torch.randint(0, 50, (4, 7), generator=gen)
    ids, mu_logp = topk_from_logits(mu_logits, sampled, 5)
    pi_logp = torch.log_softmax(pi_logits, -1).gather(-1, ids)
    tv, kl = topk_divergence_from_logp(pi_logp, mu_logp)
    tv_ref, kl_ref = topk_divergence(pi_logits, ids, mu_logp)
    assert tv.dtype == torch.float64 and tv.shape == (4, 7)
    assert torch.allclose(tv, tv_ref, rtol=1e-10, atol=1e-13) and torch.allclose(kl, kl_ref, rtol=1e-10, atol=1e-13)
    # float32 in, float32 out; π = 0 on an id μ gave mass to: KL +inf
    tv32, _ = topk_divergence_from_logp(pi_logp.float(), mu_logp.float())
    assert tv32.dtype == torch.float32 and torch.allclose(tv32.double(), tv_ref, atol=1e-5)
    pi_zero = pi_logp.clone()
    pi_zero[0, 0, 1] = -math.inf
    assert topk_divergence_from_logp(pi_zero, mu_logp)[1][0, 0].item() == math.inf
    with pytest.raises(ValueError, match=r"pi_topk_logp at index \(0, 0\) gives a top-K mass of .* > 1"):
        topk_divergence_from_logp(torch.full((1, 1, 3), -0.5), torch.full((1, 1, 3), -2.0))


def _flat_and_peaked(gen):
    """Rows of μ and π logits (64, 3000): flat ones (μ's rest ≥ ½, the compiled kernel's) and
    peaked ones (the eager loop's), with μ's top-20 record."""
    mu = torch.randn(64, 3000, generator=gen, dtype=torch.float64) * torch.tensor([0.5] * 32 + [8.0] * 32)[:, None]
    pi = mu + 0.3 * torch.randn(64, 3000, generator=gen, dtype=torch.float64)
    ids, logp = topk_from_logits(mu, torch.randint(0, 3000, (64,), generator=gen), 20)
    return pi, ids, logp


@pytest.mark.slow  # compiles the kernel: tens of seconds on a loaded machine
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_kernel_matches_float64(monkeypatch, gen, dtype):
    pi, ids, logp = _flat_and_peaked(gen)
    ref = topk_divergence(pi.to(dtype).double(), ids, logp)
    monkeypatch.setattr(vocab_chunks, "COMPILE_MIN_ELEMENTS", 0)
    calls = []
    fused = vocab_chunks._fused_exp_sum
    monkeypatch.setattr(vocab_chunks, "_fused_exp_sum", lambda *a: calls.append(a[0].shape) or fused(*a))
    tv, kl = topk_divergence(pi.to(dtype), ids, logp.float())
    assert calls == [], "mixed flat and peaked rows in one block take the eager loop"
    flat = slice(0, 32)
    tv_flat, kl_flat = topk_divergence(pi[flat].to(dtype), ids[flat], logp[flat].float())
    assert calls == [(32, 3000)]  # all flat: one compiled pass
    for got, want in ((tv, ref[0]), (kl, ref[1]), (tv_flat, ref[0][flat]), (kl_flat, ref[1][flat])):
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-7)


def test_without_compile_the_eager_loop_gives_the_same(monkeypatch, gen):
    pi, ids, logp = _flat_and_peaked(gen)
    flat = slice(0, 32)
    eager = topk_divergence(pi[flat].float(), ids[flat], logp[flat].float())
    monkeypatch.setattr(vocab_chunks, "COMPILE_MIN_ELEMENTS", 0)
    monkeypatch.setenv("TRUSTLENS_NO_COMPILE", "1")
    assert all(
        torch.equal(a, b)
        for a, b in zip(topk_divergence(pi[flat].float(), ids[flat], logp[flat].float()), eager, strict=True)
    )
    # torch.compile failing (no compiler) warns once and falls back
    monkeypatch.delenv("TRUSTLENS_NO_COMPILE")
    monkeypatch.setattr(vocab_chunks, "_compiled", {})

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch, "compile", broken)
    with pytest.warns(UserWarning, match="torch.compile unavailable .no C\\+\\+ compiler."):
        out = topk_divergence(pi[flat].float(), ids[flat], logp[flat].float())
    assert all(torch.equal(a, b) for a, b in zip(out, eager, strict=True))
    assert vocab_chunks._compiled == {"exp_sum": None}

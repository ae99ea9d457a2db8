"""The exact pass (trustlens.divergence.kernels.exact_pass) on the CPU: the Triton kernel under
Triton's interpreter and its torch reference, against float64 definitions of exact TV and
KL(μ ‖ π); bad rows; the dispatch of exact_divergence; the op inside a compiled graph."""

import math

import pytest
import torch

import trustlens.divergence.kernels as kernels
from trustlens.divergence import exact_divergence

pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's inf − inf inside the interpreter

IMPLS = ["triton", "torch"]
V = 4100  # three blocks of the kernel, the last one 4 wide


def oracle(pi, mu, temperature):
    """(TV, KL(μ ‖ π)) per row in float64, from the definitions."""
    log_pi = torch.log_softmax(pi.double() / temperature, -1)
    log_mu = torch.log_softmax(mu.double() / temperature, -1)
    tv = 0.5 * (log_mu.exp() - log_pi.exp()).abs().sum(-1)
    kl = torch.where(log_mu == -math.inf, 0.0, log_mu.exp() * (log_mu - log_pi)).sum(-1)
    return tv, kl


def make_pair(gen, rows, dtype=torch.float32):
    """π's and μ's logits (rows, V): masked tokens in both, tokens μ masks and π does not, a
    peaked token, and μ near π (a small KL) in row 0."""
    pi = torch.randn(rows, V, generator=gen) * 3
    mu = pi + torch.randn(rows, V, generator=gen) * 0.5
    mu[0] = pi[0] + torch.randn(V, generator=gen) * 1e-3
    pi[:, 7:40] = -math.inf
    mu[:, 7:40] = -math.inf
    mu[1:, 2000:2100] = -math.inf  # μ = 0 < π: adds nothing to the KL
    pi[:, 100] += 12
    return pi.to(dtype), mu.to(dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_pass_matches_float64(gen, impl, dtype):
    pi_base, mu_base = make_pair(gen, 12, dtype)
    pi = pi_base.reshape(3, 4, V)[:, :-1]  # (3, 3, V): rows not evenly spaced, read in place
    mu = mu_base.reshape(3, 4, V)[:, :-1].transpose(0, 1).contiguous().transpose(0, 1)  # strides of its own
    done = kernels.run_exact(pi, mu, 0.7, impl)
    tv, kl = oracle(pi.reshape(-1, V), mu.reshape(-1, V), 0.7)
    assert not done.bad.any()
    torch.testing.assert_close(done.tv, tv, rtol=0, atol=2e-6)
    torch.testing.assert_close(done.kl, kl, rtol=1e-5, atol=2e-6)
    assert float(kl[0]) < 1e-4  # the near-equal row: within 2e-6 of a KL this small


def offset_pair(offset, dtype=torch.float32):
    """π's logits (3, 5003) and μ's: π's plus small noise plus a constant `offset` (logits are
    shift-invariant; engines and trainers often differ by one), so the true KL is small."""
    g = torch.Generator().manual_seed(0)
    pi = torch.randn(3, 5003, generator=g) * 3
    mu = pi + torch.randn(3, 5003, generator=g) * 0.01 + offset
    return pi.to(dtype), mu.to(dtype)


OFFSETS = [(0.1, 10.0), (1.0, 100.0), (1.0, 1000.0), (0.1, 1e4), (0.7, 1e4), (1.0, -1e4), (0.05, 1000.0), (3.0, 1e4)]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("temperature", "offset"), OFFSETS)
def test_a_constant_offset_between_the_rows_costs_the_kl_no_digits(impl, temperature, offset):
    """KL within 1e-6 absolute or 1e-3 relative of float64 (true KLs of 8e-8 … 6e-4)."""
    pi, mu = offset_pair(offset)
    done = kernels.run_exact(pi, mu, temperature, impl)
    tv, kl = oracle(pi, mu, temperature)
    assert float(kl.min()) > 0
    assert ((done.kl - kl).abs() <= torch.maximum(torch.full_like(kl, 1e-6), 1e-3 * kl)).all()
    torch.testing.assert_close(done.tv, tv, rtol=0, atol=2e-6)


@pytest.mark.parametrize("impl", [*IMPLS, None])
@pytest.mark.parametrize(("temperature", "offset"), [(0.1, 10.0), (1.0, 1000.0), (0.7, 1e4), (0.1, 1e4)])
def test_exact_divergence_keeps_the_kl_of_offset_rows(monkeypatch, impl, temperature, offset):
    """exact_divergence through the pass (None: the CPU's chunked path, which also shifts each
    row by its max before scaling), bf16 and float32 logits, against float64."""
    monkeypatch.setattr(kernels, "pass_impl", lambda device: impl)
    for dtype in (torch.float32, torch.bfloat16):
        pi, mu = offset_pair(offset, dtype)
        tv, kl = exact_divergence(pi, mu, temperature=temperature)
        want_tv, want_kl = oracle(pi, mu, temperature)
        assert ((kl.double() - want_kl).abs() <= torch.maximum(torch.full_like(want_kl, 1e-6), 1e-3 * want_kl)).all()
        torch.testing.assert_close(tv.double(), want_tv, rtol=0, atol=2e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_token_pi_masks_and_mu_does_not_makes_the_kl_inf(gen, impl):
    pi, mu = make_pair(gen, 3)
    pi[1, 3000] = -math.inf  # μ > 0 = π there
    done = kernels.run_exact(pi, mu, 1.0, impl)
    tv, kl = oracle(pi, mu, 1.0)
    assert done.kl[1] == math.inf and kl[1] == math.inf
    torch.testing.assert_close(done.kl[[0, 2]], kl[[0, 2]], rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(done.tv, tv, rtol=0, atol=2e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_identical_rows_give_zero(gen, impl):
    pi, _ = make_pair(gen, 2)
    done = kernels.run_exact(pi, pi.clone(), 1.3, impl)
    assert float(done.tv.abs().max()) < 1e-6 and float(done.kl.abs().max()) < 1e-6


@pytest.mark.parametrize("impl", IMPLS)
def test_skipped_rows_hold_zero(gen, impl):
    pi, mu = make_pair(gen, 3)
    pi_start, mu_start = kernels.row_starts(pi), kernels.row_starts(mu)
    pi_start[1] = mu_start[1] = -1
    run = kernels.exact_pass_op if impl == "triton" else kernels.exact_pass_torch
    done = kernels.finish_exact(run(pi, mu, pi_start, mu_start, 1.0), pi_start >= 0)
    tv, kl = oracle(pi, mu, 1.0)
    torch.testing.assert_close(done.kl[[0, 2]], kl[[0, 2]], rtol=1e-5, atol=2e-6)
    assert done.tv[1] == 0 and done.kl[1] == 0 and not done.bad.any()
    torch.testing.assert_close(done.tv[[0, 2]], tv[[0, 2]], rtol=0, atol=2e-6)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("which", ["pi", "mu"])
@pytest.mark.parametrize(
    ("value", "message"),
    [(math.nan, "NaN"), (math.inf, "inf"), (-math.inf, "a row of only -inf")],
)
def test_bad_rows_raise_as_on_the_cpu(gen, monkeypatch, impl, which, value, message):
    pi, mu = (t.reshape(2, 3, V) for t in make_pair(gen, 6))
    bad = pi if which == "pi" else mu
    if value == -math.inf:
        bad[1, 2] = -math.inf
    else:
        bad[1, 2, 4099] = value
    with pytest.raises(ValueError, match=message) as cpu:
        exact_divergence(pi, mu)
    monkeypatch.setattr(kernels, "pass_impl", lambda device: impl)
    with pytest.raises(ValueError, match=message) as one_pass:
        exact_divergence(pi, mu)
    assert str(one_pass.value) == str(cpu.value)
    assert f"{which}_logits" in str(cpu.value)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_exact_divergence_dispatches_to_the_pass(gen, monkeypatch, impl, dtype):
    """Same dtypes and shapes as the CPU's results, and closer to float64: the pass's KL keeps
    ~1e-6 where the CPU's float32 log-softmax difference loses ~1e-5 on these rows."""
    pi, mu = (t.reshape(2, 3, V) for t in make_pair(gen, 6, dtype))
    cpu = exact_divergence(pi, mu, temperature=0.8)
    calls = []
    monkeypatch.setattr(kernels, "pass_impl", lambda device: calls.append(device) or impl)
    one_pass = exact_divergence(pi, mu, temperature=0.8)
    assert calls == [pi.device]
    exact = oracle(pi.reshape(-1, V), mu.reshape(-1, V), 0.8)
    for got, want, float64 in zip(one_pass, cpu, exact, strict=True):
        assert got.dtype == want.dtype and got.shape == (2, 3)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=3e-5)
        torch.testing.assert_close(got.double().reshape(-1), float64, rtol=1e-5, atol=2e-6)


def test_the_cpu_keeps_its_chunked_path(gen, monkeypatch):
    pi, mu = make_pair(gen, 2)

    def no_pass(*args, **kwargs):
        raise AssertionError("the exact pass ran on the CPU")

    monkeypatch.setattr(kernels, "run_exact", no_pass)
    tv, _ = exact_divergence(pi, mu)
    torch.testing.assert_close(tv.double(), oracle(pi, mu, 1.0)[0], rtol=0, atol=2e-6)


def test_the_op_keeps_a_compiled_graph_whole(gen):
    pi, mu = make_pair(gen, 4)
    pi_start, mu_start = kernels.row_starts(pi), kernels.row_starts(mu)

    def half_abs_diff(x, y):
        return 0.5 * kernels.exact_pass_op(x, y, pi_start, mu_start, 1.0)[5]

    compiled = torch.compile(half_abs_diff, fullgraph=True, backend="aot_eager")  # a graph break raises
    torch.testing.assert_close(compiled(pi, mu).double(), oracle(pi, mu, 1.0)[0], rtol=0, atol=2e-6)

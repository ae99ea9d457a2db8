"""The one-pass logit kernel (trustlens.divergence.kernels) on the CPU: the Triton kernel under
Triton's interpreter and its torch reference, against float64 definitions; the dispatch; and the
public functions and the recorder's quantities through the pass, against the CPU's chunked path."""

import math

import pytest
import torch

import trustlens.divergence.kernels as kernels
from trustlens.divergence import entropy_from_logits, topk_divergence, topk_from_logits
from trustlens.record.logit_quantities import logit_quantities

pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's inf − inf inside the interpreter

IMPLS = ["triton", "torch"]
V = 4100  # two blocks of the kernel, the second one 4 wide


def oracle(logits, ids, n_excluded, temperature):
    """Entropy, log π on ids, log π of the rest (outside the first n_excluded ids), float64."""
    logp = torch.log_softmax(logits.double() / temperature, -1)  # (N, V)
    entropy = -(logp.exp() * logp.clamp(min=torch.finfo(torch.float64).min)).sum(-1)
    rest = logp.scatter(-1, ids[:, :n_excluded], -math.inf).logsumexp(-1)
    return entropy, logp.gather(-1, ids), rest


def make_logits(gen, shape, dtype=torch.float32):
    x = torch.randn(*shape, V, generator=gen) * 3
    x[..., 7:40] = -math.inf  # masked tokens
    x[..., 100] += 12  # a peaked token: the rest mass is far below the top-K's
    return x.to(dtype)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pass_matches_float64(gen, impl, dtype):
    base = make_logits(gen, (3, 4), dtype)
    view = base[:, :-1]  # rows 0…2 of each batch, strided: read in place
    valid = torch.tensor([[True, True, False], [True, False, True], [True, True, True]])
    ids = torch.stack([torch.randperm(V, generator=gen)[:6] for _ in range(9)])
    ids[:, 0] = 100
    done = kernels.run_pass(view, kernels.row_starts(view, valid), ids, 5, 0.7, impl)
    flat, rows = view.reshape(-1, V), valid.reshape(-1)
    entropy, logp, rest = oracle(flat, ids, 5, 0.7)
    assert not done.bad.any()
    torch.testing.assert_close(done.entropy[rows], entropy[rows], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(done.logp_ids[rows], logp[rows], rtol=0, atol=2e-6)
    torch.testing.assert_close(done.log_rest[rows], rest[rows], rtol=0, atol=2e-5)  # log of a rest ≈ e^-12
    assert (done.entropy[~rows] == 0).all()
    assert done.raw_logp_ids is None  # not asked for


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_raw_logp_matches_float64(gen, impl, dtype):
    """log softmax(logits) on the ids, τ = 1, from the same pass that divides by τ = 0.6."""
    base = make_logits(gen, (3, 4), dtype)
    view = base[:, 1:]  # strided rows
    valid = torch.tensor([[True, False, True], [True, True, True], [False, True, True]])
    ids = torch.stack([torch.randperm(V, generator=gen)[:5] for _ in range(9)])
    ids[:, 1] = 100  # the peaked token, not excluded: log π_raw ≈ 0 there
    done = kernels.run_pass(view, kernels.row_starts(view, valid), ids, 3, 0.6, impl, raw=True)
    flat, rows = view.reshape(-1, V), valid.reshape(-1)
    want = torch.log_softmax(flat.double(), -1).gather(-1, ids)  # (9, 5) the definition, float64
    assert done.raw_logp_ids is not None
    torch.testing.assert_close(done.raw_logp_ids[rows], want[rows], rtol=1e-6, atol=2e-5)
    assert (done.raw_logp_ids[~rows] == 0).all()
    entropy, logp, _ = oracle(flat, ids, 3, 0.6)  # the other outputs are as without raw
    torch.testing.assert_close(done.logp_ids[rows], logp[rows], rtol=0, atol=2e-6)
    torch.testing.assert_close(done.entropy[rows], entropy[rows], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_raw_logp_hand_checked(impl):
    """Logits (0, log 3) over two tokens: raw π = (1/4, 3/4) whatever τ the pass divides by."""
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # (1, 1, 2)
    ids = torch.tensor([[0, 1]])
    done = kernels.run_pass(logits, kernels.row_starts(logits), ids, 0, 0.5, impl, raw=True)
    assert done.raw_logp_ids is not None
    torch.testing.assert_close(done.raw_logp_ids, torch.tensor([[math.log(0.25), math.log(0.75)]], dtype=torch.float64))
    # at τ = 0.5: π ∝ (1, 9)
    torch.testing.assert_close(done.logp_ids, torch.tensor([[math.log(0.1), math.log(0.9)]], dtype=torch.float64))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    ("value", "message"),
    [(math.nan, "NaN"), (math.inf, "inf"), (-math.inf, "a row of only -inf")],
)
def test_bad_rows_raise_as_on_the_cpu(gen, monkeypatch, impl, value, message):
    logits = make_logits(gen, (2, 3))
    if value == -math.inf:
        logits[1, 2] = -math.inf
    else:
        logits[1, 2, 4099] = value
    with pytest.raises(ValueError, match=message) as cpu:
        entropy_from_logits(logits)
    monkeypatch.setattr(kernels, "pass_impl", lambda device: impl)
    with pytest.raises(ValueError, match=message) as one_pass:
        entropy_from_logits(logits)
    assert str(one_pass.value) == str(cpu.value)


def raw_pass(impl, logits, ids, n_excluded, temperature):
    """The pass's five float32 tensors (M, sum_rest, usum_rest, x_ids, sum_raw) for every row."""
    run = kernels.logit_pass_op if impl == "triton" else kernels.logit_pass_torch
    return run(logits, kernels.row_starts(logits), ids, n_excluded, temperature, False)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("temperature", [0.7, 0.3, 1.3])
def test_the_scale_is_the_cpu_paths_multiplication_by_one_over_tau(gen, impl, temperature):
    """x on the ids is logits·(1/τ) rounded to float32 bit for bit, as torch.mul by 1/τ gives
    on the CPU's chunked paths (one rounding of one shared factor, not a division)."""
    logits = make_logits(gen, (4,))
    ids = torch.stack([torch.randperm(V, generator=gen)[:5] for _ in range(4)])
    x_ids = raw_pass(impl, logits, ids, 0, temperature)[3]
    assert torch.equal(x_ids, torch.mul(logits.gather(-1, ids), 1.0 / temperature))


@pytest.mark.parametrize("impl", IMPLS)
def test_an_id_outside_the_vocabulary_reads_nan_not_memory(gen, impl):
    """The documented precondition (ids in [0, V)) broken: the gather is masked, x is NaN."""
    logits = make_logits(gen, (2,))
    ids = torch.tensor([[3, V, 5], [-1, 4, V + 10_000_000]])
    x_ids = raw_pass(impl, logits, ids, 0, 1.0)[3]
    bad = torch.tensor([[False, True, False], [True, False, True]])
    assert x_ids[bad].isnan().all()
    assert torch.equal(x_ids[~bad], logits.gather(-1, ids.clamp(0, V - 1))[~bad])


@pytest.mark.parametrize("impl", IMPLS)
def test_excluded_ids_in_any_order_and_any_block(gen, impl):
    """Excluded ids unsorted, two in one block, one in the last (partial) block, one at 0:
    each is left out of the sums exactly once (the kernel walks them sorted, loading each once)."""
    logits = make_logits(gen, (3,))
    ids = torch.tensor([[4099, 5, 4097, 0, 2048, 100], [100, 4096, 3, 1, 2, 9], [7, 4098, 50, 4000, 3999, 12]])
    done = kernels.run_pass(logits, kernels.row_starts(logits), ids, 5, 0.8, impl)
    entropy, logp, rest = oracle(logits, ids, 5, 0.8)
    torch.testing.assert_close(done.logp_ids, logp, rtol=0, atol=2e-6)
    torch.testing.assert_close(done.log_rest, rest, rtol=0, atol=2e-5)
    torch.testing.assert_close(done.entropy, entropy, rtol=1e-5, atol=1e-6)


def test_dispatch(monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.delenv(kernels.KERNELS_ENV, raising=False)
    assert kernels.pass_impl(torch.device("cpu")) is None  # the CPU keeps its chunked passes
    assert kernels.pass_impl(cuda) == "triton"
    monkeypatch.setenv(kernels.KERNELS_ENV, "torch")
    assert kernels.pass_impl(cuda) == "torch"
    monkeypatch.delenv(kernels.KERNELS_ENV)
    monkeypatch.setattr(kernels, "triton_available", lambda: False)
    assert kernels.pass_impl(cuda) == "torch"


def test_row_starts_follow_the_strides():
    base = torch.zeros(3, 5, 7)
    view = base[:, 1:4]  # (3, 3, 7), rows not evenly spaced
    starts = kernels.row_starts(view)
    assert starts.dtype == torch.int64
    expected = [b * 35 + t * 7 for b in range(3) for t in range(3)]  # from view's first element (1 row in)
    assert starts.tolist() == expected
    picked = kernels.row_starts(view, rows=torch.tensor([4, 8]))
    assert picked.tolist() == [expected[4], expected[8]]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_public_functions_through_the_pass(gen, monkeypatch, impl, dtype):
    pi = make_logits(gen, (2, 3), dtype)
    mu = (pi.float() + torch.randn(2, 3, V, generator=gen)).to(dtype)
    sampled = torch.randint(0, V, (2, 3), generator=gen)
    sampled[0, 0] = 100
    mu_ids, mu_logp = topk_from_logits(mu, sampled, 5, temperature=0.8)
    mu_ids[1, 1] = torch.tensor([1, 2, 3, 4, 5])  # a set that lacks a_t: forced in from sampled_logp
    sampled_logp = torch.log_softmax(mu.double() / 0.8, -1).gather(-1, sampled[..., None])[..., 0].float()
    cpu = (
        entropy_from_logits(pi, temperature=0.8),
        *topk_divergence(pi, mu_ids, mu_logp, temperature=0.8, sampled_ids=sampled, sampled_logp=sampled_logp),
        *topk_from_logits(mu, sampled, 5, temperature=0.8),
    )
    monkeypatch.setattr(kernels, "pass_impl", lambda device: impl)
    one_pass = (
        entropy_from_logits(pi, temperature=0.8),
        *topk_divergence(pi, mu_ids, mu_logp, temperature=0.8, sampled_ids=sampled, sampled_logp=sampled_logp),
        *topk_from_logits(mu, sampled, 5, temperature=0.8),
    )
    for got, want in zip(one_pass, cpu, strict=True):
        if want.is_floating_point():
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(got, want)


@pytest.mark.parametrize("impl", IMPLS)
def test_record_quantities_through_the_pass(gen, monkeypatch, impl):
    logits = make_logits(gen, (3, 4))
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[0, 2:] = False
    ids = torch.randint(0, V, (3, 4), generator=gen)
    ids[0, 3] = -5  # padding may hold anything
    mu_logits = logits + torch.randn(3, 4, V, generator=gen)
    mu_ids, mu_topk = topk_from_logits(mu_logits, ids.clamp(min=0), 4)
    mu_ids[2, 1] = torch.tensor([1, 2, 3, 4])  # lacks a_t: forced in from mu_logp
    mu_logp = torch.log_softmax(mu_logits, -1).gather(-1, ids.clamp(min=0)[..., None])[..., 0]
    args = (logits, mask, ids, mu_ids, mu_topk, mu_logp, 1.3)
    cpu = logit_quantities(*args, want_entropy=True)
    monkeypatch.setattr(kernels, "pass_impl", lambda device: impl)
    one_pass = logit_quantities(*args, want_entropy=True)
    assert set(one_pass) == set(cpu) == {"entropy", "topk_tv", "topk_kl", "mu_topk_mass", "pi_topk_mass", "pi_logp_raw"}
    for name, want in cpu.items():
        torch.testing.assert_close(one_pass[name], want, rtol=1e-5, atol=1e-6, msg=name)
    logits[1, 3, 5] = math.nan  # a bad input: the chunked path runs again and names it
    with pytest.raises(ValueError, match=r"logits hold NaN or \+inf at \(b, t\) = \(1, 3\)"):
        logit_quantities(*args, want_entropy=True)


def test_the_op_keeps_a_compiled_graph_whole(gen):
    logits = make_logits(gen, (4,))
    starts = kernels.row_starts(logits)
    ids = torch.tensor([[100, 3]] * 4)

    def entropy(x):
        _, sum_rest, usum_rest, _, _ = kernels.logit_pass_op(x, starts, ids, 0, 1.0, False)
        return torch.log(sum_rest) - usum_rest / sum_rest

    compiled = torch.compile(entropy, fullgraph=True, backend="aot_eager")  # a graph break raises
    torch.testing.assert_close(compiled(logits), oracle(logits, ids, 0, 1.0)[0].float(), rtol=1e-5, atol=1e-6)

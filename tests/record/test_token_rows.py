import math

import numpy as np
import pytest
import torch

from trustlens.core import logspace
from trustlens.record.token_rows import (
    Buffers,
    TokenRows,
    check_token_range,
    check_values,
    derive_rows,
    snapshot_token_ids,
    snapshot_values,
)
from trustlens.rules import RULES
from trustlens.run import RejectedInputError

MASK = torch.tensor([[True, True, False], [True, False, False]])


def columns(**changes):
    """Valid (2, 3) inputs at MASK, with `changes` {name: {(b, t): value}} applied."""
    out = {
        "pi_logp": torch.tensor([[-0.1, -2.0, 0.0], [-0.5, 0.0, 0.0]]),
        "mu_logp": torch.tensor([[-0.2, -1.0, 0.0], [-0.4, 0.0, 0.0]]),
        "topk_kl": torch.tensor([[0.01, 0.2, 0.0], [0.0, 0.0, 0.0]]),
        "advantages": torch.tensor([[-1.0, -1.0, -1.0], [2.0, 2.0, 2.0]]),
    }
    for name, cells in changes.items():
        for index, value in cells.items():
            out[name][index] = value
    return out


def checked_values(given, mask):
    """The snapshot of `given`, checked as the writer thread checks it."""
    values = snapshot_values(given, mask)
    check_values(list(given), values, mask)
    return values


def test_values_are_one_copy_and_the_padding_may_hold_anything():
    given = columns(pi_logp={(0, 2): math.nan, (1, 1): math.inf}, advantages={(1, 2): -math.inf})
    given["topk_kl"][1, 1] = -3.0
    values = checked_values(given, MASK)
    assert values.shape == (4, 2, 3) and values.dtype == torch.float32
    for row, t in zip(values, given.values(), strict=True):
        assert torch.equal(row[MASK], t[MASK])
    given["pi_logp"][0, 0] = -9.0  # the copy does not alias the caller's tensors
    assert float(values[0, 0, 0]) == pytest.approx(-0.1)


def test_allowed_extremes_and_rounding_clamps():
    """−inf log-probabilities and +inf KL are values; log-probs up to +1e-4 and divergences down
    to −1e-4 are rounding, clamped to 0; float64 in, float64 out."""
    given = columns(pi_logp={(0, 1): -math.inf, (1, 0): 5e-5}, topk_kl={(0, 0): math.inf, (0, 1): -5e-5})
    given = {k: v.double() for k, v in given.items()}
    values = checked_values(given, MASK)
    assert values.dtype == torch.float64
    assert values[0][MASK].tolist() == [float(np.float32(-0.1)), -math.inf, 0.0]
    assert values[2][MASK].tolist() == [math.inf, 0.0, 0.0]


def test_bfloat16_and_strided_inputs_are_checked_and_copied_as_float32():
    """The bounds are read from each input as given (a bf16 tensor after its exact conversion, a
    strided view in place): the same copy, the same checks as for contiguous float32."""
    given = columns()
    wide = {k: torch.cat([v, torch.full_like(v, 7.0)], dim=1) for k, v in given.items()}
    strided = {k: v[:, :3] for k, v in wide.items()}  # views whose padding columns would fail
    halves = {**strided, "pi_logp": given["pi_logp"].bfloat16()}
    values = checked_values(halves, MASK)
    assert values.dtype == torch.float32
    assert torch.equal(values[0], given["pi_logp"].bfloat16().float())
    assert all(torch.equal(row, given[k]) for row, k in zip(values[1:], list(given)[1:], strict=True))
    strided["mu_logp"][0, 1] = math.nan
    with pytest.raises(ValueError, match=r"mu_logp contains NaN .*first at index \(0, 1\)"):
        checked_values(strided, MASK)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("pi_logp", math.nan, r"pi_logp contains NaN .*first at index \(0, 1\)"),
        ("mu_logp", 0.5, r"mu_logp holds positive log-probabilities \(e\.g\. 0\.5 at index \(0, 1\)\)"),
        ("mu_logp", math.inf, r"mu_logp contains inf"),
        ("topk_kl", -0.5, r"topk_kl holds negative values \(e\.g\. -0\.5 at index \(0, 1\)\)"),
        ("topk_kl", -math.inf, r"topk_kl contains -inf"),
        ("advantages", math.inf, r"advantages contains inf"),
    ],
)
def test_a_bad_value_at_a_valid_position_names_argument_and_index(name, value, message):
    with pytest.raises(ValueError, match=message):
        checked_values(columns(**{name: {(0, 1): value}}), MASK)


def test_token_ids_are_checked_at_valid_positions_only():
    ids = torch.tensor([[5, 7, -1], [2**31, 3, 9]])
    with pytest.raises(ValueError, match=r"token_ids holds id 2147483648 at \(b, t\) = \(1, 0\), a valid position"):
        check_token_range(snapshot_token_ids(ids, MASK), MASK, 2**31)
    ids[1, 0] = 4  # the padding may hold any id: copied as it is, in the caller's dtype
    ids[1, 2] = 2**40
    out = snapshot_token_ids(ids, MASK)
    check_token_range(out, MASK, 2**31)
    assert out.dtype == torch.int64 and out.tolist() == ids.tolist()


def test_unchecked_rows_with_a_bad_value_are_rejected_and_their_buffers_given_back():
    buffers = Buffers()
    given = columns(pi_logp={(1, 0): 0.5})
    values = snapshot_values(given, MASK, buffers)
    ids = snapshot_token_ids(torch.zeros(2, 3, dtype=torch.long), MASK, buffers)
    rows = TokenRows(
        mask=MASK.clone(),
        token_ids=ids,
        samples=0,
        groups=0,
        names=list(given),
        values=values,
        sequence_advantages=None,
        decided_rules=[],
        decided=None,
        buffers=buffers,
        checked=False,
    )
    message = r"record\(step=3, update=1\) was not recorded: pi_logp holds positive log-probabilities"
    with pytest.raises(RejectedInputError, match=message):
        derive_rows(3, 1, rows, [RULES["ppo"]], [RULES["ppo"]], None, 0)
    assert buffers.empty(tuple(values.shape), values.dtype, values.device) is values  # given back


def test_derive_rows_takes_the_valid_positions_and_derives_as_the_reader():
    given = columns()
    rules = [RULES["ppo"], RULES["dppo_binary_tv"], RULES["dppo_topk_kl"]]
    decided = torch.tensor([[[True, False, True], [False, True, True]]])  # ppo's
    rows = TokenRows(
        mask=MASK,
        token_ids=torch.tensor([[5, 7, 0], [4, 0, 0]]),
        samples=torch.tensor([10, 11]),
        groups=torch.tensor([1, 1]),
        names=list(given),
        values=checked_values(given, MASK),
        decided_rules=["ppo"],
        decided=decided,
        sequence_advantages=None,
    )
    batch = derive_rows(3, 1, rows, rules, [RULES["ppo"], RULES["dppo_binary_tv"]], None, 0)
    assert (batch.step, batch.update) == (3, 1)
    assert batch.sample.tolist() == [10, 10, 11] and batch.pos.tolist() == [0, 1, 0]
    assert batch.token_id.tolist() == [5, 7, 4]
    assert batch.blocked["ppo"].tolist() == [True, False, False]  # the caller's decisions, as given
    assert batch.blocked["dppo_topk_kl"] is None  # not evaluable: no top-K TV given
    # dppo_binary_tv evaluated here: |π − μ| = 0.086, 0.233, 0.064; only the second is beyond
    # δ = 0.15, and its A < 0 pushes π further below μ: blocked
    pi, mu = np.array([-0.1, -2.0, -0.5], np.float32), np.array([-0.2, -1.0, -0.4], np.float32)
    assert batch.blocked["dppo_binary_tv"].tolist() == [False, True, False]
    assert batch.floats["advantage"].tolist() == [-1.0, -1.0, 2.0]
    assert batch.floats["old_logp"] is None and batch.floats["entropy"] is None
    for name, expected in logspace.derived_columns(pi, mu).items():
        np.testing.assert_array_equal(batch.floats[name], expected)
    np.testing.assert_allclose(batch.floats["ratio"], np.exp(pi.astype(np.float64) - mu), rtol=1e-6)


def test_per_sequence_advantages_are_taken_per_row():
    given = columns()
    del given["advantages"]
    rows = TokenRows(
        mask=MASK,
        token_ids=torch.zeros(2, 3, dtype=torch.int64),
        samples=torch.tensor([0, 1]),
        groups=torch.tensor([0, 1]),
        names=list(given),
        values=checked_values(given, MASK),
        decided_rules=[],
        decided=None,
        sequence_advantages=torch.tensor([0.5, -1.5]),
    )
    batch = derive_rows(0, 0, rows, [RULES["ppo"]], [RULES["ppo"]], None, 0)
    assert batch.floats["advantage"].tolist() == [0.5, 0.5, -1.5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_decide_every_rule_as_the_torch_rules(gen, dtype):
    """The writer decides in numpy, in the inputs' dtype (reusing the stored binary TV and KL for
    float32): the same decisions as `evaluate_all` on the torch tensors, at every valid position."""
    from trustlens.rules import evaluate_all

    b, t = 12, 40
    mu = torch.log_softmax(torch.randn(b, t, 5, generator=gen, dtype=dtype) * 2, -1)[..., 0]
    pi = (mu + 0.6 * torch.randn(b, t, generator=gen, dtype=dtype)).clamp(max=-1e-3)
    old = (mu + 0.3 * torch.randn(b, t, generator=gen, dtype=dtype)).clamp(max=-1e-3)
    pi[1, :3] = -math.inf  # probability 0: binary KL +inf
    given = {
        "pi_logp": pi,
        "mu_logp": mu,
        "old_logp": old,
        "topk_tv": logspace.abs_diff_exp(pi, mu, torch) + 0.05 * torch.rand(b, t, generator=gen, dtype=dtype),
        "topk_kl": torch.rand(b, t, generator=gen, dtype=dtype),
    }
    adv = torch.randn(b, generator=gen, dtype=dtype)
    adv[0] = 0.0
    mask = torch.rand(b, t, generator=gen) < 0.8
    rules = list(RULES.values())
    rows = TokenRows(
        mask=mask,
        token_ids=torch.zeros(b, t, dtype=torch.int32),
        samples=0,
        groups=0,
        names=list(given),
        values=checked_values(given, mask),
        decided_rules=[],
        decided=None,
        sequence_advantages=adv,
    )
    batch = derive_rows(0, 0, rows, rules, rules, None, 0)
    want = evaluate_all(rules, advantages=adv, response_mask=mask, **given)
    for rule in rules:
        assert batch.blocked[rule.name].tolist() == want[rule.name][mask].tolist(), rule.name
    per_response = ("seq_logratio_mu", "seq_logratio_old", "seq_tokens")  # float64 sums, int32 counts
    assert all(v is None or v.dtype == np.float32 for k, v in batch.floats.items() if k not in per_response)
    assert batch.sample.tolist() == torch.nonzero(mask)[:, 0].tolist()  # default ids: 0 + b


def test_buffers_are_reused_and_bounded():
    buffers = Buffers(keep=1)
    first = buffers.empty((2, 3), torch.float32, torch.device("cpu"))
    second = buffers.empty((2, 3), torch.float32, torch.device("cpu"))
    assert first.data_ptr() != second.data_ptr()
    buffers.give_back(first, second)  # only one of them is kept
    assert buffers.empty((2, 3), torch.float32, torch.device("cpu")).data_ptr() == first.data_ptr()
    fresh = buffers.empty((2, 3), torch.float32, torch.device("cpu"))
    assert fresh.data_ptr() not in (first.data_ptr(), second.data_ptr())
    assert buffers.empty((2, 3), torch.int32, torch.device("cpu")).dtype == torch.int32  # per dtype


def test_recorded_rows_of_many_calls_stay_apart(tmp_path):
    """The copies of a call go back to the pool once its rows are taken: calls made while the
    writer is behind, with the caller overwriting its tensors after each, keep their own values."""
    import polars as pl

    from trustlens import TokenRecorder, load_run

    b, t, calls = 4, 16, 12
    inputs = {
        "pi_logp": torch.zeros(b, t),
        "mu_logp": torch.zeros(b, t),
        "token_ids": torch.zeros(b, t, dtype=torch.int64),
        "advantages": torch.zeros(b),
    }
    with TokenRecorder(tmp_path / "run", rules=["ppo"]) as rec:
        for step in range(calls):
            inputs["pi_logp"].fill_(-0.01 * (step + 1))
            inputs["mu_logp"].fill_(-0.02 * (step + 1))
            inputs["token_ids"].fill_(step)
            inputs["advantages"].fill_(step - 5.5)
            rec.record(step, response_mask=torch.ones(b, t, dtype=torch.bool), **inputs)
    tokens = load_run(tmp_path / "run").tokens.collect().sort("step")
    per_step = (
        tokens.group_by("step")
        .agg(
            pl.col("pi_logp").n_unique().alias("distinct"),
            pl.col("pi_logp").first(),
            pl.col("token_id").first(),
            pl.col("advantage").first(),
            pl.len(),
        )
        .sort("step")
    )
    assert per_step["len"].to_list() == [b * t] * calls and per_step["distinct"].to_list() == [1] * calls
    assert per_step["token_id"].to_list() == list(range(calls))
    np.testing.assert_allclose(per_step["pi_logp"].to_numpy(), [-0.01 * (s + 1) for s in range(calls)], rtol=1e-6)
    np.testing.assert_allclose(per_step["advantage"].to_numpy(), [s - 5.5 for s in range(calls)])

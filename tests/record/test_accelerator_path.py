"""The accelerator path of `TokenRecorder.record` (trustlens.record.staged_rows.stage_rows) run on
CPU tensors through the recorder's private switch: every check on the device and read back in
one host synchronisation with the row count, the rows copied to reused host buffers and taken by
the writer thread. It writes the rows the CPU path writes, and refuses a bad input from the call
itself (where the CPU path drops the call's rows and raises at the next call)."""

import math
import threading

import polars as pl
import pytest
import torch
from record.test_recorder import BAD_INPUTS, BAD_VALUES, B, K, make_batch, tokens_of

import trustlens.divergence.kernels as kernels
from trustlens import TokenRecorder
from trustlens.divergence import topk_from_logits
from trustlens.record import SAMPLE_STEP
from trustlens.run import RejectedInputError

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's inf − inf in Triton's interpreter


def staged(path, **kwargs) -> TokenRecorder:
    rec = TokenRecorder(path, **kwargs)
    rec._staged_on_cpu = True
    return rec


def with_topk(gen, batch: dict) -> dict:
    """μ's top-K from nearby logits, one set lacking a_t (forced in from mu_logp)."""
    mu_logits = batch["logits"] + torch.randn(batch["logits"].shape, generator=gen, dtype=batch["logits"].dtype)
    topk_ids, topk_logp = topk_from_logits(mu_logits, batch["token_ids"], K)
    topk_ids[1, 2] = (batch["token_ids"][1, 2] + 1 + torch.arange(K)) % batch["logits"].shape[-1]
    return dict(batch, mu_topk_ids=topk_ids, mu_topk_logp=topk_logp)


def recorded(path, batches: list[dict], *, on_device: bool, rules=None) -> pl.DataFrame:
    rec = staged(path, rules=rules) if on_device else TokenRecorder(path, rules=rules)
    with rec:
        for step, batch in enumerate(batches):
            assert rec.record(step, **batch) == int(batch["response_mask"].sum())
    return tokens_of(path)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("impl", [None, "torch", "triton"])
def test_the_same_rows_as_the_cpu_path(tmp_path, gen, monkeypatch, impl, temperature):
    """Per-sequence and per-token advantages, caller's and default ids, logits with μ's top-K
    through the one-pass kernels (impl) or the chunked path (None), padding holding NaN; at
    τ ≠ 1 with log π before the temperature (pi_logp_raw)."""
    first = with_topk(gen, make_batch(gen)) | {"temperature": temperature}
    first["pi_logp"] = first["pi_logp"].masked_fill(~first["response_mask"], math.nan)  # padding: not read
    second = make_batch(gen)
    second.pop("logits")
    second.update(advantages=torch.randn(second["token_ids"].shape, generator=gen), sample_ids=[7, 8, 9])
    cpu = recorded(tmp_path / "cpu", [first, second], on_device=False)
    if impl is not None:
        monkeypatch.setattr(kernels, "pass_impl", lambda device: impl)
    device = recorded(tmp_path / "device", [first, second], on_device=True)
    assert device.columns == cpu.columns and device.height == cpu.height
    assert (device["pi_logp_raw"].null_count() < device.height) == (temperature != 1.0)
    assert device["mu_topk_mass"].null_count() == device.height - int(first["response_mask"].sum())
    for name in device.columns:
        if device[name].dtype.is_float():
            got, want = (torch.tensor(df[name].fill_null(math.nan).to_numpy()) for df in (device, cpu))
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, msg=name)
        else:
            assert device[name].equals(cpu[name]), name


def test_rounding_is_clamped_as_on_the_cpu(tmp_path, gen):
    batch = make_batch(gen)
    batch.pop("logits")
    batch["pi_logp"][1, 1] = 5e-5  # a log-softmax that rounded above 0
    batch["entropy"] = torch.full(batch["token_ids"].shape, -5e-5)
    rows = recorded(tmp_path / "run", [batch], on_device=True)
    assert rows["pi_logp"].max() == 0.0 and rows["entropy"].min() == 0.0
    assert rows.equals(recorded(tmp_path / "cpu", [batch], on_device=False))


@pytest.mark.parametrize("name,change,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_a_bad_input_is_refused_by_its_own_call(tmp_path, gen, name, change, message):
    """Every bad input of the CPU path's table, bad values included, raises from the call with
    the CPU path's message; the call records nothing and takes no default sample ids."""
    batch = make_batch(gen)
    with staged(tmp_path / "run", rules=["ppo", "dppo_binary_tv"]) as rec:
        rec.record(0, **batch)
        with pytest.raises(ValueError, match=message) as refused:
            rec.record(**change(dict(batch, step=1)))
        assert not isinstance(refused.value, RejectedInputError)
        rec.flush()  # nothing was dropped by the writer thread: nothing raises later
        rec.record(1, **batch)
    df = tokens_of(tmp_path / "run")
    assert df.height == 2 * int(batch["response_mask"].sum())
    assert sorted(set(df.filter(pl.col("step") == 1)["sample"])) == [SAMPLE_STEP + i for i in range(B)]
    assert name in BAD_VALUES or not refused.value.args[0].startswith("record(")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: dict(b, advantages=b["advantages"].index_fill(0, torch.tensor([1]), math.inf)), "advantages"),
        (lambda b: dict(without_logits(b), token_ids=b["token_ids"] + 2**31), r"\[0, 2147483648\)"),
        (lambda b: dict(b, mu_topk_logp=b["mu_topk_logp"].index_fill(2, torch.tensor([0]), 0.5)), "mu_topk_logp"),
        (lambda b: dict(b, logits=b["logits"].index_fill(2, torch.tensor([3]), math.inf)), r"logits hold NaN or \+inf"),
    ],
    ids=["advantages inf", "id beyond int32", "top-K log-prob > 0", "logits inf"],
)
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_device_flags_name_the_bad_value(tmp_path, gen, monkeypatch, change, message, impl):
    """Checks read back only as flags (the one-pass logit quantities among them)."""
    monkeypatch.setattr(kernels, "pass_impl", lambda device: impl)
    with staged(tmp_path / "run") as rec, pytest.raises(ValueError, match=message):
        rec.record(0, **change(with_topk(gen, make_batch(gen))))


def without_logits(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k not in ("logits", "mu_topk_ids", "mu_topk_logp")}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_one_host_synchronisation_per_call(tmp_path, gen, monkeypatch, temperature):
    """The caller's thread reads nothing back from the tensors but the one `tolist` of
    stage_rows (the writer thread takes the rows from the host copies), also with the raw
    log-prob at τ ≠ 1."""
    monkeypatch.setattr(kernels, "pass_impl", lambda device: "torch")
    batch = with_topk(gen, make_batch(gen)) | {"temperature": temperature}
    caller, reads = threading.get_ident(), []

    def counted(name, original):
        def read(*args, **kwargs):
            if threading.get_ident() == caller:
                reads.append(name)
            return original(*args, **kwargs)

        return read

    with staged(tmp_path / "run") as rec:
        rec.record(0, **batch)  # warm: the first call allocates the reused buffers
        for name in ("tolist", "item", "__bool__", "__int__", "__float__", "numpy", "nonzero", "cpu"):
            monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
        monkeypatch.setattr(torch, "nonzero", counted("torch.nonzero", torch.nonzero))
        rec.record(1, **batch)
        monkeypatch.undo()
    assert reads == ["tolist"]

"""trustlens.analysis.certify on hand-built runs whose answers are known: bit-exact, one float32
ulp apart, bf16-recorded columns, top-K differing only in the rest's mass, where tokens differ
(position, prefill vs decode, batch rows), and the inputs that cannot be certified."""

import json

import numpy as np
import pytest

from trustlens.analysis.certify import CertifyInputError, certify, column_precision
from trustlens.analysis.certify.compare import ulps
from trustlens.run import load_run
from trustlens.run.tables import write_run

STEPS, SAMPLES, LENGTH = 2, 4, 5  # a run of 2 steps × 4 samples × 5 positions


def _logp(n: int, seed: int = 0) -> np.ndarray:
    return -np.random.default_rng(seed).uniform(0.01, 5.0, n).astype(np.float32)


def _run(tmp_path, mu, old=None, *, config=None, name="run", **columns):
    n = STEPS * SAMPLES * LENGTH
    idx = np.arange(n)
    step, sample, pos = idx // (SAMPLES * LENGTH), idx // LENGTH, idx % LENGTH
    tokens = {
        "step": step.tolist(),
        "sample": sample.tolist(),
        "pos": pos.tolist(),
        "token": [f"t{i}" for i in idx],
        "mu_logp": None if mu is None else [float(x) for x in mu],
        "old_logp": None if old is None else [float(x) for x in old],
        "pi_logp": [float(x) for x in (old if old is not None else _logp(n))],
        **columns,
    }
    return load_run(
        write_run(tmp_path / name, tokens={k: v for k, v in tokens.items() if v is not None}, config=config)
    )


N = STEPS * SAMPLES * LENGTH


def test_bit_exact(tmp_path):
    mu = _logp(N)
    cert = certify(_run(tmp_path, mu, mu.copy()))
    assert cert.verdict == "bit-exact" and cert.certified() and cert.certified("precision")
    assert (cert.tokens["compared"], cert.tokens["equal"], cert.tokens["share"]) == (N, N, 1.0)
    assert cert.tokens["max_abs_diff"] == 0.0 and cert.where() == [] and cert.distribution is None
    with pytest.raises(CertifyInputError, match="no top-K recorded"):
        cert.certified("distribution")


def test_one_ulp_is_not_equal_and_named(tmp_path):
    mu = _logp(N)
    old = mu.copy()
    i = 2 * LENGTH + 3  # step 0, sample 2, position 3
    old[i] = np.nextafter(mu[i], np.float32(-np.inf))
    cert = certify(_run(tmp_path, mu, old))
    assert cert.verdict == "not equal" and not cert.certified() and not cert.certified("precision")
    assert (cert.tokens["compared"], cert.tokens["equal"]) == (N, N - 1)
    assert cert.tokens["max_abs_diff"] == float(mu[i]) - float(old[i]) > 0  # the float32 spacing at μ
    ex = cert.tokens["first_differing"]
    assert len(ex) == 1
    assert {k: ex[0][k] for k in ("step", "sample", "pos", "token", "ulps")} == {
        "step": 0,
        "sample": 2,
        "pos": 3,
        "token": f"t{i}",
        "ulps": 1,
    }
    assert cert.where()[0] == "first at step 0 sample 2 pos 3"


def test_signed_zeros_are_equal(tmp_path):
    mu = _logp(N)
    mu[:3] = 0.0
    old = mu.copy()
    old[:3] = -0.0
    assert certify(_run(tmp_path, mu, old)).verdict == "bit-exact"


def test_ulps():
    a = np.float32(-1.5)
    assert ulps(float(a), float(np.nextafter(a, np.float32(0)))) == 1
    assert ulps(0.0, -0.0) == 0
    assert ulps(float(np.float32(1e-45)), float(np.float32(-1e-45))) == 2  # across zero
    assert ulps(float("-inf"), -1.0) is None


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 (round to nearest even), kept as float32."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def test_column_precision():
    x = _logp(100)
    assert column_precision(x) == "float32" and column_precision(_bf16(x)) == "bf16"
    assert column_precision(np.zeros(100, np.float32)) == "float32"  # zeros say nothing


def test_bf16_recorded_mu_is_equal_within_its_precision_only(tmp_path):
    old = _logp(N)
    mu = _bf16(old)  # the engine's log-probs kept in bf16: π_old rounds to them
    assert (mu != old).all()
    cert = certify(_run(tmp_path, mu, old))
    assert cert.precision == {"mu": "bf16", "old": "float32"}
    assert cert.verdict == "within precision" and cert.certified("precision") and not cert.certified()
    assert cert.tokens["same_bits"] == 0
    # a π_old one bf16 step away does not round to μ
    step = np.float32(2.0) ** (np.floor(np.log2(np.abs(mu))) - 7)
    cert = certify(_run(tmp_path, mu, mu - step, name="far"))
    assert cert.verdict == "not equal" and cert.tokens["equal"] == 0


def test_topk_differing_only_in_the_rest_is_not_a_distribution(tmp_path):
    """Sampled tokens bit-equal, μ's top-K mass 0.9 against π's 0.9002: the rest differs by 2e-4,
    which the top-K TV (½ Σ over S and the rest) records — bit-exact, but not the distribution."""
    mu = _logp(N)
    cols = {"mu_topk_mass": [0.9] * N, "pi_topk_mass": [0.9002] * N, "topk_tv": [2e-4] * N, "topk_kl": [1e-7] * N}
    cert = certify(_run(tmp_path, mu, mu.copy(), config={"topk": 4}, **cols))
    assert cert.verdict == "bit-exact" and cert.certified("bit-exact")
    assert not cert.certified("distribution")
    d = cert.distribution
    assert (d["tokens"], d["within"], d["k"]) == (N, 0, 4)
    assert d["max_mass_gap"] == pytest.approx(2e-4, rel=1e-3) and d["pi_equals_old"] == 1.0
    same = {**cols, "pi_topk_mass": [0.9] * N, "topk_tv": [3e-8] * N}  # float32 rounding only
    assert certify(_run(tmp_path, mu, mu.copy(), name="same", **same)).certified("distribution")


def test_where_names_the_batch_rows_and_prefill(tmp_path):
    mu = _logp(N)
    old = mu.copy()
    rows = np.arange(N) // LENGTH % SAMPLES  # the sample's row in its step's batch
    pos = np.arange(N) % LENGTH
    hit = (rows >= 2) & (pos == 0)  # rows 2–3, the prefill token
    old[hit] = mu[hit] - 1e-3
    cert = certify(_run(tmp_path, mu, old))
    t = cert.tokens
    assert t["prefill"] == {"compared": STEPS * SAMPLES, "differing": 4, "share": 0.5}
    assert t["decode"]["differing"] == 0
    assert t["batch_sizes"] == [SAMPLES]
    where = cert.where()
    assert "prefill (pos 0) / decode (pos ≥ 1): prefill 4 of 8 (50.0%), decode 0 of 32 (0.0%)" in where
    assert "batch composition: only rows 2–3 of each step's batch of 4 (samples in id order) differ" in where


def test_decode_batch_is_named_where_sequences_end(tmp_path):
    """Samples 0 and 1 of each step end after 2 tokens: positions 2–4 decode a batch of 2, and
    only they differ."""
    n = N
    idx = np.arange(n)
    keep = ~((idx // LENGTH % SAMPLES < 2) & (idx % LENGTH >= 2))
    mu = _logp(n)
    old = mu.copy()
    live2 = (idx % LENGTH >= 2) & keep
    old[live2] = mu[live2] - 1e-3
    step, sample, pos = idx // (SAMPLES * LENGTH), idx // LENGTH, idx % LENGTH
    tokens = {
        "step": step[keep].tolist(),
        "sample": sample[keep].tolist(),
        "pos": pos[keep].tolist(),
        "mu_logp": mu[keep].tolist(),
        "old_logp": old[keep].tolist(),
        "pi_logp": old[keep].tolist(),
    }
    cert = certify(load_run(write_run(tmp_path / "run", tokens=tokens)))
    assert {r["live"]: r["differing"] for r in cert.tokens["by_decode_batch"]} == {4: 0, 2: 12}
    assert "decode batch: differs only where 2 of the step's sequences were still generating" in cert.where()


def test_without_mu_is_bad_input(tmp_path):
    with pytest.raises(CertifyInputError, match="no log μ recorded"):
        certify(_run(tmp_path, None, _logp(N)))


def test_with_a_lag_is_bad_input(tmp_path):
    with pytest.raises(CertifyInputError, match=r"rollout_lag 2: .* cannot be certified; .*staleness="):
        certify(_run(tmp_path, _logp(N), _logp(N), config={"rollout_lag": 2}))


def test_stale_tokens_are_left_out(tmp_path):
    mu = _logp(N)
    old = mu.copy()
    old[: N // 2] -= 1e-3  # step 0 sampled with older weights
    staleness = [1.0] * (N // 2) + [0.0] * (N // 2)
    cert = certify(_run(tmp_path, mu, old, staleness=staleness))
    assert cert.verdict == "bit-exact" and cert.tokens["compared"] == N // 2
    assert cert.notes == [f"{N // 2} token rows sampled with older weights (staleness > 0) left out"]


def test_without_pi_old_compares_pi_at_update_0(tmp_path):
    """No old_logp: π of update 0 stands in; step 1's tokens recorded at update 1 only are left out."""
    mu = _logp(N)
    update = (np.arange(N) >= N // 2).astype(int).tolist()
    tokens = {
        "step": [0] * N,
        "update": update,
        "sample": (np.arange(N) // LENGTH).tolist(),
        "pos": (np.arange(N) % LENGTH).tolist(),
        "mu_logp": mu.tolist(),
        "pi_logp": mu.tolist(),
    }
    cert = certify(load_run(write_run(tmp_path / "run", tokens=tokens)))
    assert cert.reference == "pi_logp at update 0" and cert.verdict == "bit-exact"
    assert cert.tokens["compared"] == N // 2
    assert "π_old not recorded" in cert.notes[0] and f"({N // 2} tokens recorded only at later updates" in cert.notes[0]


def test_each_token_is_compared_once_over_updates(tmp_path):
    mu = _logp(LENGTH)
    tokens = {
        "step": [0] * 2 * LENGTH,
        "update": [0] * LENGTH + [1] * LENGTH,
        "sample": [0] * 2 * LENGTH,
        "pos": list(range(LENGTH)) * 2,
        "mu_logp": mu.tolist() * 2,
        "old_logp": mu.tolist() * 2,
        "pi_logp": mu.tolist() * 2,
    }
    assert certify(load_run(write_run(tmp_path / "run", tokens=tokens))).tokens["compared"] == LENGTH


def test_json_is_strict(tmp_path):
    mu = _logp(N)
    old = mu.copy()
    old[0] = -np.inf  # π_old gives a token probability 0: |Δ| = inf
    from trustlens.core.render import strict_json

    out = json.dumps(strict_json(certify(_run(tmp_path, mu, old)).to_json()), allow_nan=False)
    assert json.loads(out)["tokens"]["max_abs_diff"] == "inf"


def test_a_sampled_run_certifies_its_kept_tokens():
    from pathlib import Path

    run = load_run(Path(__file__).resolve().parents[3] / "data" / "sample_run" / "learning")
    cert = certify(run)
    kept = run.tokens.unique(["step", "rank", "sample", "pos"]).select("mu_logp").collect().height
    assert cert.tokens["compared"] == kept and cert.tokens["by_row"] is None
    assert cert.notes[-1].startswith("a sampled run (Keep): the kept tokens are compared")
    assert "batch composition: not known in a sampled run" in cert.where()

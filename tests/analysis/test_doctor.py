"""trustlens.analysis.diagnosis: each check names its planted defect first and stays ok on clean
data (benchmarks/doctor_detection.py's planting), and each statistic against a hand-checked
value."""

import json
import math

import numpy as np
import polars as pl
import pytest
from benchmark_scripts import load

from trustlens import load_run
from trustlens.analysis import Finding, doctor
from trustlens.analysis.diagnosis import inputs as doctor_inputs
from trustlens.analysis.diagnosis import inputs_of, note_consequences, ordered, read_sampling
from trustlens.analysis.diagnosis.alignment import sentinel_check, shift_check, token_ids_check
from trustlens.analysis.diagnosis.sampling import raw_share, temperature_check, temperature_ratio
from trustlens.analysis.diagnosis.support import moved_mass, truncation_bias_check, truncation_check
from trustlens.run.tables import write_run

bench = load("doctor_detection")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """defect -> its planted run's findings (seed 1), "clean" included."""
    folder = tmp_path_factory.mktemp("planted")
    return {d: doctor(bench.write_planted(folder / d, d, 1)) for d in ["clean", *bench.DEFECTS]}


@pytest.mark.parametrize("defect", list(bench.DEFECTS))
def test_planted_defect_is_named_first(planted, defect):
    check = bench.DEFECTS[defect]
    first = planted[defect][0]
    assert (first.check, first.verdict) == (check, "problem")
    assert first.fix and first.evidence.get("examples")
    ex = first.evidence["examples"][0]
    assert {"step", "update", "sample", "pos", "token_id", "mu", "old"} <= set(ex)


def test_clean_run_is_ok_everywhere(planted):
    assert [(f.check, f.verdict) for f in planted["clean"] if f.verdict != "ok"] == []
    # `exact` warns only (a zero-mismatch engine that leaks), so it has no planted problem;
    # `routing` is quiet on this dense run (its cases: tests/analysis/test_doctor_routing.py)
    assert {f.check for f in planted["clean"]} == set(bench.DEFECTS.values()) | {"exact", "routing"}


def _pairs_run(tmp_path, mu, old, *, pos=None, sample=None, entropy=None, token_id=None, manifest=None):
    n = len(mu)
    tokens = {
        "step": [0] * n,
        "sample": sample if sample is not None else [0] * n,
        "pos": pos if pos is not None else list(range(n)),
        "mu_logp": list(mu),
        "old_logp": list(old),
        "pi_logp": list(old),
        "entropy": entropy,
        "token_id": token_id if token_id is not None else [0] * n,
    }
    path = write_run(tmp_path / "run", tokens={k: v for k, v in tokens.items() if v is not None}, rules=[])
    if manifest:
        run_json = path / "run.json"
        run_json.write_text(json.dumps({**json.loads(run_json.read_text()), **manifest}))
    return inputs_of(load_run(path))


def test_temperature_ratio_recovers_the_tilt(tmp_path):
    # μ at twice π_old's temperature: log π_old = 2·log μ − 2·c_t, c_t a per-position constant
    # that the entropy column carries (here exactly), so the fit's slope is 1 − 2 = −1: r = 2
    rng = np.random.default_rng(0)
    mu = -rng.uniform(0.05, 4.0, 200)
    c = rng.uniform(0.0, 1.0, 200)
    old = 2 * mu - 2 * c
    r, n = temperature_ratio(_pairs_run(tmp_path, mu, old, entropy=list(c)).pairs)
    assert n == 200
    assert r == pytest.approx(2.0, abs=1e-6)  # float32 log-probs in the run


def test_temperature_ratio_is_one_for_noise(tmp_path):
    rng = np.random.default_rng(1)
    mu = -rng.uniform(0.05, 4.0, 400)
    old = np.minimum(mu + rng.normal(0, 0.01, 400), 0)
    r, _ = temperature_ratio(_pairs_run(tmp_path, mu, old).pairs)
    assert r == pytest.approx(1.0, abs=0.01)


def test_truncation_statistics_by_hand(tmp_path):
    # 60 uncertain tokens, μ = π_old / 0.8 (renormalised over a kept mass of 0.8) on 57 of them:
    # share 57/60 = 0.95, mean d = 57·log(1/0.8)/60; 5 certain tokens (π_old ≥ 0.99) do not count
    old = [math.log(0.5)] * 60 + [math.log(0.995)] * 5
    mu = [math.log(0.5 / 0.8)] * 57 + [math.log(0.5)] * 3 + [0.0] * 5
    f = truncation_check(_pairs_run(tmp_path, mu, old))
    assert f.evidence["uncertain_tokens"] == 60
    assert f.evidence["share_mu_above_old"] == pytest.approx(0.95)
    assert f.evidence["mean_d"] == pytest.approx(57 * math.log(1 / 0.8) / 60, rel=1e-6)
    assert f.verdict == "problem"


def test_shift_correlations_by_hand(tmp_path):
    # 20 samples of 8 positions: log μ at t is log π_old at t − 1 (the first keeps its own)
    rng = np.random.default_rng(2)
    old = -rng.uniform(0.0, 3.0, (20, 8))
    mu = np.concatenate([old[:, :1], old[:, :-1]], axis=1)
    inp = _pairs_run(
        tmp_path,
        mu.ravel(),
        old.ravel(),
        pos=[t for _ in range(20) for t in range(8)],
        sample=[s for s in range(20) for _ in range(8)],
    )
    f = shift_check(inp)
    inner = (slice(None), slice(1, 7))  # positions with both neighbours
    assert f.evidence["positions"] == 20 * 6
    own = np.corrcoef(mu[inner].ravel().argsort().argsort(), old[inner].ravel().argsort().argsort())[0, 1]
    assert f.evidence["corr_own"] == pytest.approx(own)  # Spearman: Pearson of the ranks (no ties here)
    assert f.evidence["corr_prev"] == pytest.approx(1.0)
    assert (f.verdict, "t − 1" in f.summary) == ("problem", True)


def test_sentinel_counts_by_hand(tmp_path):
    # 100 tokens with π_old = 0.3 (visible), 3 of them with log μ = 0, one log μ = −1e4 elsewhere
    old = [math.log(0.3)] * 100 + [math.log(0.9)]
    mu = [0.0] * 3 + [math.log(0.3)] * 97 + [-1e4]
    f = sentinel_check(_pairs_run(tmp_path, mu, old))
    assert (f.evidence["zeros"], f.evidence["large_negative"]) == (3, 1)
    assert f.evidence["share_of_visible"] == pytest.approx(4 / 100)
    assert f.verdict == "problem"


def test_token_ids_isolation_by_hand(tmp_path):
    # 4 tokens with μ = 0.9 and π_old = 1e-4 at position 0 out of 1000; 2 more far-off tokens
    # (ρ = 4): isolation 4/6
    n = 1000
    mu = [math.log(0.9)] * 4 + [math.log(0.2)] * 2 + [math.log(0.5)] * (n - 6)
    old = [math.log(1e-4)] * 4 + [math.log(0.8)] * 2 + [math.log(0.5)] * (n - 6)
    f = token_ids_check(_pairs_run(tmp_path, mu, old, pos=[0] * 4 + list(range(1, n - 3))))
    assert f.evidence["count"] == 4
    assert f.evidence["share"] == pytest.approx(4 / n)
    assert f.evidence["isolation"] == pytest.approx(4 / 6)
    assert f.evidence["top_pos"][0] == {"pos": 0, "count": 4}
    assert f.verdict == "problem"


def test_sampling_read_defensively():
    s = read_sampling({"sampling": {"temperature": 0.6, "top_p": 0.8, "logprobs": "processed"}})
    assert (s.temperature, s.top_p, s.top_k, s.logprobs, s.truncated) == (0.6, 0.8, None, "processed", True)
    old = read_sampling({"config": {"temperature": 0.5}})  # a run from before the field
    assert (old.temperature, old.logprobs, old.truncated) == (0.5, None, False)
    odd = read_sampling({"sampling": {"temperature": "hot", "logprobs": "weird"}, "config": None})
    assert (odd.temperature, odd.logprobs) == (None, None)


def test_raw_logprobs_claim_contradicted_by_data_warns(tmp_path):
    rng = np.random.default_rng(3)
    mu = -rng.uniform(0.05, 4.0, 200)
    manifest = {"sampling": {"temperature": 0.5, "logprobs": "raw"}}
    from trustlens.analysis.diagnosis.sampling import temperature_check

    f = temperature_check(_pairs_run(tmp_path, mu, mu, manifest=manifest))
    assert f.verdict == "warning" and "contradict" in f.summary


def test_run_without_mu_is_ok(tmp_path):
    path = write_run(tmp_path / "r", tokens={"step": [0], "sample": [0], "pos": [0], "pi_logp": [-0.1]}, rules=[])
    assert {f.verdict for f in doctor(path)} == {"ok"}


def test_order_and_validation():
    fs = [
        Finding("level", "problem", "", strength=50.0),
        Finding("where", "warning", ""),
        Finding("shift", "problem", "", strength=2.0),
        Finding("temperature", "problem", "", strength=3.0),
        Finding("sentinel", "ok", ""),
    ]
    assert [f.check for f in ordered(fs)] == ["shift", "temperature", "level", "where", "sentinel"]
    noted = note_consequences(ordered(fs))
    assert [f.evidence.get("may_follow_from") for f in noted] == [None, "shift", "shift", "shift", None]
    with pytest.raises(ValueError, match="verdict must be one of ok, warning, problem, got 'bad'"):
        Finding("level", "bad", "")
    with pytest.raises(ValueError, match="check must be one of"):
        Finding("nope", "ok", "")


def test_lazy_frame_input(planted, tmp_path):
    path = bench.write_planted(tmp_path / "s", "shifted", 2)
    findings = doctor(pl.scan_parquet(str(path / "tokens" / "rank=0" / "*.parquet")))
    assert findings[0].check == "shift"


def test_shift_on_a_subsample_of_whole_samples(monkeypatch, tmp_path):
    # past MAX_ROWS pairs the shift check joins the neighbours of a hash subsample of samples
    path = bench.write_planted(tmp_path / "s", "shifted", 3)
    full = shift_check(inputs_of(load_run(path)))
    monkeypatch.setattr(doctor_inputs, "MAX_ROWS", 3000)
    part = shift_check(inputs_of(load_run(path)))
    rows = bench.STEPS * bench.SAMPLES * bench.SEQ_LEN
    assert 0 < part.evidence["positions"] < full.evidence["positions"] == rows * (bench.SEQ_LEN - 2) // bench.SEQ_LEN
    assert part.verdict == full.verdict == "problem"


@pytest.fixture(scope="module")
def planted_with_columns(tmp_path_factory):
    """defect -> the findings of its planted run (seed 1) with the columns record derives from
    π's logits and μ's top-K, "clean" included."""
    folder = tmp_path_factory.mktemp("planted_logits")
    return {d: doctor(bench.write_planted(folder / d, d, 1, logit_columns=True)) for d in ["clean", *bench.DEFECTS]}


@pytest.mark.parametrize("defect", list(bench.DEFECTS))
def test_with_logit_columns_each_defect_is_named_first(planted_with_columns, defect):
    first = planted_with_columns[defect][0]
    assert (first.check, first.verdict) == (bench.DEFECTS[defect], "problem")
    found = {f.check: f for f in planted_with_columns[defect]}
    masked = defect == "truncation_bias"  # its run holds the sampling masks: truncation defers to truncation_bias
    assert found["temperature"].evidence["form"] == "logits"
    assert found["truncation"].evidence["form"] == ("sampling mask" if masked else "top-K")


def test_with_logit_columns_the_clean_run_is_ok(planted_with_columns):
    assert [(f.check, f.verdict) for f in planted_with_columns["clean"] if f.verdict != "ok"] == []
    found = {f.check: f for f in planted_with_columns["clean"]}
    assert found["temperature"].evidence["share_nearer_raw"] < 0.05
    assert abs(found["truncation"].evidence["moved"]) < 0.05
    raw = {f.check: f for f in planted_with_columns["raw_logprobs"]}["temperature"].evidence
    assert raw["share_nearer_raw"] > 0.95  # μ is the raw log-prob itself, up to the engine's noise
    assert {f.check: f for f in planted_with_columns["top_p"]}["truncation"].evidence["moved"] > 0.8


def _columns_run(tmp_path, columns: dict[str, list]) -> doctor_inputs.Inputs:
    n = len(columns["mu_logp"])
    base = {"step": [0] * n, "sample": list(range(n)), "pos": [0] * n, "token_id": [0] * n}
    return inputs_of(load_run(write_run(tmp_path / "run", tokens={**base, **columns}, rules=[])))


def test_raw_share_by_hand(tmp_path):
    # log π = −1, log π_raw = −0.5: log μ = −0.6 on 30 tokens (nearer raw), −0.95 on 20 (nearer π);
    # 10 tokens whose raw and processed log π are 0.1 apart cannot tell and are left out
    mu = [-0.6] * 30 + [-0.95] * 20 + [-0.6] * 10
    raw = [-0.5] * 50 + [-0.9] * 10
    inp = _columns_run(tmp_path, {"mu_logp": mu, "old_logp": [-1.0] * 60, "pi_logp": [-1.0] * 60, "pi_logp_raw": raw})
    stats = raw_share(inp.pairs)
    assert stats is not None and stats["tokens"] == 50
    assert stats["share_nearer_raw"] == pytest.approx(0.6)
    assert stats["mean_abs_to_pi"] == pytest.approx((30 * 0.4 + 20 * 0.05) / 50)
    assert stats["mean_abs_to_raw"] == pytest.approx((30 * 0.1 + 20 * 0.45) / 50)
    f = temperature_check(inp)
    assert (f.verdict, f.evidence["form"]) == ("problem", "logits")  # q = 0.6 ≥ 0.5


def test_moved_mass_by_hand(tmp_path):
    # Σ_S π = 0.8: Σ_S μ = 1 moves all of π's outside mass onto S (1), 0.85 a quarter of it;
    # 10 positions where π leaves only 0.5% outside S are left out
    mu_mass = [1.0] * 25 + [0.85] * 25 + [1.0] * 10
    pi_mass = [0.8] * 50 + [0.995] * 10
    logp = [-0.5] * 60
    columns = {"mu_logp": logp, "old_logp": logp, "pi_logp": logp, "mu_topk_mass": mu_mass, "pi_topk_mass": pi_mass}
    inp = _columns_run(tmp_path, columns)
    stats = moved_mass(inp.pairs)
    assert stats is not None and stats["tokens"] == 50
    assert stats["moved"] == pytest.approx((1.0 + 0.25) / 2, abs=1e-6)
    assert stats["share_mu_all_on_s"] == pytest.approx(0.5)
    assert stats["mean_pi_outside"] == pytest.approx(0.2, abs=1e-6)
    f = truncation_check(inp)
    assert (f.verdict, f.evidence["form"]) == ("problem", "top-K")  # m = 0.625 ≥ 0.6
    # a run without the columns (or with them null) takes the token-level form
    assert raw_share(inp.pairs) is None


def test_kinds_of_mu_are_read_and_old_runs_stay_readable():
    s = read_sampling({"sampling": {"temperature": 0.7, "logprobs": "tempered", "processors": ["logit_bias", "x"]}})
    assert (s.logprobs, s.processors) == ("tempered", ("logit_bias",))
    assert read_sampling({"sampling": {"logprobs": "processed"}}).processors == ()  # before `processors`


def test_raw_mu_is_named_with_what_it_means_for_the_ratio(tmp_path):
    rng = np.random.default_rng(4)
    mu = -rng.uniform(0.05, 4.0, 300)
    c = rng.uniform(0.0, 1.0, 300)
    old = 2 * mu - 2 * c  # μ at twice π_old's temperature: r = 2
    manifest = {"sampling": {"temperature": 0.5, "logprobs": "raw"}}
    f = temperature_check(_pairs_run(tmp_path, mu, old, entropy=list(c), manifest=manifest))
    assert f.verdict == "problem"
    assert "raw log μ (before the temperature τ = 0.5): the ratio compares π at τ with μ at τ = 1" in f.summary
    assert "logprobs_mode='processed_logprobs'" in f.fix and "SGLANG_RETURN_ORIGINAL_LOGPROB" in f.fix


def test_a_temperature_fit_that_fails_says_so(tmp_path):
    # d = 2·log μ + 5: slope 2, so τ_μ/τ_π = 1 − 2 = −1, which no temperature gives
    rng = np.random.default_rng(5)
    mu = -rng.uniform(0.05, 4.0, 200)
    old = -mu - 5.0
    f = temperature_check(_pairs_run(tmp_path, mu, old))
    assert f.verdict == "warning" and f.evidence["fit_failed"]
    assert f.summary.startswith("the temperature fit fails: the slope of log μ − log π_old on log μ over 200")
    assert "-" not in f.summary.split("is ")[1].split(",")[0]  # the slope 2.000, no negative ratio printed


def test_moved_mass_below_zero_is_not_printed_negative(tmp_path):
    # Σ_S μ = 0.7 < Σ_S π = 0.8: (0.7 − 0.8) / 0.2 = −0.5, μ moved nothing onto S
    logp = [-0.5] * 60
    columns = {"mu_logp": logp, "old_logp": logp, "pi_logp": logp, "mu_topk_mass": [0.7] * 60}
    f = truncation_check(_columns_run(tmp_path, {**columns, "pi_topk_mass": [0.8] * 60}))
    assert f.evidence["moved"] == pytest.approx(-0.5, abs=1e-6) and f.verdict == "ok"
    assert "μ moves none of the mass" in f.summary and "by 50.0% of π's outside mass" in f.summary
    assert "-" not in f.summary.replace("top-K", "")


def test_tempered_mu_with_truncation_warns_from_the_settings(tmp_path):
    rng = np.random.default_rng(6)
    mu = np.log(rng.uniform(0.05, 0.9, 100))
    old = mu + rng.normal(0, 0.01, 100)
    manifest = {"sampling": {"temperature": 0.7, "top_p": 0.9, "logprobs": "tempered"}}
    f = truncation_check(_pairs_run(tmp_path, mu, np.minimum(old, -1e-3), manifest=manifest))
    assert f.verdict == "warning"
    assert f.summary.startswith("run.json says tempered log μ (before truncation) with top_p 0.9: the tokens were")
    assert "from_sglang(processed=True)" in f.fix and "sampling mask" in f.fix
    processed = {"sampling": {"temperature": 0.7, "top_p": 0.9, "logprobs": "processed"}}
    g = truncation_check(_pairs_run(tmp_path / "p", mu, np.minimum(old, -1e-3), manifest=processed))
    assert "contradict" in g.summary  # processed μ over a truncated support, yet no bias in the data


def test_where_names_a_position_only_with_enough_rows_and_gives_their_count(tmp_path):
    from trustlens.analysis.diagnosis.level import WHERE_MIN_ROWS, where_check

    # 60 rows at positions 4–15 (|d| 0.01), 28 rows at 16–63 (|d| 6.5), weighted 33 each
    n_small, n_big = 60, 28
    pos = [0] * 60 + [5] * n_small + [20] * n_big
    mu = [-1.0] * 60 + [-1.0] * n_small + [-1.0] * n_big
    old = [-1.0] * 60 + [-1.01] * n_small + [-7.5] * n_big
    weight = [1.0] * (60 + n_small) + [33.0] * n_big
    base = {"step": [0] * len(mu), "sample": list(range(len(mu))), "token_id": [0] * len(mu)}
    columns = {"pos": pos, "mu_logp": mu, "old_logp": old, "pi_logp": old, "weight": weight}
    f = where_check(inputs_of(load_run(write_run(tmp_path / "run", tokens={**base, **columns}, rules=[]))))
    assert n_big < WHERE_MIN_ROWS <= n_small
    assert "largest at position 4–15 (mean |Δ log p| 0.0100 nats over 60 rows standing for 60 tokens)" in f.summary
    rows = {r["pos"]: (r["rows"], r["tokens"]) for r in f.evidence["by_position"]}
    assert rows["16–63"] == (28, 28 * 33.0)


def test_level_below_the_range_says_below(tmp_path):
    path = write_run(
        tmp_path / "run",
        tokens={
            "step": [0] * 100,
            "sample": list(range(100)),
            "pos": [1] * 100,
            "token_id": [0] * 100,
            "mu_logp": [-0.7] * 100,
            "old_logp": [-0.7] * 100,
            "pi_logp": [-0.7] * 100,
        },
        rules=[],
    )
    level = {f.check: f for f in doctor(path)}["level"]
    assert level.verdict == "ok" and level.summary.startswith("below the published range: k3 0")


def test_truncation_is_exact_with_the_sampling_masks(tmp_path):
    # μ renormalised over a support holding m = 0.8 of π_old: d = −log 0.8 on every token, and 0
    # once π_old is renormalised over the support (log π_old − log m). The masks make it
    # truncation_bias's to judge, in closed form; the truncation check says so and stays ok
    n = 80
    old = [math.log(0.4)] * n
    mu = [math.log(0.4 / 0.8)] * n
    columns = {"mu_logp": mu, "old_logp": old, "pi_logp": old, "pi_support_mass": [0.8] * n}
    inp = _columns_run(tmp_path, columns)
    f = truncation_bias_check(inp)
    assert f.verdict == "problem" and f.fix
    assert f.evidence["mean_d"] == pytest.approx(-math.log(0.8), abs=1e-6)
    assert f.evidence["mean_d_on_support"] == pytest.approx(0.0, abs=1e-6)
    plain = truncation_check(inp)
    assert (plain.evidence["form"], plain.verdict) == ("sampling mask", "ok") and "truncation_bias" in plain.summary
    # π_old renormalised on the same support by the trainer: d = 0, nothing left to explain
    same = {**columns, "old_logp": mu, "pi_logp": mu}
    assert truncation_bias_check(_columns_run(tmp_path / "same", same)).verdict == "ok"


def test_level_judges_the_fresh_tokens_when_staleness_is_recorded(tmp_path):
    # 100 fresh tokens with a tiny mismatch, 100 tokens 3 updates stale with ρ = 4: the engine is fine
    fresh_mu, stale_mu = [math.log(0.5)] * 100, [math.log(0.1)] * 100
    old = [math.log(0.5001)] * 100 + [math.log(0.4)] * 100
    columns = {
        "mu_logp": fresh_mu + stale_mu,
        "old_logp": old,
        "pi_logp": old,
        "staleness": [0.0] * 100 + [3.0] * 100,
    }
    path = write_run(
        tmp_path / "run",
        tokens={"step": [0] * 200, "sample": list(range(200)), "pos": [1] * 200, "token_id": [0] * 200, **columns},
        rules=[],
    )
    level = {f.check: f for f in doctor(path)}["level"]
    assert level.verdict == "ok"
    assert level.evidence["staleness"]["fresh_rows"] == 100
    assert level.evidence["staleness"]["stale_share"] == pytest.approx(0.5)
    assert level.evidence["k3_kl"] == pytest.approx(0.5001 / 0.5 - 1 - math.log(0.5001 / 0.5), rel=1e-3)
    assert (
        "over the 100 tokens sampled with π_old's weights (50 % of tokens stale, mean staleness 1.50" in level.summary
    )
    # without the column the stale half reads as the engine's: ρ = 4 on 50% of the tokens
    del columns["staleness"]
    path = write_run(
        tmp_path / "bare",
        tokens={"step": [0] * 200, "sample": list(range(200)), "pos": [1] * 200, "token_id": [0] * 200, **columns},
        rules=[],
    )
    assert {f.check: f for f in doctor(path)}["level"].verdict == "problem"


def test_raw_share_of_a_mu_far_from_both_candidates_is_not_a_finding(tmp_path):
    # log π = −1, log π_raw = −0.5; log μ scattered ±0.6 around −0.9 (a stale engine): nearer raw
    # on 40% of the tokens by chance, but nearer log π on average
    mu = [-0.3] * 20 + [-1.5] * 30
    inp = _columns_run(
        tmp_path, {"mu_logp": mu, "old_logp": [-1.0] * 50, "pi_logp": [-1.0] * 50, "pi_logp_raw": [-0.5] * 50}
    )
    stats = raw_share(inp.pairs)
    assert stats["share_nearer_raw"] == pytest.approx(0.4)
    assert stats["mean_abs_to_raw"] == pytest.approx((20 * 0.2 + 30 * 1.0) / 50)
    assert stats["mean_abs_to_pi"] == pytest.approx((20 * 0.7 + 30 * 0.5) / 50)
    f = temperature_check(inp)
    assert f.verdict == "ok" and "nearer after it on average" in f.summary


def _lagged_run(path, config=None, staleness=None):
    """Step 0: log μ = log π (processed), the engine fresh; steps 1–2: log μ an older policy's that
    happens to sit at log π_raw on 150 uncertain tokens (log π = −1, log π_raw = −0.5)."""
    n = 60
    mu = [-1.0 + 0.02 * (i % 3 - 1) for i in range(n)] + [-0.5 + 0.02 * (i % 3 - 1) for i in range(2 * n)]
    tokens = {
        "step": [0] * n + [1] * n + [2] * n,
        "sample": list(range(3 * n)),
        "pos": [0] * (3 * n),
        "mu_logp": mu,
        "old_logp": [-1.0] * (3 * n),
        "pi_logp": [-1.0] * (3 * n),
        "pi_logp_raw": [-0.5] * (3 * n),
    }
    if staleness is not None:
        tokens["staleness"] = staleness
    return inputs_of(load_run(write_run(path, tokens=tokens, rules=[], config=config)))


def test_a_stale_mu_is_not_blamed_on_the_temperature(tmp_path):
    # without word of staleness, μ nearer log π_raw on 2/3 of the tokens reads as raw log-probs
    bare = temperature_check(_lagged_run(tmp_path / "bare"))
    assert bare.verdict == "problem" and bare.fix.startswith("take log μ after the temperature")
    # run.json says rollout_lag 16: the temperature is judged on step 0, where μ is π_old's weights'
    lagged = temperature_check(_lagged_run(tmp_path / "lag", config={"rollout_lag": 16, "temperature": 0.5}))
    assert lagged.verdict == "ok" and lagged.fix == ""
    assert lagged.evidence["tokens"] == 60 and lagged.evidence["share_nearer_raw"] == 0.0
    assert "on the tokens sampled with π_old's weights (rollout_lag 16: μ is up to 16 steps stale)" in lagged.summary
    # the per-token staleness column says the same
    column = temperature_check(_lagged_run(tmp_path / "col", staleness=[0.0] * 60 + [4.0] * 120))
    assert column.verdict == "ok" and column.evidence["stale"] == "the per-token staleness column"
    # too few fresh tokens: the check cannot tell, and does not blame the temperature
    few = temperature_check(_lagged_run(tmp_path / "few", staleness=[0.0] * 10 + [4.0] * 170))
    assert few.verdict == "ok" and few.summary.startswith("too few uncertain tokens (10)")


def test_the_checks_name_the_kind_of_mu(tmp_path):
    rng = np.random.default_rng(7)
    mu = -rng.uniform(0.05, 4.0, 200)
    manifest = {"sampling": {"temperature": 0.7, "logprobs": "processed"}}
    inp = _pairs_run(tmp_path, mu, mu, manifest=manifest)
    for check in (temperature_check, truncation_check):
        f = check(inp)
        assert f.verdict == "ok"
        assert f.summary.endswith("(run.json: processed log μ, of the distribution the tokens were drawn from)")


def test_checks_runs_only_those_checks(tmp_path):
    every = doctor(bench.write_planted(tmp_path / "shifted", "shifted", 1))
    some = doctor(load_run(tmp_path / "shifted"), ["truncation", "level", "shift"])
    assert sorted(f.check for f in some) == ["level", "shift", "truncation"]
    # the same findings (polars' parallel sums may differ in the last bits from call to call)
    said = [(f.check, f.verdict, f.summary) for f in every if f.check in ("truncation", "level", "shift")]
    assert [(f.check, f.verdict, f.summary) for f in some] == said
    alone = doctor(load_run(tmp_path / "shifted"), ["level"])  # no cause among them: nothing to follow from
    assert alone[0].verdict == "problem" and "may_follow_from" not in alone[0].evidence
    with pytest.raises(ValueError, match="checks"):
        doctor(load_run(tmp_path / "shifted"), ["levle"])


def test_truncation_judges_the_fresh_tokens_of_a_stale_engine(tmp_path):
    """An engine 3 updates stale is an older policy: on its 60 stale positions it holds all its
    mass on its top-K set (Σ_S μ = 1) where π_old holds 0.8, which reads as μ renormalised over
    a truncated support (moved = 0.5 over all 120). The 60 fresh positions have Σ_S μ = Σ_S π =
    0.8: judged on them, nothing moved."""
    logp = [-0.5] * 120
    columns = {
        "mu_logp": logp,
        "old_logp": logp,
        "pi_logp": logp,
        "mu_topk_mass": [0.8] * 60 + [1.0] * 60,
        "pi_topk_mass": [0.8] * 120,
        "staleness": [0.0] * 60 + [3.0] * 60,
    }
    f = truncation_check(_columns_run(tmp_path / "fresh", columns))
    assert f.verdict == "ok" and f.evidence["tokens"] == 60 and abs(f.evidence["moved"]) < 1e-6
    assert f.evidence["stale"] == "the per-token staleness column"
    assert "on the tokens sampled with π_old's weights (the per-token staleness column)" in f.summary
    del columns["staleness"]
    f = truncation_check(_columns_run(tmp_path / "bare", columns))
    assert f.verdict == "warning" and f.evidence["moved"] == pytest.approx(0.5, abs=1e-6)

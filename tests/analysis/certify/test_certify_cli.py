"""`trustlens certify` end to end: exit 0 certified, 1 not, 2 bad input (one line), --require,
--json, hostile token text printed inert; and the three built-in engines on one-step runs:
fp32_exact certified, bf16 not, batch_variant not with the batch rows named."""

import json
import subprocess
import sys

import numpy as np
import pytest

from trustlens.analysis.certify import certify
from trustlens.analysis.diagnosis import doctor
from trustlens.cli import main
from trustlens.run.tables import write_run

N = 40


def _write(path, mu, old, **columns):
    tokens = {
        "step": [0] * N,
        "sample": [i // 10 for i in range(N)],
        "pos": [i % 10 for i in range(N)],
        "token": ["\x1b[31mred\u202e"] + ["x"] * (N - 1),
        "mu_logp": [float(x) for x in mu],
        "old_logp": None if old is None else [float(x) for x in old],
        "pi_logp": [float(x) for x in (mu if old is None else old)],
        **columns,
    }
    return write_run(path, tokens={k: v for k, v in tokens.items() if v is not None})


@pytest.fixture
def runs(tmp_path):
    mu = -np.random.default_rng(0).uniform(0.01, 3.0, N).astype(np.float32)
    off = mu.copy()
    off[0] = np.nextafter(mu[0], np.float32(-np.inf))
    return {
        "exact": _write(tmp_path / "exact", mu, mu.copy()),
        "off": _write(tmp_path / "off", mu, off),
        "no_mu": write_run(tmp_path / "no_mu", tokens={"step": [0], "sample": [0], "pos": [0], "pi_logp": [-1.0]}),
    }


def test_exit_codes(runs, tmp_path, capsys):
    assert main(["certify", str(runs["exact"])]) == 0
    assert capsys.readouterr().out.startswith("CERTIFIED (exact, --require bit-exact)")
    assert main(["certify", str(runs["off"])]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NOT CERTIFIED") and "first at step 0 sample 0 pos 0" in out
    for bad in (runs["no_mu"], tmp_path / "missing"):
        assert main(["certify", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("trustlens certify: error: ") and err.count("\n") == 1
    assert main(["certify", str(runs["exact"]), "--require", "distribution"]) == 2  # no top-K recorded
    assert "no top-K recorded" in capsys.readouterr().err


def test_hostile_token_text_is_inert(runs, capsys):
    main(["certify", str(runs["off"])])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    assert "'\\x1b[31mred\\u202e'" in out
    main(["certify", str(runs["off"]), "--json"])
    raw = capsys.readouterr().out
    assert "\x1b" not in raw and "\u202e" not in raw
    got = json.loads(raw)
    assert got["tokens"]["first_differing"][0]["token"] == "\x1b[31mred\u202e"
    assert (got["certified"], got["require"], got["verdict"]) == (False, "bit-exact", "not equal")


def test_bf16_columns_say_what_precision_allows(tmp_path, capsys):
    old = -np.random.default_rng(1).uniform(0.01, 3.0, N).astype(np.float32)
    bits = old.view(np.uint32).astype(np.uint64)
    mu = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)  # bf16
    path = _write(tmp_path / "bf16", mu, old)
    assert main(["certify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "verdict       within precision" in out and "recorded in bf16: equality holds only to its 8" in out
    assert main(["certify", str(path), "--require", "precision"]) == 0


def test_subprocess_exit_status(runs):
    done = subprocess.run(
        [sys.executable, "-m", "trustlens.cli", "certify", str(runs["off"]), "--json"], capture_output=True, text=True
    )
    assert done.returncode == 1 and json.loads(done.stdout)["tokens"]["equal"] == N - 1


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """One-step built-in runs (4 problems × 4 samples, 2 updates): engine -> its run path."""
    from trustlens.train.config import config_from_preset
    from trustlens.train.trainer import train

    folder = tmp_path_factory.mktemp("engines")
    settings = {
        "fp32_exact": dict(rollout_precision="fp32_exact"),
        "bf16": dict(rollout_precision="bf16"),
        "batch_variant": dict(rollout_precision="fp32_exact", engine="batch_variant"),
    }
    for name, kw in settings.items():
        cfg = config_from_preset("quick", steps=1, eval_size=0, **kw)
        train(cfg, folder / name, progress=False)
    return {name: folder / name for name in settings}


def test_the_three_engines(engines):
    exact = certify(engines["fp32_exact"])
    assert exact.verdict == "bit-exact" and exact.certified("distribution")
    assert exact.distribution["pi_equals_old"] == 1.0
    assert not certify(engines["bf16"]).certified("precision")
    split = certify(engines["batch_variant"])
    assert split.verdict == "not equal"
    # 16 samples, engine batches of 12: rows 12–15 are the partial batch
    assert {r["row"] for r in split.tokens["by_row"] if r["differing"]} <= {12, 13, 14, 15}
    assert any(w.startswith("batch composition: only rows 1") for w in split.where())
    found = {f.check: f for f in doctor(engines["batch_variant"])}
    assert found["exact"].verdict == "warning" and "batch composition" in found["exact"].summary
    assert {f.check: f.verdict for f in doctor(engines["fp32_exact"])}["exact"] == "ok"

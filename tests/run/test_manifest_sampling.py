"""run.json `sampling` and `model_kind`: how μ was made, checked at TokenRecorder's construction,
completed with every key, kept when a run is resumed."""

import json

import pytest
import torch

import trustlens
from trustlens.run.manifest import SAMPLING_KEYS, normalise_sampling


def test_sampling_is_completed_and_filters_that_are_off_are_none():
    assert normalise_sampling({"temperature": 0.6, "top_p": 1.0, "top_k": -1, "min_p": 0.0}) == {
        "temperature": 0.6,
        "top_p": None,
        "top_k": None,
        "min_p": None,
        "logprobs": None,
        "processors": None,
    }
    given = {"top_k": 0, "top_p": 0.8, "min_p": 0.05, "logprobs": "tempered", "processors": ["logit_bias", "grammar"]}
    assert normalise_sampling(given) == {
        "temperature": None,
        "top_p": 0.8,
        "top_k": None,
        "min_p": 0.05,
        "logprobs": "tempered",
        "processors": ["grammar", "logit_bias"],
    }
    assert normalise_sampling({"logprobs": "raw", "processors": []})["processors"] == []
    assert normalise_sampling(None) is None


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"temp": 1.0}, r"unknown keys \['temp'\]"),
        ({"temperature": 0}, r"sampling\['temperature'\] must be finite and > 0, got 0.0"),
        ({"temperature": float("nan")}, r"sampling\['temperature'\] must be finite"),
        ({"temperature": float("inf")}, r"sampling\['temperature'\] must be finite"),
        ({"temperature": "0.5"}, r"sampling\['temperature'\] must be a number"),
        ({"top_p": 0.0}, r"sampling\['top_p'\] must be in \(0, 1\], got 0.0"),
        ({"top_p": 1.2}, r"sampling\['top_p'\] must be in \(0, 1\]"),
        ({"min_p": 1.0}, r"sampling\['min_p'\] must be in \[0, 1\)"),
        ({"top_k": 2.5}, r"sampling\['top_k'\] must be an int"),
        ({"top_k": -2}, r"sampling\['top_k'\] must be an int"),
        ({"logprobs": "logits"}, r"sampling\['logprobs'\] must be one of raw, tempered, processed"),
        ({"processors": ["penalty"]}, r"sampling\['processors'\] must be a list of repetition_penalty, "),
        ({"processors": "logit_bias"}, r"sampling\['processors'\] must be a list of"),
        ([0.5], "sampling must be a mapping"),
    ],
)
def test_bad_sampling_is_refused_naming_the_key(tmp_path, sampling, message):
    with pytest.raises(ValueError, match=message):
        trustlens.TokenRecorder(tmp_path / "run", sampling=sampling)
    assert not (tmp_path / "run" / "run.json").exists()


def record_one(recorder, step: int) -> None:
    ids = torch.tensor([[5, 6]])
    recorder.record(
        step,
        token_ids=ids,
        response_mask=torch.ones_like(ids, dtype=torch.bool),
        pi_logp=torch.tensor([[-0.5, -0.1]]),
        mu_logp=torch.tensor([[-0.4, -0.2]]),
        advantages=torch.tensor([1.0]),
    )


def test_run_json_holds_sampling_and_model_kind_and_resume_keeps_them(tmp_path):
    path = tmp_path / "run"
    with trustlens.TokenRecorder(path, sampling={"temperature": 0.7, "top_p": 0.9}, model_kind="moe") as rec:
        record_one(rec, 0)
    manifest = trustlens.load_run(path).manifest
    expected = {"temperature": 0.7, "top_p": 0.9, "top_k": None, "min_p": None, "logprobs": None, "processors": None}
    assert manifest["sampling"] == expected
    assert set(manifest["sampling"]) == set(SAMPLING_KEYS)
    assert manifest["model_kind"] == "moe"
    with trustlens.TokenRecorder(path, resume=True) as rec:  # reopened without them: kept
        record_one(rec, 1)
    manifest = json.loads((path / "run.json").read_text())
    assert manifest["sampling"]["temperature"] == 0.7 and manifest["model_kind"] == "moe"
    assert len(manifest["resumed"]) == 1


def test_defaults_and_a_run_written_before_the_fields(tmp_path):
    path = tmp_path / "run"
    with trustlens.TokenRecorder(path) as rec:
        record_one(rec, 0)
    manifest = json.loads((path / "run.json").read_text())
    assert manifest["sampling"] is None and manifest["model_kind"] == "dense"
    for key in ("sampling", "model_kind"):  # as a run written by an earlier trustlens
        del manifest[key]
    (path / "run.json").write_text(json.dumps(manifest))
    with trustlens.TokenRecorder(path, resume=True, sampling={"temperature": 1.0, "logprobs": "processed"}) as rec:
        record_one(rec, 1)
    manifest = json.loads((path / "run.json").read_text())
    assert manifest["sampling"]["logprobs"] == "processed" and manifest["model_kind"] == "dense"


def test_model_kind_is_checked(tmp_path):
    with pytest.raises(ValueError, match="model_kind must be one of dense, moe, got 'MoE'"):
        trustlens.TokenRecorder(tmp_path / "run", model_kind="MoE")

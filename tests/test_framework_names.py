"""The table of other frameworks' names (trustlens.metrics.FRAMEWORK_NAMES) against the
frameworks' source at the pinned releases (tests/data/framework_sources.json, rebuilt by
tests/data/refresh_framework_sources.py from clones of the frameworks), and docs/metrics.md."""

import json
import re
from pathlib import Path

import pytest

from trustlens.metrics import (
    FRAMEWORK_NAMES,
    FRAMEWORKS,
    METRICS,
    detect_framework,
    framework_table,
    metric,
    trustlens_name,
)

ROOT = Path(__file__).resolve().parent.parent
SOURCES = json.loads((ROOT / "tests" / "data" / "framework_sources.json").read_text())


def _excerpts(framework: str, logged: str) -> list[dict]:
    return [r for r in SOURCES if (r["framework"], r["logged"]) == (framework, logged)]


@pytest.mark.parametrize("entry", FRAMEWORK_NAMES, ids=lambda e: f"{e.framework}:{e.logged}")
def test_every_entry_is_logged_so_in_the_pinned_source(entry):
    found = _excerpts(entry.framework, entry.logged)
    assert found, f"no pinned excerpt of {entry.framework} {entry.logged}"
    for r in found:
        assert r["string"] in r["text"] and r["line"] > 0
    # every word of the logged name but its statistic is in the lines that log it
    text = " ".join(r["text"] for r in found)
    for part in entry.logged.split("/"):
        if re.fullmatch(r"[A-Za-z_-]+", part) and part not in ("mean", "max", "min"):
            assert part in text, (entry.logged, part)
    assert metric(entry.name).name in METRICS


def test_each_framework_is_pinned_at_one_commit():
    for framework, release in FRAMEWORKS.items():
        commits = {
            r["commit"] for r in SOURCES if r["framework"] == framework and not r["file"].startswith("transformers/")
        }
        assert len(commits) == 1, (framework, commits)
        (commit,) = commits
        # a release tag's commit (40 hex digits), a commit the release names, or the installed package
        assert re.fullmatch("[0-9a-f]{40}", commit) or f"{release.lstrip('v')} (installed)" in commit
        if re.fullmatch("[0-9a-f]{7}", release):
            assert commit.startswith(release)


def test_no_excerpt_without_an_entry():
    entries = {(e.framework, e.logged) for e in FRAMEWORK_NAMES}
    assert {(r["framework"], r["logged"]) for r in SOURCES} == entries


def test_registry_verl_names_are_the_table_s():
    for m in METRICS.values():
        if m.verl is not None:
            assert trustlens_name("verl", m.verl) == m.name, m.name


def test_lookup_prefixes_patterns_and_unknown_names():
    assert trustlens_name("trl", "train/reward") == trustlens_name("trl", "reward") == "reward/mean"
    assert trustlens_name("verl", "val-core/openai/gsm8k/acc/mean@1") == "eval/accuracy"
    assert trustlens_name("verl", "val-core/openai/gsm8k/acc/mean@4") == "val-core/openai/gsm8k/acc/mean@4"
    assert trustlens_name("prime-rl", "mismatch_kl/all/mean") == "k3_kl"  # prime-rl's mismatch_kl is K3
    assert trustlens_name("openrlhf", "train/vllm_kl") == "mismatch_kl"
    assert trustlens_name("verl", "actor/pg_loss") == "actor/pg_loss"
    assert trustlens_name(None, "actor/entropy") == "actor/entropy"
    with pytest.raises(ValueError, match="framework must be one of"):
        trustlens_name("verll", "x")


def test_eval_accuracy_templates_take_only_the_accuracy():
    # one name per data source, environment or agent; the names logged beside it are kept
    accuracy = {
        "openrlhf": ["eval/eval_gsm8k_pass1", "eval/eval_openai/gsm8k_pass1"],
        "slime": ["eval/aime", "eval/aime-2024"],
        "prime-rl": ["eval/gsm8k/effective/default/avg@8", "eval/math-env/effective/solver/avg@1"],
    }
    others = {
        "openrlhf": [
            "eval/eval_gsm8k_pass4",
            "eval/eval_gsm8k_pass16",
            "eval/eval_gsm8k_response_length_mean",
            "eval/eval_gsm8k_truncated_rate",
            "eval/eval_num_samples",
            "eval/global_step",
        ],
        "slime": [
            "eval/step",
            "eval/aime-truncated_ratio",
            "eval/aime-pass@1",
            "eval/aime-pass@16",
            "eval/aime/response_len/mean",
            "eval/aime/truncated_ratio",
        ],
        "prime-rl": [
            "eval/gsm8k/all/default/avg@8",
            "eval/gsm8k/effective/default/pass@8",
            "eval/gsm8k/effective/default/reward/mean",
            "eval/gsm8k/policy_version",
        ],
    }
    for framework, names in accuracy.items():
        assert [trustlens_name(framework, n) for n in names] == ["eval/accuracy"] * len(names), framework
    for framework, names in others.items():
        assert [trustlens_name(framework, n) for n in names] == names, framework


def test_framework_told_from_the_names():
    assert detect_framework(["actor/entropy", "critic/score/mean", "timing_s/gen"]) == "verl"
    assert detect_framework(["train/gen_kl_error", "train/reward"]) == "nemo-rl"
    assert detect_framework(["k3_kl", "eval/accuracy", "blocked/ppo/pos"]) == "trustlens"
    assert detect_framework(["train/reward"]) is None  # TRL, NeMo-RL and OpenRLHF all log it
    assert detect_framework(["loss"]) is None
    # slime's template eval/* takes OpenRLHF's eval names too, but counts as one entry
    openrlhf = ["train/vllm_kl", "eval/eval_gsm8k_pass1", "eval/eval_gsm8k_pass4", "eval/eval_gsm8k_truncated_rate"]
    assert detect_framework([*openrlhf, "eval/eval_num_samples", "eval/eval_response_length_mean"]) == "openrlhf"


def test_docs_hold_the_generated_table():
    doc = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert framework_table() in doc

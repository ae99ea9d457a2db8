"""A rule lives in the run that evaluated it: the manifest keeps every field needed to evaluate it
again, so the analyses work on a run with a custom rule without the rule's code."""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch

from trustlens import TokenRecorder, load_run
from trustlens.analysis import (
    blocked_per_step,
    confusion_matrix,
    rule_boundaries,
    step_summary,
    threshold_sweep,
    with_rules,
)
from trustlens.rules import RULES, Rule

CUSTOM = [
    Rule("my_clip", 0.1, 0.3, "mu", "ratio", "a tighter ratio clip"),
    Rule("my_kl_old", 0.02, 0.04, "old", "binary_kl", "binary KL against π_old"),
    Rule("my_tis", 0.2, 0.2, "old", "ratio", "clip with TIS", weight="tis", tis_cap=3.0),
    Rule("my_cispo", None, 0.5, "mu", None, "CISPO with a higher cap", weight="cispo"),
    Rule("my_topk", 0.1, 0.1, "mu", "topk_tv", "top-K TV mask"),
]


@pytest.mark.parametrize("rule", [*RULES.values(), *CUSTOM], ids=lambda r: r.name)
def test_manifest_entry_round_trips(rule):
    entry = json.loads(json.dumps(rule.manifest_entry()))  # as run.json stores it
    assert Rule.from_manifest(rule.name, entry) == rule


def _record(path, rules):
    g = torch.Generator().manual_seed(3)
    B, T = 8, 12
    with TokenRecorder(path, rules=rules) as rec:
        for step in range(4):
            mu = torch.log(torch.rand(B, T, generator=g).clamp(min=1e-3))
            old = (mu + 0.05 * torch.randn(B, T, generator=g)).clamp(max=0)
            pi = (old + 0.3 * torch.randn(B, T, generator=g)).clamp(max=0)
            rec.record(
                step,
                token_ids=torch.randint(0, 50, (B, T), generator=g),
                response_mask=torch.ones(B, T, dtype=torch.bool),
                pi_logp=pi,
                mu_logp=mu,
                old_logp=old,
                advantages=torch.randn(B, generator=g),
            )
    return load_run(path)


def test_a_custom_rule_is_evaluated_again_without_its_code(tmp_path):
    run = _record(tmp_path / "run", [CUSTOM[0], CUSTOM[1], "ppo"])
    assert run.rules["my_clip"]["measure"] == "ratio"
    assert run.rules["my_kl_old"]["anchor"] == "old"
    sweep = threshold_sweep(run)  # base: the run's own rules, custom ones included
    assert set(sweep["rule"]) == {"my_clip", "my_kl_old", "ppo"}
    at_one = sweep.filter(pl.col("scale") == 1.0).sort("rule")
    recorded = blocked_per_step(run).group_by("rule").agg(pl.col("blocked").sum()).sort("rule")
    assert at_one["blocked"].to_list() == recorded["blocked"].to_list()
    # with_rules decides a custom rule from the manifest alone: equal to the recorded column
    again = with_rules(run.tokens.drop("blocked_my_clip"), ["my_clip"], base=run.rules).collect()
    stored = run.tokens.collect()
    assert again["blocked_my_clip"].to_list() == stored["blocked_my_clip"].to_list()
    assert set(confusion_matrix(run)["rule_a"]) == {"my_clip", "my_kl_old", "ppo"}
    assert step_summary(run).height == 4


def test_a_run_without_the_measure_still_sweeps_its_builtin_rules(tmp_path):
    """A custom rule of a run written before manifests kept its measure is left out with a
    warning; the run's built-in rules are swept."""
    run = _record(tmp_path / "old", [CUSTOM[0], "ppo"])
    manifest_path = tmp_path / "old" / "run.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["rules"]["my_clip"] = {
        k: manifest["rules"]["my_clip"][k] for k in ("low", "high", "anchor", "description")
    }
    manifest_path.write_text(json.dumps(manifest))
    run = load_run(tmp_path / "old")
    with pytest.warns(UserWarning, match="rule 'my_clip' left out"):
        sweep = threshold_sweep(run)
    assert set(sweep["rule"]) == {"ppo"}
    with pytest.raises(ValueError, match="my_clip"):
        threshold_sweep(run, ["my_clip"])


def test_a_runs_own_record_is_read_leniently_and_typed_thresholds_strictly(tmp_path):
    """run.json written by a newer version (a field this one does not know) or before entries kept
    a custom rule's measure: the dashboard's queries still run, with a warning naming the rule;
    the same mapping typed by a caller is refused."""
    _record(tmp_path / "run", [CUSTOM[0], "ppo", "dppo_binary_tv"])
    manifest_path = tmp_path / "run" / "run.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["rules"]["ppo"]["future_field"] = 1
    del manifest["rules"]["my_clip"]["measure"]
    manifest_path.write_text(json.dumps(manifest))
    run = load_run(tmp_path / "run")
    with pytest.warns(UserWarning) as caught:
        wide = with_rules(run.tokens, ["dppo_binary_kl"], base=run.rules).collect()
        curves = rule_boundaries(run.rules)
    said = " ".join(str(w.message) for w in caught)
    assert "'future_field'" in said and "rule 'my_clip' left out" in said
    assert "blocked_dppo_binary_kl" in wide.columns
    assert set(curves["rule"]) == {"ppo", "dppo_binary_tv"}
    typed = dict(run.rules)
    with pytest.raises(ValueError, match=r"my_clip.*names no measure"):
        rule_boundaries(typed)
    del typed["my_clip"]
    with pytest.raises(ValueError, match="unknown key 'future_field'"):
        rule_boundaries(typed)

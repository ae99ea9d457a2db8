"""Every name that README.md, docs/ or notebooks/ showed at some point of the project's history
still imports, or gives a DeprecationWarning naming the place it lives now (issue 46): moved
modules through trustlens.MOVED_MODULES, moved names through trustlens.core.moved_names.

DOCUMENTED was built from `git log -p bea0ccc -- README.md docs notebooks`: every `from trustlens…
import …` name and every dotted `trustlens.…` path shown (the Parquet metadata keys
trustlens.schema_version, trustlens.version and trustlens.world_size are not Python names).
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import types
import warnings

import pytest

import trustlens
from trustlens.core import moved_names
from trustlens.core.extras import missing_extra

# "module" or "module:name" as documented -> where it lives now (the same object), None: it
# still lives there
DOCUMENTED: list[tuple[str, str | None]] = [
    ("trustlens.analysis", None),
    ("trustlens.analysis.alert_levels", None),
    ("trustlens.analysis.alert_levels:MISMATCH_K3_NORMAL", None),
    ("trustlens.analysis.buckets:in_memory", None),
    ("trustlens.analysis.claims", None),
    ("trustlens.analysis.claims:alert_leads", None),
    ("trustlens.analysis.claims:measure_claims", None),
    ("trustlens.analysis.collapse", None),
    ("trustlens.analysis.drivers", None),
    ("trustlens.analysis.findings", "trustlens.analysis.paper_findings"),
    (
        "trustlens.analysis.findings:blocked_anchor_quantiles",
        "trustlens.analysis.paper_findings:blocked_anchor_quantiles",
    ),
    ("trustlens.analysis.findings:blocked_token_anchor", "trustlens.analysis.paper_findings:blocked_token_anchor"),
    ("trustlens.analysis.findings:motivating_examples", "trustlens.analysis.paper_findings:motivating_examples"),
    ("trustlens.analysis.findings:over_updates_per_step", "trustlens.analysis.paper_findings:over_updates_per_step"),
    ("trustlens.analysis.mismatch:logged_per_step", None),
    ("trustlens.analysis.seed_text", None),
    ("trustlens.analysis.seed_text:format_seed_table", None),
    ("trustlens.analysis.seeds", None),
    ("trustlens.analysis.seeds:format_seed_table", "trustlens.analysis.seed_text:format_seed_table"),
    ("trustlens.analysis.seeds:run_outcomes", None),
    ("trustlens.analysis.seeds:seed_table", None),
    ("trustlens.analysis.sweep", None),
    ("trustlens.analysis.sweep:threshold_sweep", None),
    ("trustlens.analysis.tokens", None),
    ("trustlens.analysis.tokens:TokenQuery", None),
    ("trustlens.analysis.tokens:alert_tokens", None),
    ("trustlens.analysis.tokens:filter_tokens", None),
    ("trustlens.analysis.tokens:sample_tokens", None),
    ("trustlens.analysis:detect_collapse", None),
    ("trustlens.analysis:doctor", None),
    ("trustlens.analysis:exact_aggregates", None),
    ("trustlens.analysis:mismatch_per_step", None),
    ("trustlens.analysis:run_outcomes", None),
    ("trustlens.analysis:with_rules", None),
    ("trustlens.cli", None),
    ("trustlens.core.render", None),
    ("trustlens.core.render:RULE_COLOURS", None),
    ("trustlens.core.render:colored_tokens_html", None),
    ("trustlens.core.render:legend_html", None),
    ("trustlens.divergence", None),
    ("trustlens.divergence.vocab_chunks", None),
    ("trustlens.divergence:binary_kl", None),
    ("trustlens.divergence:binary_tv", None),
    ("trustlens.divergence:exact_divergence", None),
    ("trustlens.divergence:topk_divergence", None),
    ("trustlens.divergence:topk_from_logits", None),
    ("trustlens.export:export_tensorboard", None),
    ("trustlens.export:step_scalars", None),
    ("trustlens.integrations.engines", None),
    ("trustlens.integrations.engines:from_sglang", None),
    ("trustlens.integrations.engines:from_vllm", None),
    ("trustlens.integrations.engines:vllm_sampling", None),
    ("trustlens.integrations.openrlhf", None),
    ("trustlens.integrations.openrlhf:setup", None),
    ("trustlens.integrations.trl", None),
    ("trustlens.integrations.trl:TrustLensGRPOTrainer", None),
    ("trustlens.integrations.trl:with_trustlens", None),
    ("trustlens.integrations.verl", None),
    ("trustlens.integrations.verl:setup", None),
    ("trustlens.integrations.verl:verl_active_rule", None),
    ("trustlens.live", None),
    ("trustlens.live.stop:first_at", None),
    ("trustlens.live:DoctorConfig", None),
    ("trustlens.live:LiveAlert", None),
    ("trustlens.live:LiveMonitor", None),
    ("trustlens.live:live_alerts", None),
    ("trustlens.loss", "trustlens.rules.loss"),
    ("trustlens.loss:policy_loss", "trustlens.rules.loss:policy_loss"),
    ("trustlens.metrics", None),
    ("trustlens.notebook", None),
    ("trustlens.notebook:sample_runs", None),
    ("trustlens.notebook:setup", None),
    ("trustlens.plots", None),
    ("trustlens.plots:safe_text", None),
    ("trustlens.record", None),
    ("trustlens.recorder", "trustlens.record"),
    ("trustlens.render", "trustlens.core.render"),
    ("trustlens.render:RULE_COLOURS", "trustlens.core.render:RULE_COLOURS"),
    ("trustlens.render:colored_tokens_html", "trustlens.core.render:colored_tokens_html"),
    ("trustlens.render:legend_html", "trustlens.core.render:legend_html"),
    ("trustlens.report:write_report", None),
    ("trustlens.rule_columns", "trustlens.rules.columns"),
    ("trustlens.rule_columns:evaluate_columns", "trustlens.rules.columns:evaluate_columns"),
    ("trustlens.rule_columns:rule_columns", "trustlens.rules.columns:rule_columns"),
    ("trustlens.rules", None),
    ("trustlens.rules.columns", None),
    ("trustlens.rules.columns:evaluate_columns", None),
    ("trustlens.rules.columns:rule_columns", None),
    ("trustlens.rules.loss", None),
    ("trustlens.rules.loss:policy_loss", None),
    ("trustlens.rules:RULES", None),
    ("trustlens.rules:Rule", None),
    ("trustlens.rules:evaluate", None),
    ("trustlens.rules:evaluate_all", None),
    ("trustlens.rules:evaluate_columns", "trustlens.rules.columns:evaluate_columns"),
    ("trustlens.rules:rule_columns", "trustlens.rules.columns:rule_columns"),
    ("trustlens.run", None),
    ("trustlens.run.aggregates:per_step_scalars", None),
    ("trustlens.run.follow:RunFollower", None),
    ("trustlens.run.parts:PART_BYTES", None),
    ("trustlens.run.writer", None),
    ("trustlens.run.writer:PART_BYTES", None),
    ("trustlens.run:column_doc", None),
    ("trustlens.run:load_run", None),
    ("trustlens.runs:load_run", "trustlens.run:load_run"),
    ("trustlens.schema", "trustlens.run.schema"),
    ("trustlens.synthetic", None),
    ("trustlens.synthetic:write_synthetic_run", None),
    ("trustlens.train.engine_defects", None),
    ("trustlens.train.model", None),
    ("trustlens.train.model:ModelConfig", None),
    ("trustlens.train.model:build_model", None),
    ("trustlens.train.model:build_tokenizer", None),
    ("trustlens.train.pooled:log_reduced", None),
    ("trustlens.train.step_metrics:mismatch_metrics", None),
    ("trustlens.train.trainer:mismatch_metrics", None),
    ("trustlens:RULES", None),
    ("trustlens:TokenRecorder", None),
    ("trustlens:load_run", None),
    ("trustlens:load_runs", None),
    ("trustlens:plots", None),
    ("trustlens:policy_loss", None),
]


def _get(path: str):
    """The object `path` ("module" or "module:a.b") names, as `from module import a` gives it."""
    module, _, names = path.partition(":")
    obj = importlib.import_module(module)
    for name in filter(None, names.split(".")):
        obj = getattr(obj, name)
    return obj


def _named(dotted: str):
    """The object a warning's dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            return _get(".".join(parts[:i]) + ":" + ".".join(parts[i:]))
        except ModuleNotFoundError:
            continue
    raise AssertionError(f"{dotted} names nothing")


@pytest.mark.parametrize(("old", "new"), DOCUMENTED, ids=[old for old, _ in DOCUMENTED])
def test_every_documented_name_imports_or_warns_naming_its_new_place(old, new):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            got = _get(old)
        except ImportError as err:  # an integration whose framework is an extra not installed here
            if missing_extra(err) is None:
                raise
            pytest.skip(missing_extra(err))
    if new is not None:
        assert got is _get(new)
    moved = [
        str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and " moved to " in str(w.message)
    ]
    module = old.partition(":")[0]
    if new is not None and ":" in old and module not in trustlens.MOVED_MODULES:  # a moved name always warns
        assert moved, f"{old} gave no DeprecationWarning naming {new}"
    for message in moved:  # each warning names a place that gives the same object
        place = re.search(r" moved to ([\w.]+)", message).group(1)
        name = old.partition(":")[2]
        named = _named(place)
        assert named is got or (isinstance(named, types.ModuleType) and getattr(named, name, None) is got), message


def test_a_moved_name_warns_pointing_at_the_callers_line():
    with pytest.warns(
        DeprecationWarning,
        match=r"trustlens\.analysis\.seeds\.format_seed_table moved to "
        r"trustlens\.analysis\.seed_text\.format_seed_table: import it from there",
    ) as caught:
        from trustlens.analysis.seeds import format_seed_table
    assert format_seed_table is _get("trustlens.analysis.seed_text:format_seed_table")
    assert {w.filename for w in caught} == {__file__}
    with pytest.raises(AttributeError, match=re.escape("module 'trustlens.analysis.seeds' has no attribute 'nothing'")):
        _get("trustlens.analysis.seeds:nothing")


def test_alert_kinds_left_the_collapse_config_for_the_detector_registry():
    with pytest.warns(
        DeprecationWarning, match=r"collapse\.config\.ALERT_KINDS moved to trustlens\.analysis\.collapse\.detectors"
    ):
        from trustlens.analysis.collapse.config import ALERT_KINDS
    assert ALERT_KINDS is _get("trustlens.analysis.collapse.detectors:ALERT_KINDS")


def test_names_of_a_module_imported_before_install_and_its_own_getattr_are_kept(monkeypatch):
    module = types.ModuleType("trustlens_moved_example")
    module.__getattr__ = lambda name: f"own {name}"
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(moved_names.MOVED_NAMES, module.__name__, {"mean": "statistics"})
    moved_names.install()
    moved_names.install()  # idempotent: one finder, one wrapper
    with pytest.warns(DeprecationWarning, match=re.escape("trustlens_moved_example.mean moved to statistics.mean")):
        assert module.mean is importlib.import_module("statistics").mean
    assert module.other == "own other"
    assert sum(isinstance(f, moved_names.MovedNamesFinder) for f in sys.meta_path) == 1


def test_the_moved_names_import_in_a_fresh_interpreter():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    from trustlens.analysis.seeds import format_seed_table\n"
        "except DeprecationWarning as w:\n    print(w)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith("trustlens.analysis.seeds.format_seed_table moved to trustlens.analysis.seed_text")

"""trustlens: see what the trust region of an LLM RL fine-tuning run is doing, token by token.

The top-level names are imported lazily so that `import trustlens` stays cheap (no torch) for
tools that only read recorded runs.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING

from trustlens.core import moved_names
from trustlens.core.extras import import_extra, missing_extra
from trustlens.core.version import __version__

# public name -> module that defines it
_EXPORTS = {
    "TokenRecorder": "trustlens.record",
    "NullRecorder": "trustlens.record",
    "load_run": "trustlens.run",
    "load_runs": "trustlens.run",
    "Run": "trustlens.run",
    "NotARunError": "trustlens.run",
    "NoRowsError": "trustlens.run",
    "Keep": "trustlens.run.aggregates",
    "LiveAlert": "trustlens.live",
    "LiveMonitor": "trustlens.live",
    "live_alerts": "trustlens.live",
    "RULES": "trustlens.rules",
    "Rule": "trustlens.rules",
    "evaluate": "trustlens.rules",
    "evaluate_all": "trustlens.rules",
    "policy_loss": "trustlens.rules.loss",
    "PolicyLoss": "trustlens.rules.loss",
    "binary_tv": "trustlens.divergence",
    "binary_kl": "trustlens.divergence",
    "topk_divergence": "trustlens.divergence",
    "exact_divergence": "trustlens.divergence",
    "topk_from_logits": "trustlens.divergence",
    "entropy_from_logits": "trustlens.divergence",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from trustlens.divergence import (
        binary_kl,
        binary_tv,
        entropy_from_logits,
        exact_divergence,
        topk_divergence,
        topk_from_logits,
    )
    from trustlens.live import LiveAlert, LiveMonitor, live_alerts
    from trustlens.record import NullRecorder, TokenRecorder
    from trustlens.rules import RULES, Rule, evaluate, evaluate_all
    from trustlens.rules.loss import PolicyLoss, policy_loss
    from trustlens.run import NoRowsError, NotARunError, Run, load_run, load_runs
    from trustlens.run.aggregates import Keep


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trustlens' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ImportError as err:
        message = missing_extra(err)
        if message is None:
            raise
        raise ImportError(f"trustlens.{name}: {message}", name=err.name) from err
    globals()[name] = value
    return value


# Module paths that earlier releases documented -> where the module lives now. `import trustlens.loss`
# (or `from trustlens.recorder import TokenRecorder`) still works, gives the module itself and warns
# (DeprecationWarning) with the new path.
MOVED_MODULES = {
    "trustlens.analysis.alert_config": "trustlens.analysis.collapse.config",
    "trustlens.analysis.alert_levels": "trustlens.analysis.collapse.levels",
    "trustlens.analysis.alert_steps": "trustlens.analysis.collapse.steps",
    "trustlens.analysis.drivers": "trustlens.analysis.collapse.drivers",
    "trustlens.analysis.onset": "trustlens.analysis.collapse.onset",
    "trustlens.analysis.signals": "trustlens.analysis.collapse.signals",
    "trustlens.analysis.timeline": "trustlens.analysis.collapse.timeline",
    "trustlens.loss": "trustlens.rules.loss",
    "trustlens.recorder": "trustlens.record",
    "trustlens.render": "trustlens.core.render",
    "trustlens.rule_columns": "trustlens.rules.columns",
    "trustlens.runs": "trustlens.run",
    "trustlens.schema": "trustlens.run.schema",
    # integrations/: one package per framework
    "trustlens.integrations._external": "trustlens.integrations._ray_hooks",
    "trustlens.integrations._trl_compat": "trustlens.integrations.trl.compat",
    "trustlens.integrations._trl_hook": "trustlens.integrations.trl.hook",
    "trustlens.integrations._trl_rollout": "trustlens.integrations.trl.rollout",
    "trustlens.integrations._trl_rules": "trustlens.integrations.trl.rules",
    "trustlens.integrations._trl_stop": "trustlens.integrations.trl.stop",
    "trustlens.integrations._verl_compat": "trustlens.integrations.verl.compat",
    "trustlens.integrations._verl_driver": "trustlens.integrations.verl.driver",
    "trustlens.integrations._verl_rules": "trustlens.integrations.verl.rules",
    "trustlens.integrations._verl_state": "trustlens.integrations.verl.state",
    "trustlens.integrations._verl_workers": "trustlens.integrations.verl.workers",
    "trustlens.integrations.engine_fields": "trustlens.integrations.engines.fields",
    "trustlens.integrations.engine_tokens": "trustlens.integrations.engines.tokens",
    # its trl_sampling, verl_sampling and openrlhf_sampling: each trainer's package's `sampling`
    "trustlens.integrations.engines_sampling": "trustlens.integrations.engines.sampling",
    "trustlens.rules.corrections": "trustlens.rules.registry",
    # names that say what the module holds
    "trustlens.analysis.alert_report": "trustlens.analysis.claims_text",
    "trustlens.analysis.findings": "trustlens.analysis.paper_findings",
    "trustlens.analysis.inputs": "trustlens.analysis.sources",
    "trustlens.core.checks": "trustlens.core.tensor_checks",
    "trustlens.core.values": "trustlens.core.argument_checks",
    "trustlens.record.columns": "trustlens.record.recorded_columns",
    "trustlens.run.signals": "trustlens.run.interrupts",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a moved module under its old name: the module object is the new one."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED_MODULES[spec.name]
        warnings.warn(f"{spec.name} moved to {new}: import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())

# Names that moved out of a module that still exists (`from trustlens.analysis.seeds import
# format_seed_table`): trustlens.core.moved_names.MOVED_NAMES, each given with a DeprecationWarning.
moved_names.install()

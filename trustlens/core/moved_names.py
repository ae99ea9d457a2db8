"""Names that earlier releases documented in a module they have since left: `from OLD import NAME`
(and `OLD.NAME`) still gives the object, with a DeprecationWarning naming where it lives now.

The modules named in MOVED_NAMES get a module `__getattr__` (PEP 562) for their moved names when
they are imported: `MovedNamesFinder`, first on `sys.meta_path` (installed by `import
trustlens`), finds each such module with the other finders and wraps its loader to add it. A
module that already has its own `__getattr__` keeps it for every other name. Moved *modules*
(a whole module under a new path) are trustlens.MOVED_MODULES, served by the moved-modules finder
there.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# module an earlier release documented a name in -> {name: module that holds it now}
MOVED_NAMES: dict[str, dict[str, str]] = {
    "trustlens.analysis.seeds": {"format_seed_table": "trustlens.analysis.seed_text"},
    # derived from the detectors' registry now
    "trustlens.analysis.collapse.config": {"ALERT_KINDS": "trustlens.analysis.collapse.detectors"},
    "trustlens.rules": {"evaluate_columns": "trustlens.rules.columns", "rule_columns": "trustlens.rules.columns"},
    # the old trustlens.integrations.engines_sampling is engines.sampling; its trainers' readers
    # went to each trainer's package
    "trustlens.integrations.engines.sampling": {
        "trl_sampling": "trustlens.integrations.trl.sampling",
        "verl_sampling": "trustlens.integrations.verl.sampling",
        "openrlhf_sampling": "trustlens.integrations.openrlhf.sampling",
    },
}


def _moved_getattr(module: str, own: Callable[[str], Any] | None) -> Callable[[str], Any]:
    """The module `__getattr__` of `module`: a moved name with a DeprecationWarning, any other
    name from the module's own `__getattr__` (`own`), else AttributeError."""
    moved = MOVED_NAMES[module]

    def __getattr__(name: str) -> Any:
        new = moved.get(name)
        if new is None:
            if own is not None:
                return own(name)
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} moved to {new}.{name}: import it from there ({module} will stop giving it)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__


def add_moved_names(module: ModuleType) -> None:
    """Give `module` (one of MOVED_NAMES) the `__getattr__` of its moved names; idempotent."""
    own = module.__dict__.get("__getattr__")
    if getattr(own, "__qualname__", "").startswith(_moved_getattr.__name__):
        return
    module.__getattr__ = _moved_getattr(module.__name__, own)  # type: ignore[method-assign]


class _AddingLoader(importlib.abc.Loader):
    """A module's own loader, which then adds the module's moved names."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        add_moved_names(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package, resource readers
        return getattr(self.loader, name)


class MovedNamesFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of MOVED_NAMES with the other finders and wraps their loader (see the
    module docstring); None for every other module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_NAMES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _AddingLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Put MovedNamesFinder first on sys.meta_path (once), and add the moved names of the modules
    of MOVED_NAMES already imported."""
    if not any(isinstance(finder, MovedNamesFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedNamesFinder())
    for name in MOVED_NAMES:
        if name in sys.modules:
            add_moved_names(sys.modules[name])


__all__ = ["MOVED_NAMES", "MovedNamesFinder", "add_moved_names", "install"]

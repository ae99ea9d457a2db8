"""`import_log`: a TensorBoard, W&B or JSON log of a finished run as a trustlens run that holds
only metrics (docs/import.md).

The run is written through the run writer (trustlens.run.writer), as any run: run.json and the
`metrics` table (step, name, value; rank 0), no token or sample rows. run.json says where it came
from — `source` {kind, path, files} and `framework` (the one whose names were mapped; "trustlens"
for a log `trustlens export` wrote, whose run.json settings come back from its `trustlens/run`
text) — so that the analyses read its logged metrics where a recorded run has token rows
(trustlens.analysis.collapse.logged).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trustlens.export.scalars import RUN_SETTINGS, RUN_TAG
from trustlens.ingest.sources import KIND_FRAMEWORK, Log, Progress, read_log
from trustlens.ingest.table import Table, metrics_table
from trustlens.metrics import FRAMEWORKS, detect_framework


@dataclass
class Imported:
    """What `import_log` wrote."""

    path: Any  # the run directory: a Path, or a trustlens.run.storage.Remote for an object-store URL
    log: Log  # what was read
    table: Table  # the metrics and what became of their names
    framework: str | None  # whose names were mapped (None: none could be told; names kept)

    @property
    def steps(self) -> int:
        return self.table.metrics["step"].n_unique()


def framework_of(log: Log, framework: str | None) -> str | None:
    """`framework` if given (checked), else the one the names tell, else the one the log's format
    implies (verl's file logger, HF Trainer's trainer_state.json); None when nothing tells."""
    if framework is not None:
        if framework not in (*FRAMEWORKS, "trustlens"):
            raise ValueError(f"--framework must be one of {', '.join((*FRAMEWORKS, 'trustlens'))}, got {framework!r}")
        return framework
    if _exported_settings(log):
        return "trustlens"
    return detect_framework(dict.fromkeys(log.names)) or KIND_FRAMEWORK.get(log.kind)


def _exported_settings(log: Log) -> dict[str, Any]:
    for tag, texts in log.texts.items():
        if tag.split("/text_summary")[0] == RUN_TAG and texts:
            try:
                settings = json.loads(texts[-1][1])
            except ValueError:
                continue
            if isinstance(settings, dict):
                return {k: settings[k] for k in RUN_SETTINGS if k in settings}
    return {}


def check_model_kind(model_kind: str | None) -> None:
    from trustlens.run.manifest import MODEL_KINDS

    if model_kind is not None and model_kind not in MODEL_KINDS:
        raise ValueError(f"--model-kind must be one of {', '.join(MODEL_KINDS)}, got {model_kind!r}")


def imported_manifest(log: Log, framework: str | None, model_kind: str | None) -> dict[str, Any]:
    """run.json of the run imported from `log` with `framework`'s names: a new run's, with
    `source` and `framework`, and the settings of an exported run (RUN_SETTINGS) restored."""
    from trustlens.run.manifest import new_manifest

    settings = _exported_settings(log) if framework == "trustlens" else {}
    manifest = new_manifest(
        rules=settings.get("rules") or {},
        active_rule=settings.get("active_rule"),
        config=settings.get("config"),
        world_size=1,
        model_kind=model_kind or settings.get("model_kind") or "dense",
        planned_steps=settings.get("planned_steps"),
        sampling=settings.get("sampling"),
    )
    if settings.get("warmup_steps"):
        manifest["warmup_steps"] = settings["warmup_steps"]
    manifest["source"] = {"kind": log.kind, "path": str(log.path.resolve()), "files": [str(f) for f in log.files]}
    manifest["framework"] = framework
    return manifest


def import_log(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    framework: str | None = None,
    model_kind: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Imported:
    """Read the log at `src` and write it as the run `out` (module docstring). `framework`: whose
    names the log holds (default: told from the names); `model_kind`: dense or moe (the
    mismatch's normal range; default: the exported run's, else dense)."""
    from trustlens.run.schema import table_schema
    from trustlens.run.writer import RankWriter

    check_model_kind(model_kind)
    log = read_log(Path(src), progress)
    chosen = framework_of(log, framework)
    table = metrics_table(log, chosen)
    if table.metrics.is_empty():
        raise ValueError(f"{log.path}: no numeric metrics in it to import")
    manifest = imported_manifest(log, chosen, model_kind)
    if progress is not None:
        progress(f"writing {table.metrics.height:,} values of {table.metrics['name'].n_unique()} metrics to {out}")
    writer = RankWriter(
        out, rank=0, world_size=1, rules=[], manifest=manifest, rows_per_file=1 << 22, overwrite=overwrite
    )
    try:
        rows = table.metrics.to_arrow()
        writer.append("metrics", rows.cast(table_schema("metrics", [])))
    except BaseException as err:
        writer.end("failed", f"{type(err).__name__}: {err}")
        raise
    writer.close("finished")
    return Imported(writer.path, log, table, chosen)


__all__ = ["Imported", "check_model_kind", "framework_of", "import_log", "imported_manifest"]

"""The run format of trustlens: the schema of a recorded run, its writer and its reader.

A run is a directory (docs/run-format.md): `run.json` (the manifest) and one folder per table
(`tokens`, `samples`, `metrics`) holding Parquet part files per rank. Everything that writes a
run (`TokenRecorder`, the synthetic generator, the sample-run builder) goes through
`trustlens.run.writer`; everything that reads one goes through `load_run` / `load_runs`.
"""

from trustlens.run.reader import CorruptPartWarning, NoRowsError, NotARunError, Run, load_run, load_runs
from trustlens.run.schema import (
    BLOCKED_PREFIX,
    MANIFEST,
    MANIFEST_FIELDS,
    META_SCHEMA_VERSION,
    META_TRUSTLENS_VERSION,
    PART_GLOB,
    SCHEMA_VERSION,
    TABLES,
    Column,
    blocked_column,
    column_doc,
    part_path,
    rule_of_column,
    table_schema,
    token_columns,
)

__all__ = [
    "BLOCKED_PREFIX",
    "MANIFEST",
    "MANIFEST_FIELDS",
    "META_SCHEMA_VERSION",
    "META_TRUSTLENS_VERSION",
    "PART_GLOB",
    "SCHEMA_VERSION",
    "TABLES",
    "Column",
    "CorruptPartWarning",
    "NoRowsError",
    "NotARunError",
    "Run",
    "blocked_column",
    "column_doc",
    "load_run",
    "load_runs",
    "part_path",
    "rule_of_column",
    "table_schema",
    "token_columns",
]

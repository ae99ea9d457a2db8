"""The run format of trustlens: the schema of a recorded run, its manifest, writer and reader.

A run is a directory (docs/run-format.md): `run.json` (the manifest) and one folder per table
(`tokens`, `samples`, `metrics`) holding Parquet part files per rank (`rank=R` folders).
Everything that writes a run (`TokenRecorder`, the synthetic generator, the sample-run builder)
goes through `trustlens.run.writer`; everything that reads one goes through `load_run` /
`load_runs`, or, for a run still being written, `RunFollower` (trustlens.run.follow). Importing
this package does not import torch.
"""

from trustlens.run.errors import (
    CorruptPartWarning,
    NoRowsError,
    NotARunError,
    RejectedInputError,
    RunLockedError,
    RunWarning,
    WriterError,
)
from trustlens.run.follow import CompletedStep, FollowState, FollowUpdate, RunFollower, writer_died
from trustlens.run.manifest import MANIFEST, MANIFEST_FIELDS, STATUSES
from trustlens.run.reader import Part, Run, load_run, load_runs
from trustlens.run.schema import (
    BLOCKED_PREFIX,
    META_SCHEMA_VERSION,
    META_TRUSTLENS_VERSION,
    META_WORLD_SIZE,
    PART_GLOB,
    RANK,
    SCHEMA_VERSION,
    TABLES,
    Column,
    blocked_column,
    column_doc,
    frame_schema,
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
    "META_WORLD_SIZE",
    "PART_GLOB",
    "RANK",
    "SCHEMA_VERSION",
    "STATUSES",
    "TABLES",
    "Column",
    "CompletedStep",
    "CorruptPartWarning",
    "FollowState",
    "FollowUpdate",
    "NoRowsError",
    "NotARunError",
    "Part",
    "RejectedInputError",
    "Run",
    "RunFollower",
    "RunLockedError",
    "RunWarning",
    "WriterError",
    "blocked_column",
    "column_doc",
    "frame_schema",
    "load_run",
    "load_runs",
    "part_path",
    "rule_of_column",
    "table_schema",
    "token_columns",
    "writer_died",
]

"""`trustlens import`: runs other tools logged — a TensorBoard log dir, a W&B offline run or
exported history, verl's file logger, HF Trainer's trainer_state.json — as trustlens runs that
hold their metrics under trustlens' names (docs/import.md).

Modules:
    events     TensorBoard event files (TFRecord frames, `tensorboard`'s Event protos)
    wandb_log  W&B's .wandb run files and exported histories
    sources    which log a path holds, read into a Log (one run; corrupt files skipped)
    table      a Log's values as the metrics table under trustlens' names (trustlens.metrics)
    importer   import_log: the table and run.json written through the run writer
    follow     a TensorBoard log dir followed while written (`trustlens watch LOGDIR`)
    command    the `trustlens import` command
"""

from trustlens.ingest.events import CorruptEventFile, EventFile, event_files
from trustlens.ingest.importer import Imported, import_log
from trustlens.ingest.sources import ImportWarning, Log, read_log
from trustlens.ingest.table import Table, metrics_table

__all__ = [
    "CorruptEventFile",
    "EventFile",
    "ImportWarning",
    "Imported",
    "Log",
    "Table",
    "event_files",
    "import_log",
    "metrics_table",
    "read_log",
]

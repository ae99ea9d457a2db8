"""The `trustlens` command.

Each subcommand lives in the module that owns its work; that module provides
`configure(name, parser)`, which adds the flags and sets `parser.set_defaults(func=...)` to a
function taking the parsed arguments and returning an exit code. Command modules import torch
and other heavy packages inside their functions, so that `trustlens --help` stays fast.

Errors a user can fix (bad arguments, missing or corrupt files) are printed as one line and exit
with status 2; set TRUSTLENS_DEBUG=1 to see the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from trustlens import __version__, missing_extra

# command -> (module that implements it, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "dashboard": ("trustlens.dashboard", "open the Streamlit dashboard on recorded runs"),
    "train": (
        "trustlens.train.commands",
        "RL fine-tune the built-in model under one trust-region rule, recording every token",
    ),
    "compare": (
        "trustlens.train.commands",
        "train the same settings under several rules and seeds; table of mean ± SE per rule",
    ),
    "claims": ("trustlens.train.commands", "measure the DPPO paper's six claims over rules × seeds; writes a report"),
    "demo": ("trustlens.train.commands", "the main job: the default training run, then the dashboard on it"),
    "make-sample": ("trustlens.train.commands", "regenerate the shipped sample runs (data/sample_run)"),
    "export": ("trustlens.export.exporters", "recorded runs to TensorBoard or W&B: per-step scalars and alerts"),
    "report": ("trustlens.report.page", "one self-contained HTML report of recorded runs (opens without a network)"),
    "doctor": ("trustlens.analysis.diagnosis.command", "log-probability bugs that fake a training–inference mismatch"),
    "watch": ("trustlens.live.watch", "follow a run being written: print each alert and doctor finding as it appears"),
    "warmup": ("trustlens.train.warmup", "rebuild the warm-start checkpoint (supervised warm-up to mediocre accuracy)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported to add its flags (None: every command's)."""
    parser = argparse.ArgumentParser(
        prog="trustlens",
        description="Token-level diagnostics of the trust region in LLM RL fine-tuning.",
    )
    parser.add_argument("--version", action="version", version=f"trustlens {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if command is None or name == command:
            importlib.import_module(module).configure(name, p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The first word naming a command picks the one module to import: `trustlens --help` and
    # `trustlens train ...` never pay for the other commands' imports.
    command = next((a for a in argv if a in COMMANDS), "")
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("trustlens: interrupted", file=sys.stderr)
        return 130
    except (ValueError, KeyError, OSError, ImportError) as err:
        if os.environ.get("TRUSTLENS_DEBUG"):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        if isinstance(err, ImportError):
            message = missing_extra(err)
            if message is None:
                raise
        print(f"trustlens {args.command}: error: {message}", file=sys.stderr)
        return 2
    except Exception as err:
        from trustlens.run.storage import storage_error

        message = storage_error(err)
        if message is None or os.environ.get("TRUSTLENS_DEBUG"):
            raise
        print(f"trustlens {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

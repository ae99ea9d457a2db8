"""The `trustlens` command.

Each subcommand lives in the module that owns its work; that module provides
`configure(name, parser)`, which adds the flags and sets `parser.set_defaults(func=...)` to a
function taking the parsed arguments and returning an exit code. Command modules import torch
and other heavy packages inside their functions, so that `trustlens --help` stays fast.

While the flags are parsed, a value outside a flag's choices is answered with the closest one
("did you mean"), and a subcommand's unknown flag with that subcommand's usage.

Errors a user can fix (bad arguments, missing or corrupt files) are printed as one line and exit
with status 2; set TRUSTLENS_DEBUG=1 to see the traceback instead. Warnings are printed as one
line each too ("trustlens COMMAND: warning: …"), without Python's source line.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib
import os
import sys
import warnings
from typing import Any

from trustlens.core.argument_checks import closest
from trustlens.core.extras import missing_extra
from trustlens.core.version import __version__

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
    "import": (
        "trustlens.ingest.command",
        "a TensorBoard, W&B or JSON log of a finished run as a run of its metrics; its alerts",
    ),
    "report": ("trustlens.report.page", "one self-contained HTML report of recorded runs (opens without a network)"),
    "doctor": ("trustlens.analysis.diagnosis.command", "log-probability bugs that fake a training–inference mismatch"),
    "certify": ("trustlens.analysis.certify.command", "certify a zero-mismatch engine: log μ = log π_old bit for bit"),
    "watch": (
        "trustlens.ingest.watch",
        "follow a run being written: print each alert and doctor finding as it appears",
    ),
    "warmup": ("trustlens.train.warmup", "rebuild the warm-start checkpoint (supervised warm-up to mediocre accuracy)"),
}


class Parser(argparse.ArgumentParser):
    """argparse's parser whose refusal of a value outside a flag's `choices` names the closest
    choice; `commands` holds the subcommands' parsers (the top-level parser's only)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: dict[str, argparse.ArgumentParser] = {}

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            options = [str(c) for c in action.choices]
            raise argparse.ArgumentError(
                action, f"must be one of {', '.join(options)}; got {value!r}{closest(str(value), options)}"
            )


def build_parser(command: str | None = None) -> Parser:
    """The parser; only `command`'s module is imported to add its flags (None: every command's)."""
    parser = Parser(
        prog="trustlens",
        description="Token-level diagnostics of the trust region in LLM RL fine-tuning.",
    )
    parser.add_argument("--version", action="version", version=f"trustlens {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        parser.commands[name] = p
        if command is None or name == command:
            importlib.import_module(module).configure(name, p)
    return parser


def parse(parser: Parser, argv: list[str]) -> argparse.Namespace:
    """The parsed flags; an unknown flag is refused with the usage of the subcommand it was given
    to (argparse's own refusal shows the top-level usage), naming the closest flag it has."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        owner = parser.commands.get(getattr(args, "command", None) or "", parser)
        # compared without their dashes, which every flag shares
        flags = {flag.lstrip("-"): flag for action in owner._actions for flag in action.option_strings}
        near = difflib.get_close_matches(unknown[0].lstrip("-"), list(flags), n=1, cutoff=0.6)
        hint = f" (did you mean {flags[near[0]]!r}?)" if unknown[0].startswith("-") and near else ""
        owner.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return args


def _show_warning(command: str, message: Warning | str, *_: Any, **__: Any) -> None:
    """`warnings.showwarning` while a command runs: "trustlens COMMAND: warning: MESSAGE"."""
    print(f"trustlens {command}: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The first word naming a command picks the one module to import: `trustlens --help` and
    # `trustlens train ...` never pay for the other commands' imports.
    command = next((a for a in argv if a in COMMANDS), "")
    parser = build_parser(command)
    args = parse(parser, argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        with warnings.catch_warnings():  # a warning is one line too, without a source line
            warnings.showwarning = functools.partial(_show_warning, args.command)
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

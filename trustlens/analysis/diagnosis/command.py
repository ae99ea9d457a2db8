"""`trustlens doctor RUN [--json]`: the doctor's findings on a recorded run, most severe first,
after a line naming a run that is incomplete (killed, interrupted, failed, still being written;
on stderr with --json)."""

from __future__ import annotations

import argparse
import json
import sys

from trustlens.analysis.diagnosis.finding import Finding
from trustlens.core.render import strict_json

MARKS = {"problem": "PROBLEM", "warning": "warning", "ok": "ok"}


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Flags of `trustlens doctor`."""
    parser.add_argument("run", metavar="RUN", help="a recorded run (folder or object-store URL)")
    parser.add_argument(
        "--json", action="store_true", help="print a JSON list of {check, verdict, summary, evidence, fix}"
    )
    parser.epilog = "The checks, their statistics and thresholds: docs/doctor.md"
    parser.set_defaults(func=_doctor)


def as_text(findings: list[Finding]) -> str:
    """The findings as terminal lines: verdict, check, summary, then the fix and up to three
    example tokens (step/sample/pos) of each finding that is not ok. Token text is shown with
    repr(), so control characters in it cannot act on the terminal."""
    lines = []
    for f in findings:
        lines.append(f"{MARKS[f.verdict]:<8} {f.check:<13} {f.summary}")
        if f.verdict == "ok":
            continue
        if f.fix:
            lines.append(f"{'':<22} fix: {f.fix}")
        for ex in f.evidence.get("examples", [])[:3]:
            lines.append(
                f"{'':<22} e.g. step {ex['step']} sample {ex['sample']} pos {ex['pos']} token {ex['token']!r}: "
                f"μ {ex['mu']:.3g}, π_old {ex['old']:.3g}"
            )
    return "\n".join(lines)


def _doctor(args: argparse.Namespace) -> int:
    from trustlens.analysis.collapse.logged import NO_TOKENS, metrics_only
    from trustlens.analysis.diagnosis import doctor
    from trustlens.analysis.diagnosis.run_state import incomplete_note
    from trustlens.analysis.scalar_doctor import scalar_findings
    from trustlens.core.render import visible_text
    from trustlens.run import load_run

    run = load_run(args.run)
    findings = scalar_findings(run) if metrics_only(run) else doctor(run)  # imported: only its scalars
    note = incomplete_note(run) if not metrics_only(run) else NO_TOKENS
    if args.json:
        if note is not None:  # stdout stays the JSON list of findings
            print(f"trustlens doctor: warning: {visible_text(note)}", file=sys.stderr)
        print(json.dumps([strict_json(f.to_json()) for f in findings], indent=1, allow_nan=False, ensure_ascii=False))
    else:
        if note is not None:
            print(visible_text(f"{MARKS['warning']:<8} {'run':<13} {note}"))
        print(as_text(findings))
    return 0


__all__ = ["as_text", "configure"]

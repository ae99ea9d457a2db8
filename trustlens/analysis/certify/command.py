"""`trustlens certify RUN [--require bit-exact|precision|distribution] [--json]`: the certificate
of a recorded run; exit status 0 when it meets the requirement, 1 when not, 2 on bad input (a
missing or unreadable run, no μ, a lagging engine: one line saying what to record)."""

from __future__ import annotations

import argparse
import json
import sys

from trustlens.analysis.certify.certificate import REQUIREMENTS, Certificate
from trustlens.core.render import strict_json

CERTIFIED, NOT_CERTIFIED = 0, 1  # exit statuses (bad input: 2, as every command's errors)


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Flags of `trustlens certify`."""
    parser.add_argument("run", metavar="RUN", help="a recorded run (folder or object-store URL)")
    parser.add_argument(
        "--require",
        choices=REQUIREMENTS,
        default="bit-exact",
        help="bit-exact: every sampled token's log μ and log π_old the same float32 value (default); "
        "precision: equal at the recorded precision (bf16 columns); distribution: bit-exact and μ's recorded "
        "top-K equal to π_old's",
    )
    parser.add_argument("--json", action="store_true", help="print the certificate as one JSON object")
    parser.epilog = "Exit status: 0 certified, 1 not certified, 2 bad input. The checks: docs/certify.md"
    parser.set_defaults(func=_certify)


def as_text(cert: Certificate, require: str) -> str:
    """The certificate as terminal lines. Token text is shown with repr(), so control and
    bidirectional characters in it cannot act on the terminal."""
    t = cert.tokens
    ok = cert.certified(require)
    label = f"{t['precision']} bits" if t["precision"] == "float32" else f"{t['precision']} precision"
    lines = [
        f"{'CERTIFIED' if ok else 'NOT CERTIFIED'} ({cert.run}, --require {require})",
        f"verdict       {cert.verdict}: log μ = log π_old ({label}) on {t['equal']:,} of {t['compared']:,} tokens "
        f"({t['share']:.2%}); largest |Δ| {t['max_abs_diff']:.3g} nats",
        f"compared      log μ (mu_logp, {cert.precision['mu']}) with log π_old ({cert.reference}, "
        f"{cert.precision['old']})",
    ]
    if t["precision"] != "float32":
        lines.append(
            f"{'':<14}recorded in {t['precision']}: equality holds only to its 8 significant bits (a step of 2^-8 "
            "relative); bit-exactness at float32 cannot be shown: record float32 log-probs"
        )
    lines += [f"{'where' if i == 0 else '':<14}{line}" for i, line in enumerate(cert.where())]
    for ex in t["first_differing"][:3]:
        lines.append(
            f"{'':<14}e.g. step {ex['step']} sample {ex['sample']} pos {ex['pos']} token {ex['token']!r}: "
            f"log μ {ex['mu_logp']:.9g}, log π_old {ex['old_logp']:.9g} (|Δ| {ex['abs_diff']:.3g}"
            + (f", {ex['ulps']} ulp)" if ex["ulps"] is not None else ")")
        )
    d = cert.distribution
    if d is None:
        lines.append("distribution  not recorded (no top-K columns): the verdict is about the sampled tokens only")
    else:
        k = f"K = {d['k']}" if d["k"] is not None else "K"
        lines.append(
            f"distribution  at {k}, update 0: μ's top-K and rest within TV ≤ {d['tolerance']:.0e} of π's on "
            f"{d['within']:,} of {d['tokens']:,} tokens (max TV {d['max_topk_tv']:.3g}, max mass gap "
            f"{d['max_mass_gap'] if d['max_mass_gap'] is None else format(d['max_mass_gap'], '.3g')}); "
            f"π at update 0 = π_old bit for bit on {d['pi_equals_old']:.1%}"
        )
        lines.append(
            f"{'':<14}the run stores record's top-K TV, KL and masses, not μ's ids and log-probs: equal at K means "
            "within float32 rounding of them, and π's own top-K ids are not checked"
        )
    lines += [f"{'note' if i == 0 else '':<14}{n}" for i, n in enumerate(cert.notes)]
    return "\n".join(lines)


def _certify(args: argparse.Namespace) -> int:
    from trustlens.analysis.certify.certificate import certify
    from trustlens.analysis.diagnosis.run_state import incomplete_note
    from trustlens.core.render import visible_text
    from trustlens.run import load_run

    run = load_run(args.run)
    cert = certify(run)
    ok = cert.certified(args.require)  # a requirement the run cannot meet raises first (exit 2)
    note = incomplete_note(run)
    if note is not None:
        print(f"trustlens certify: warning: {visible_text(note)}", file=sys.stderr)
    if args.json:
        out = {**cert.to_json(), "require": args.require, "certified": ok}
        print(json.dumps(strict_json(out), indent=1, allow_nan=False, ensure_ascii=True))
    else:
        print(as_text(cert, args.require))
    return CERTIFIED if ok else NOT_CERTIFIED


__all__ = ["CERTIFIED", "NOT_CERTIFIED", "as_text", "configure"]
